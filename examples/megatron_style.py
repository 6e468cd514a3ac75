"""The Megatron regime: only TP rank 0 of the first and last pipeline stage reads data.

    torchrun --standalone --nproc-per-node 8 examples/megatron_style.py --tp 2 --pp 2 --dp 2

The framework owns its process groups (here built the way Megatron's ``parallel_state``
orders ranks: TP fastest, then DP, then PP) and hands them to ``Topology.from_groups``.
``data_owner="tp0"``: TP rank 0 of the first and last stage reads and schedules; seqpack
broadcasts each step to the other TP ranks, and the layout (no tokens) to middle stages,
with int64 length headers. ``to_megatron_batch`` shows how a ``Step``'s microbatch maps onto
what Megatron's ``get_batch`` returns for THD (``tokens``, ``labels``, ``loss_mask``,
``position_ids`` and ``PackedSeqParams`` fields).
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from seqpack import PackedBatch, Topology, wrap_data_iterator
from seqpack.mock_data import MockSFTDataset, lognormal_lengths


def megatron_groups(tp: int, pp: int, dp: int):
    """Megatron's rank order (TP fastest, then DP, then PP). Every rank creates every group,
    in the same order, as torch.distributed requires; each keeps the ones it belongs to."""
    world, me = dist.get_world_size(), dist.get_rank()
    if tp * pp * dp != world:
        raise SystemExit(f"tp({tp}) * pp({pp}) * dp({dp}) = {tp * pp * dp} != world size {world}")
    rank = lambda p, d, t: (p * dp + d) * tp + t  # noqa: E731 (grid layout, only used to build groups)
    mine = {}
    for p in range(pp):
        for d in range(dp):
            g = dist.new_group([rank(p, d, t) for t in range(tp)])
            if me in [rank(p, d, t) for t in range(tp)]:
                mine["tp"] = g
    for p in range(pp):
        for t in range(tp):
            g = dist.new_group([rank(p, d, t) for d in range(dp)])
            if me in [rank(p, d, t) for d in range(dp)]:
                mine["dp"] = g
    for d in range(dp):
        for t in range(tp):
            g = dist.new_group([rank(p, d, t) for p in range(pp)])
            if me in [rank(p, d, t) for p in range(pp)]:
                mine["pp"] = g
    return {
        axis: (group if size > 1 else None)
        for axis, group, size in (("tp", mine["tp"], tp), ("dp", mine["dp"], dp), ("pp", mine["pp"], pp))
    }


def to_megatron_batch(batch: PackedBatch) -> dict:
    """One microbatch as Megatron's THD ``get_batch`` returns it ([1, T] tensors + packed
    sequence params). Middle stages get ``tokens``/``labels``/``loss_mask`` as ``None``."""
    kw = batch.te_kwargs(include_format=False)

    def row(t):
        return None if t is None else t.unsqueeze(0)

    return {
        "tokens": row(batch.input_ids),
        "labels": row(batch.labels),
        "loss_mask": row(batch.loss_mask),
        "attention_mask": None,  # THD: boundaries come from cu_seqlens
        "position_ids": row(batch.position_ids),
        "packed_seq_params": {"qkv_format": "thd", **kw},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    topology = Topology.from_groups(**megatron_groups(args.tp, args.pp, args.dp))

    reads = topology.tp_rank == 0 and (topology.is_first_stage or topology.is_last_stage)
    data_iterator = None
    if reads:
        lengths = lognormal_lengths(
            args.steps * args.dp * 8, min_seq_len=16, max_seq_len=1024, mean_seq_len=200, seed=1
        )
        dataset = MockSFTDataset(lengths, vocab_size=32000, seed=1)
        # DP rank d reads its block of 8 samples per step (the same on the first and last stage).
        data_iterator = (dataset[(s * args.dp + topology.dp_rank) * 8 + i] for s in range(args.steps) for i in range(8))

    steps = wrap_data_iterator(
        data_iterator, topology, samples_per_rank=8, max_tokens_per_rank=1024, data_owner="tp0", check_schedule=True
    )
    for step in steps:
        batch = to_megatron_batch(step.microbatches[0])
        tokens = "None (metadata only)" if batch["tokens"] is None else tuple(batch["tokens"].shape)
        psp = batch["packed_seq_params"]
        line = (
            f"rank {dist.get_rank()} ({topology.describe()}) step {step.step}: {step.num_microbatches} microbatches; "
            f"mb0 tokens {tokens}, cu_seqlens_q {psp['cu_seqlens_q'].tolist()[:4]}..., max_seqlen_q "
            f"{psp['max_seqlen_q']}, pad_between_seqs {psp['pad_between_seqs']}; "
            f"seqlen_sq_sum {step.stats.seqlen_sq_sum} (exact int)\n"
        )
        sys.stdout.write(line)  # one write per line: ranks share the terminal
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
