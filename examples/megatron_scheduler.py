"""seqpack as Megatron-LM's packing scheduler: one call, then Megatron's own ``wrap_data_iterator``.

With Megatron-LM main on the path, one GPU per rank:

    torchrun --standalone --nproc-per-node 8 examples/megatron_scheduler.py --tp 2 --cp 2 --steps 3 [--prefetch]

Every rank lays out Megatron's ``parallel_state``, calls ``seqpack.interop.megatron``'s
``install()``, and then runs Megatron's loop as it is: TP rank 0 of the first and last
pipeline stage read mock SFT samples from one data iterator, ``wrap_data_iterator`` plans
with seqpack, reroutes, packs and broadcasts, and the rank prints the packs it got. With
``--prefetch`` (``install(prefetch=1)``) each call also plans the next step in seqpack's
planning process while the step trains.

Without Megatron or GPUs, ``--plan`` prints what ``install`` changes for one step: the groups
seqpack plans against Megatron's next-fit (seqpack's ``dp_balanced``, its twin) on the same
lengths, microbatches and predicted step time (Llama-3-8B FLOPs).
"""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import numpy as np
import torch

from seqpack.cost import model_preset
from seqpack.interop.megatron_plan import plan_groups
from seqpack.mock_data import generate_lengths
from seqpack.schedulers import Schedule, get_scheduler, predicted_step_time

SFT = dict(min_seq_len=128, max_seq_len=8192, mean_seq_len=2048, sigma=1.1)  # Megatron's mock SFT, shorter


def step_lengths(dp_rank: int, step: int, count: int, pad: int) -> list[int]:
    """The padded lengths DP rank ``dp_rank`` reads at ``step``."""
    raw = generate_lengths("lognormal", count, seed=1000 * step + dp_rank, **SFT)
    return [int(-(-n // pad) * pad) for n in raw]


def samples(lengths: list[int], seed: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """One sequence per sample, in the form Megatron's SFT dataset gives (``cu_seqlens``); the
    CP ranks of a replica read the same samples (same ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        tokens = torch.randint(0, 32000, (n,), generator=generator).to(device)
        out.append(
            {"tokens": tokens, "labels": tokens.roll(-1), "loss_mask": torch.ones(n, device=device)}
            | {"position_ids": torch.arange(n, device=device), "cu_seqlens": torch.tensor([0, n], dtype=torch.int32)}
        )
    return out


def run_steps(args: argparse.Namespace, device: torch.device) -> list[list[int]]:
    """Megatron's loop with seqpack installed, on process groups ``parallel_state`` has laid out.
    Returns the packed tokens of each microbatch this rank got, per step (empty where it reads none)."""
    from megatron.core import parallel_state as ps
    from megatron.core.datasets.data_schedule import wrap_data_iterator

    from seqpack.interop import megatron

    megatron.install(prefetch=int(args.prefetch))  # the one call
    config = SimpleNamespace(  # the fields wrap_data_iterator reads (your TransformerConfig, in training)
        sequence_packing_scheduler="dp_balanced",
        max_seqlen_per_dp_cp_rank=args.max_seqlen_per_dp_cp_rank,
        microbatch_group_size_per_vp_stage=None,
        virtual_pipeline_model_parallel_size=None,
    )
    reads = ps.get_tensor_model_parallel_rank() == 0 and (
        ps.is_pipeline_first_stage(ignore_virtual=True) or ps.is_pipeline_last_stage(ignore_virtual=True)
    )
    dp_rank = ps.get_data_parallel_rank()
    pad = 2 * args.cp
    data = (  # one iterator for the whole run, as a training loop's (prefetch reads it a step ahead)
        sample
        for step in range(args.steps)
        for sample in samples(step_lengths(dp_rank, step, args.samples_per_rank, pad), 1000 * step + dp_rank, device)
    )
    iterator = data if reads else None
    packed = []
    for step in range(args.steps):
        new_iterator, num_microbatches, _, _ = wrap_data_iterator(iterator, config, args.samples_per_rank)
        packs = [next(new_iterator) for _ in range(num_microbatches)] if reads else []
        packed.append([int(p["cu_seqlens_padded"][-1]) for p in packs])
        print(f"rank {torch.distributed.get_rank()} step {step}: {num_microbatches} microbatches, {packed[-1]} tokens")
    return packed


def plan(args: argparse.Namespace) -> None:
    """The groups of one step, seqpack's and Megatron's next-fit, without Megatron."""
    dp, cp, capacity = args.dp, args.cp, args.max_seqlen_per_dp_cp_rank
    lengths = np.array([n for d in range(dp) for n in step_lengths(d, 0, args.samples_per_rank, 2 * cp)])
    cost = model_preset("llama3-8b").cost_model()
    sizes = dict(dp_size=dp, cp_size=cp)
    pairs = list(enumerate(lengths.tolist()))
    groups = plan_groups(pairs, get_scheduler("balanced"), max_seqlen_per_dp_cp_rank=capacity, cost=cost, **sizes)
    rounds = [[np.array(m[d * cp], dtype=np.int64) for d in range(dp)] for m in groups]
    sizes |= dict(max_tokens_per_rank=capacity)
    ours = Schedule.from_assignment(rounds, lengths=lengths, original_lengths=lengths, pad_multiple=1, **sizes)
    theirs = get_scheduler("dp_balanced").schedule(lengths, **sizes)
    times = {}
    for name, schedule in (("Megatron next-fit", theirs), ("seqpack", ours)):
        tokens = [[int(lengths[g].sum()) for g in m] for m in schedule.assignment]
        times[name] = predicted_step_time(schedule, cost, sync="replica")
        print(f"{name}: {schedule.num_microbatches} microbatches; tokens per microbatch and replica {tokens}")
    print(f"seqpack's predicted step time: {times['seqpack'] / times['Megatron next-fit']:.3f} x Megatron's next-fit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--dp", type=int, default=4, help="with --plan (under torchrun: world / (tp*pp*cp))")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples-per-rank", type=int, default=16)
    parser.add_argument("--max-seqlen-per-dp-cp-rank", type=int, default=16384)
    parser.add_argument("--prefetch", action="store_true", help="plan each step during the step before")
    parser.add_argument("--plan", action="store_true", help="print one step's groups on CPU, without Megatron")
    args = parser.parse_args()
    if args.plan:
        plan(args)
        return
    from megatron.core import parallel_state as ps

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
    ps.initialize_model_parallel(args.tp, args.pp, context_parallel_size=args.cp)
    run_steps(args, torch.device("cuda"))
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
