"""Log-probs of a GRPO rollout batch on packed, rebalanced microbatches, back where they came from.

    python examples/rl_rollouts.py                        # 2 gloo ranks on CPU, spawned here
    python examples/rl_rollouts.py --prompts 64 --responses 8 --group

A GRPO step scores ``prompts x responses`` sequences (a prompt followed by one sampled
response) whose lengths are long-tailed (lognormal here). Each DP rank holds some of the
responses of each prompt. ``wrap_data_iterator`` packs the whole rollout batch into balanced
microbatches (sequences move between ranks to balance them), the model computes per-token
log-probs on those, and ``step.to_origin`` sends every sequence's values back to the rank
that read it, in the order it read them, pads removed: exactly what the RL loss needs next
to its advantages. With ``--group`` the responses of one prompt carry its ``group_id`` and
stay on one replica (prefix sharing, group-normalised advantages computed where they run).

The script checks what it claims: every sample comes back exactly once, in read order (its
own tokens returned through the same path), and the packed log-probs equal the log-probs of
each sequence run alone (printed as the largest absolute difference, float64).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from seqpack import Topology, wrap_data_iterator
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.mock_data import lognormal_lengths
from seqpack.thd import PackedBatch, pack_sequences

VOCAB = 97


def rollouts(args: argparse.Namespace, dp_rank: int, dp_size: int) -> list[dict[str, torch.Tensor]]:
    """This rank's rollouts: ``prompts x responses`` sequences (a prompt and one sampled
    continuation, both of lognormal length) in prompt-major order, dealt round-robin to the
    DP ranks, so the responses of one prompt are spread over ranks as rollout workers
    return them."""
    total = args.prompts * args.responses
    prompt_len = lognormal_lengths(args.prompts, min_seq_len=4, max_seq_len=96, mean_seq_len=32, seed=args.seed)
    response_len = lognormal_lengths(total, min_seq_len=2, max_seq_len=480, mean_seq_len=80, seed=args.seed + 1)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in prompt_len]
    samples = []
    for p in range(args.prompts):
        for r in range(args.responses):
            response = torch.randint(1, VOCAB, (int(response_len[p * args.responses + r]),), generator=g)
            sample = {"input_ids": torch.cat([prompts[p], response])}
            if args.group:
                sample["group_id"] = p  # the responses of one prompt stay on one replica
            samples.append(sample)
    return samples[dp_rank::dp_size]


def token_logprobs(model: TinyHybridLM, batch: PackedBatch) -> torch.Tensor:
    """``[T]``: log-prob of each token's next token (its label); 0 where there is none."""
    logits = model(batch)  # (T, V)
    labels = batch.labels
    assert labels is not None
    logp = F.log_softmax(logits, dim=-1).gather(1, labels.clamp(min=0)[:, None])[:, 0]
    return torch.where(labels >= 0, logp, torch.zeros_like(logp))


def worker(rank: int, world: int, store_path: str, args: argparse.Namespace, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    topology = Topology.from_device_mesh(mesh)
    samples = rollouts(args, topology.dp_rank, topology.dp_size)

    torch.manual_seed(0)  # the same weights on every rank
    model = TinyHybridLM(TinyConfig(vocab_size=VOCAB, d_model=32, pattern="AA", num_heads=4, num_kv_heads=2))
    model = model.double().eval()

    steps = wrap_data_iterator(
        iter(samples),
        topology,
        samples_per_rank=len(samples),  # the whole rollout batch is one step
        max_tokens_per_rank=args.max_tokens,
        data_owner="all",
        scheduler_options={"order": "pipeline"},
    )
    step = next(steps)
    with torch.no_grad():
        packed = [token_logprobs(model, mb) for mb in step.microbatches]
        back = step.to_origin(packed)  # one tensor per sample read here, in read order
        tokens = step.to_origin([mb.input_ids.double() for mb in step.microbatches])
        alone = [token_logprobs(model, pack_sequences([s])) for s in samples]
    steps.close()

    exactly_once = len(back) == len(tokens) == len(samples) and all(
        torch.equal(t.long(), s["input_ids"]) for t, s in zip(tokens, samples, strict=True)
    )
    diff = max(float((a - b).abs().max()) for a, b in zip(back, alone, strict=True))
    ran_here = {int(g) for mb in step.microbatches for g in mb.sample_ids.tolist() if g >= 0}
    moved = len(set(step.origin_ids.tolist()) - ran_here)
    groups_split = 0
    if args.group:
        replica = step.schedule.placement()[0]
        gathered = [None] * world
        dist.all_gather_object(gathered, [s["group_id"] for s in samples])
        group_of = np.array([g for part in gathered for g in part])
        groups_split = sum(len(set(replica[group_of == g].tolist())) > 1 for g in np.unique(group_of))
    results.put(
        {
            "rank": rank,
            "samples": len(samples),
            "returned": len(back),
            "exactly_once": exactly_once,
            "max_abs_diff": diff,
            "moved": moved,
            "microbatches": step.num_microbatches,
            "imbalance": step.stats.imbalance,
            "groups_split": groups_split,
        }
    )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--responses", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=1024, help="max_tokens_per_rank")
    parser.add_argument("--group", action="store_true", help="keep each prompt's responses on one replica")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, world, store, args, results)) for r in range(world)]
        for p in procs:
            p.start()
        out = sorted((results.get(timeout=300) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join()
    for r in out:
        print(
            f"rank {r['rank']}: {r['samples']} rollouts read, {r['returned']} returned, exactly once in read order: "
            f"{r['exactly_once']}; {r['moved']} ran on the other rank; {r['microbatches']} microbatches; "
            f"per-token log-prob max abs diff packed vs alone: {r['max_abs_diff']:.3e}"
            + (f"; groups split over replicas: {r['groups_split']}" if args.group else "")
        )
    print(f"imbalance (busiest replica / mean): {out[0]['imbalance']:.3f}")
    return out


if __name__ == "__main__":
    main()
