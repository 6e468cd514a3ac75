"""Issue 41 item 5, measured: step time of a tiny Qwen2-VL on gloo dp=2, one rank per core.

Two processes (gloo, ``torch.set_num_threads(1)``, each pinned to its own core where the
machine has two) train four copies of the same random-init Qwen2-VL side by side, one step
of each in turn (the order rotates every step, so load that comes and goes hits all four):

- **tokens**: ``PackingConfig`` without ``model=``: ``balanced`` plans on the language model's
  tokens alone (what frameworks do today);
- **summed**: ``PackingConfig(model=ModelSpec.from_hf(config))``: the plan balances language
  model + vision encoder FLOPs (``sample_cost``);
- **rebalanced**: summed, and :func:`seqpack.interop.hf_encoder.rebalance_encoder` with
  ``mode=True`` (each microbatch round's images encoded across the two ranks, on a group of
  its own);
- **tokens+rebal**: token-only plans with ``rebalance_encoder``: what rebalancing does alone.

A step is timed on each rank from a barrier to the end of the optimizer step (forward and
backward of every microbatch, the gradients' all-reduce, AdamW); the step time is the larger
of the two ranks', and the table gives its median over the steps after ``--warmup``, with
the median over the steps of each step's time over the token-only plan's time of the same
step (the four plans run the same samples), the encoder imbalance (the larger rank's
encoder FLOPs over the mean, where the sequences run, before rebalancing) and the steps'
mean tokens. The machine's load average is printed before and after: on a shared machine
other processes share the two cores, and the spread says how much. The batches are made before the clock
starts (``prefetch=0``).

Model: language model 64 wide, 2 layers, 4 heads (2 KV), SwiGLU 256, vocabulary 128; vision
tower 128 wide, 4 blocks, 4 heads, patches of 2 px, 2 x 2 merge: a large image costs the
encoder far more than its 256 placeholder tokens cost the language model, as in the 7B
models of ``benchmarks/multimodal.py``. Samples (synthetic pixels and tokens, seeded): 45%
text only (log-normal, median 160 tokens, in [32, 512]), 35% a thumbnail (8 x 8 patches, 16
placeholders), 20% a large image (32 x 32 patches, 256 placeholders), each image sample with
32-128 tokens of text; ``--samples-per-rank`` per rank and step, at most
``--max-tokens-per-rank`` tokens a microbatch.

    python benchmarks/multimodal_cpu.py [--steps 10] [--warmup 2] [--out benchmarks/results/multimodal_cpu.txt]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

MODES = ("tokens", "summed", "rebalanced", "tokens+rebal")
VOCAB = 128
IMAGE, VIDEO, START, END = 120, 121, 122, 123
PATCH, MERGE, TEMPORAL = 2, 2, 2
PATCH_DIM = 3 * TEMPORAL * PATCH * PATCH
IGNORE = -100


def tiny_model():
    import transformers

    config = transformers.Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0},
            bos_token_id=0,
            eos_token_id=1,
        ),
        vision_config=dict(
            depth=4,
            embed_dim=128,
            hidden_size=64,
            num_heads=4,
            patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=TEMPORAL,
        ),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=START,
        vision_end_token_id=END,
    )
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).float()


def sample(rng: np.random.Generator) -> dict:
    """One sample of the skewed mix (module docstring): HF-style labels, -100 on the prompt."""
    kind = rng.random()
    if kind < 0.45:
        n = int(np.clip(rng.lognormal(np.log(160), 0.6), 32, 512))
        ids = torch.from_numpy(rng.integers(2, 100, n))
        labels = ids.clone()
        labels[:1] = IGNORE
        return {"input_ids": ids, "labels": labels, "mm_token_type_ids": torch.zeros_like(ids)}
    side = 8 if kind < 0.80 else 32
    text = torch.from_numpy(rng.integers(2, 100, int(rng.integers(32, 129))))
    placeholders = torch.full((side * side // MERGE**2,), IMAGE)
    ids = torch.cat([text[:4], torch.tensor([START]), placeholders, torch.tensor([END]), text[4:]])
    labels = ids.clone()
    labels[: 4 + 2 + placeholders.shape[0]] = IGNORE
    return {
        "input_ids": ids,
        "labels": labels,
        "mm_token_type_ids": (ids == IMAGE).long(),
        "pixel_values": torch.from_numpy(rng.standard_normal((side * side, PATCH_DIM)).astype(np.float32)),
        "image_grid_thw": torch.tensor([[1, side, side]]),
    }


def sum_gradients(model: torch.nn.Module) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def rank_main(rank: int, port: int, args: argparse.Namespace, result: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from seqpack import PackingConfig, Topology, wrap_data_iterator
    from seqpack.cost import ModelSpec
    from seqpack.interop.hf import to_hf
    from seqpack.interop.hf_encoder import rebalance_encoder
    from seqpack.thd import MRopeSpec

    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})  # one rank per core
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    topology = Topology.from_device_mesh(init_device_mesh("cpu", (2,), mesh_dim_names=("dp",)))
    rng = np.random.default_rng(args.seed)
    samples = [sample(rng) for _ in range(args.steps * args.samples_per_rank * 2)]
    shard = samples[rank::2]
    models, iterators, optimizers, hooks = {}, {}, {}, {}
    for mode in MODES:
        model = tiny_model()
        model.train()
        spec = ModelSpec.from_hf(model.config)
        config = PackingConfig(
            samples_per_rank=args.samples_per_rank,
            max_tokens_per_rank=args.max_tokens_per_rank,
            label_format="unshifted",
            mrope=MRopeSpec.from_hf(model.config),
            model=None if mode.startswith("tokens") else spec,
            prefetch=0,
        )
        models[mode] = model
        optimizers[mode] = torch.optim.AdamW(model.parameters(), lr=1e-3)
        iterators[mode] = iter(wrap_data_iterator(shard, topology, config))
        if "rebal" in mode:
            hooks[mode] = rebalance_encoder(model, dist.new_group([0, 1]), mode=True)
    vision = ModelSpec.from_hf(models["summed"].config).vision
    rows = []  # (step, mode, wall, encoder flops of this rank, tokens of this rank)
    for s in range(args.steps):
        order = MODES[s % len(MODES) :] + MODES[: s % len(MODES)]
        for mode in order:
            step = next(iterators[mode])
            batches = [to_hf(b, num_items_in_batch=step.num_loss_tokens) for b in step.microbatches]
            flops = sum(vision.flops(b.get("image_grid_thw"), b.get("video_grid_thw")) for b in batches)
            tokens = sum(int(b["input_ids"].numel()) for b in batches)
            model, optimizer = models[mode], optimizers[mode]
            dist.barrier()
            start = time.perf_counter()
            for kwargs in batches:
                model(**kwargs).loss.backward()
            sum_gradients(model)
            optimizer.step()
            optimizer.zero_grad()
            rows.append((s, mode, time.perf_counter() - start, flops, tokens))
    moved = {mode: (h.moved_images, h.routed_rounds, h.rounds) for mode, h in hooks.items()}
    everyone: list = [None, None]
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        pathlib.Path(result).write_text(json.dumps([everyone, moved]))
    dist.barrier()
    dist.destroy_process_group()


def summarize(everyone: list, moved: dict, args: argparse.Namespace, load: tuple) -> str:
    by = {}
    for rank, rows in enumerate(everyone):
        for s, mode, wall, flops, tokens in rows:
            by.setdefault((s, mode), [None, None])[rank] = (wall, flops, tokens)
    lines = [
        f"# benchmarks/multimodal_cpu.py --steps {args.steps} --warmup {args.warmup} --samples-per-rank "
        f"{args.samples_per_rank} --max-tokens-per-rank {args.max_tokens_per_rank} --seed {args.seed}",
        f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
        f"{os.cpu_count()} cores, gloo dp=2, one thread a rank; load average before {load[0]}, after {load[1]}",
        "# step time: max over the 2 ranks of (barrier -> forward/backward of every microbatch, gradient "
        "all-reduce, AdamW), median over the timed steps (min-max in brackets)",
        "# vs tokens: the median over the timed steps of the step's time over the token-only plan's of the same step",
        f"{'mode':<12} {'step s (median)':>15} {'[min - max]':>17} {'vs tokens':>9} {'enc. imbal.':>11} "
        f"{'tokens/step':>11}",
    ]
    timed = [s for s in range(args.steps) if s >= args.warmup]
    base = [max(by[(s, MODES[0])][r][0] for r in range(2)) for s in timed]
    for mode in MODES:
        walls = [max(by[(s, mode)][r][0] for r in range(2)) for s in timed]
        paired = statistics.median(w / b for w, b in zip(walls, base, strict=True))
        imbalance = [
            max(by[(s, mode)][r][1] for r in range(2)) / max(1e-30, np.mean([by[(s, mode)][r][1] for r in range(2)]))
            for s in timed
        ]
        tokens = np.mean([sum(by[(s, mode)][r][2] for r in range(2)) for s in timed])
        median = statistics.median(walls)
        lines.append(
            f"{mode:<12} {median:>15.3f} {f'[{min(walls):.3f} - {max(walls):.3f}]':>17} {paired:>8.2f}x "
            f"{np.mean(imbalance):>11.2f} {tokens:>11.0f}"
        )
    for mode, (images, routed, rounds) in moved.items():
        lines.append(f"# {mode}: {images} images moved in {routed} of {rounds} microbatch rounds (warm-up included)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--samples-per-rank", type=int, default=8)
    parser.add_argument("--max-tokens-per-rank", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = tuple(round(v, 2) for v in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rows.json")
        mp.start_processes(rank_main, args=(port, args, result), nprocs=2, start_method="spawn")
        everyone, moved = json.loads(pathlib.Path(result).read_text())
    after = tuple(round(v, 2) for v in os.getloadavg())
    text = summarize(everyone, moved, args, (before, after))
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
