"""torch.compile with and without token buckets: compilations, step time and tokens/s (CPU).

The tiny LM of :mod:`seqpack.compute.tiny_lm` (attention blocks only) is fed the microbatches
:func:`seqpack.wrap_data_iterator` makes in one process from a lognormal length stream
(:func:`seqpack.mock_data.lognormal_lengths`; ``--steps`` steps of ``--samples-per-rank``
samples, microbatches of ``--capacity`` tokens), plain and with
``static_shapes=StaticShapes(token_buckets=..., max_sequences=...)``, once per mode:

* ``eager``: no compile, plain packs (the baseline of every ratio); ``eager + buckets``: the
  bucketed packs (what their tail padding costs);
* ``compile dynamic=False``: ``torch.compile(dynamic=False)``, plain packs: one graph per
  distinct token count until dynamo's ``recompile_limit``, then eager for the rest;
* ``compile default``: ``torch.compile()`` (``dynamic=None``), plain packs: a static graph,
  then one with a dynamic token count on the first recompile;
* ``compile dynamic=False + buckets`` and ``compile default + buckets``: the same with
  ``static_shapes=StaticShapes(token_buckets=...)``: at most one graph per bucket.

Every mode runs the same sequences (the bucketed packs carry their tail padding) and the same
weights, forward and loss (``--train``: and backward plus an SGD step), in two passes. The
first runs each mode over every pack (every compile happens there): graphs dynamo compiled
(``counters["stats"]["unique_graphs"]``; each mode has a code object, hence a cache and a
recompile limit, of its own), whether the recompile limit was hit, the time of the steps that
compiled. The second runs the packs again, every mode compiled, round-robin pack by pack (a
shared machine's load changes hit every mode alike): the steady-state step time (median) and
real tokens/s, against eager.

The attention is a dense masked SDPA over the pack (a block-diagonal causal mask from
``seq_idx`` and ``padding_mask``): the tiny LM's own reference (``ThdAttention`` with
``backend="torch"``) walks ``cu_seqlens`` on the host, a graph break whose values dynamo
would specialise on; a varlen kernel (TE, flash-attn) is one opaque op taking ``cu_seqlens``
as tensors, which the dense module stands for. It is checked equal to the reference on real
tokens before anything is timed.

The default backend is ``aot_eager`` (dynamo and AOTAutograd, no code generation): it counts
compilations exactly as inductor would, in seconds; ``--backend inductor`` adds the generated
kernels' speed, but each of its CPU compiles takes minutes on a loaded 2-core machine.

    python benchmarks/static_shapes.py                 # a few minutes on a loaded 2-core machine
    python benchmarks/static_shapes.py --backend inductor --train --capacity 1024 --buckets 256,512,768,1024
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM  # noqa: E402
from seqpack.loader import wrap_data_iterator  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.thd import PackedBatch, StaticShapes  # noqa: E402
from seqpack.topology import Topology  # noqa: E402

MODES = (
    "eager",
    "eager + buckets",
    "compile dynamic=False",
    "compile default",
    "compile dynamic=False + buckets",
    "compile default + buckets",
)


class DenseThdAttention(nn.Module):
    """THD attention as one masked SDPA over the pack: query ``i`` sees the real keys of its
    own sequence up to itself. Pad queries give 0 (as ``ThdAttention``). No host sync."""

    def __init__(self, num_heads: int, num_kv_heads: int):
        super().__init__()
        self.group = num_heads // num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        t = q.shape[0]
        seq, pad = batch.seq_idx, batch.padding_mask
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        allowed = causal & (seq[:, None] == seq[None, :]) & ~pad[None, :] & ~pad[:, None]  # (T, T)
        allowed = allowed | torch.eye(t, dtype=torch.bool, device=q.device)  # pad rows: no empty softmax
        if self.group > 1:
            k, v = k.repeat_interleave(self.group, dim=1), v.repeat_interleave(self.group, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed)
        return out.transpose(0, 1).masked_fill(pad[:, None, None], 0)  # (T, H, D)


def make_model(cfg: TinyConfig, seed: int) -> TinyHybridLM:
    torch.manual_seed(seed)
    model = TinyHybridLM(cfg)
    for block in model.blocks:
        block.attn = DenseThdAttention(cfg.num_heads, cfg.num_kv_heads)
    return model


def wrapper_packs(
    steps: int,
    samples_per_rank: int,
    capacity: int,
    shapes: StaticShapes | None,
    mean: float,
    sigma: float,
    seed: int,
) -> list[PackedBatch]:
    """Every microbatch of ``steps`` steps of :func:`seqpack.wrap_data_iterator` (one process,
    ``samples_per_rank`` samples a step, microbatches of ``capacity`` tokens) over a
    lognormal stream, with ``static_shapes=shapes``."""
    lengths = lognormal_lengths(steps * samples_per_rank, min_seq_len=8, max_seq_len=capacity,
                                mean_seq_len=mean, sigma=sigma, seed=seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    stream = [{"input_ids": torch.randint(1, 256, (n,), generator=g)} for n in lengths.tolist()]
    it = wrap_data_iterator(
        iter(stream), Topology.single(), samples_per_rank=samples_per_rank, max_tokens_per_rank=capacity,
        static_shapes=shapes, prefetch=0,
    )  # fmt: skip
    with it:
        return [batch for step in it for batch in step.microbatches]


@dataclasses.dataclass
class ModeResult:
    mode: str
    graphs: int  # dynamo's unique graphs
    hit_limit: bool  # dynamo's recompile limit reached: later new shapes ran eager
    distinct_shapes: int  # token counts among the packs
    compile_steps_s: float  # total time of the steps that compiled a graph
    steady_step_ms: float  # median step time of the second (timed) pass
    tokens_per_s: float  # real tokens / s of the second pass
    total_s: float  # the first pass (compiles included)


class _LimitWatch(logging.Handler):
    """Notices dynamo's 'hit config.recompile_limit' warning."""

    def __init__(self) -> None:
        super().__init__()
        self.hit = False

    def emit(self, record: logging.LogRecord) -> None:
        if "recompile_limit" in record.getMessage() or "cache_size_limit" in record.getMessage():
            self.hit = True


@dataclasses.dataclass
class _Prepared:
    """A mode after its first pass over the packs (every graph it will compile is compiled)."""

    mode: str
    batches: Sequence[PackedBatch]
    run_step: Callable[[PackedBatch], None]
    graphs: int
    hit_limit: bool
    compile_steps_s: float
    first_pass_s: float


def _own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``fn`` with a code object of its own: dynamo caches graphs (and counts
    recompiles against its limit) per code object, so every mode gets a cache of its own."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_CODE_IDS)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


_CODE_IDS = itertools.count()


def prepare_mode(
    mode: str, batches: Sequence[PackedBatch], cfg: TinyConfig, train: bool, backend: str, seed: int
) -> _Prepared:
    """Build ``mode``'s step and run it once over every pack, counting the graphs dynamo compiles."""
    from torch._dynamo.utils import counters

    model = make_model(cfg, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3) if train else None

    def step(batch: PackedBatch) -> torch.Tensor:
        total, count = model.loss_sum(batch)
        return total / count.clamp(min=1)

    if mode.startswith("eager"):
        fn: Callable[[PackedBatch], torch.Tensor] = step
    else:
        fn = torch.compile(_own_code(step), backend=backend, dynamic=False if "dynamic=False" in mode else None)

    def run_step(batch: PackedBatch) -> None:
        if optimizer is None:
            with torch.no_grad():
                fn(batch)
            return
        loss = fn(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    watch = _LimitWatch()
    dynamo_log = logging.getLogger("torch._dynamo")
    dynamo_log.addHandler(watch)
    graphs_at_start = graphs_before = int(counters["stats"]["unique_graphs"])
    compile_s = 0.0
    start = time.perf_counter()
    try:
        for batch in batches:
            t0 = time.perf_counter()
            run_step(batch)
            graphs = int(counters["stats"]["unique_graphs"])
            if graphs > graphs_before:
                compile_s += time.perf_counter() - t0
                graphs_before = graphs
    finally:
        dynamo_log.removeHandler(watch)
    return _Prepared(
        mode, batches, run_step, graphs_before - graphs_at_start, watch.hit, compile_s, time.perf_counter() - start
    )


def time_modes(prepared: Sequence[_Prepared]) -> list[ModeResult]:
    """Second pass, every mode compiled: pack ``i`` of every mode, round-robin, so that a
    shared machine's load changes hit every mode alike."""
    times: list[list[float]] = [[] for _ in prepared]
    for i in range(len(prepared[0].batches)):
        for k, p in enumerate(prepared):
            t0 = time.perf_counter()
            p.run_step(p.batches[i])
            times[k].append(time.perf_counter() - t0)
    results = []
    for p, elapsed in zip(prepared, times, strict=True):
        real_tokens = sum(b.num_real_tokens for b in p.batches)
        results.append(
            ModeResult(
                mode=p.mode,
                graphs=p.graphs,
                hit_limit=p.hit_limit,
                distinct_shapes=len({b.num_tokens for b in p.batches}),
                compile_steps_s=p.compile_steps_s,
                steady_step_ms=1e3 * statistics.median(elapsed),
                tokens_per_s=real_tokens / sum(elapsed),
                total_s=p.first_pass_s,
            )
        )
    return results


def check_attention(cfg: TinyConfig, batch: PackedBatch, seed: int) -> float:
    """Largest difference on real tokens between the dense model and the reference model."""
    reference = TinyHybridLM(cfg).double()
    dense = make_model(cfg, seed).double()
    dense.load_state_dict(reference.state_dict())
    with torch.no_grad():
        diff = (reference(batch) - dense(batch))[~batch.padding_mask].abs().max()
    return float(diff)


def run(
    *,
    steps: int = 200,
    samples_per_rank: int = 4,
    capacity: int = 256,
    buckets: Sequence[int] = (64, 128, 192, 256),
    max_sequences: int = 16,
    d_model: int = 64,
    pattern: str = "AA",
    mean: float = 48.0,
    sigma: float = 1.0,
    train: bool = False,
    backend: str = "aot_eager",
    modes: Sequence[str] = MODES,
    seed: int = 0,
) -> tuple[list[ModeResult], dict[str, float]]:
    """Run every mode on one stream; returns the results and the stream's facts."""
    cfg = TinyConfig(d_model=d_model, pattern=pattern, num_heads=4, num_kv_heads=2)
    shapes = StaticShapes(token_buckets=tuple(buckets), max_sequences=max_sequences)
    plain = wrapper_packs(steps, samples_per_rank, capacity, None, mean, sigma, seed)
    bucketed = wrapper_packs(steps, samples_per_rank, capacity, shapes, mean, sigma, seed)
    diff = max(check_attention(cfg, batch, seed) for batch in (plain[0], bucketed[0]))
    assert diff < 1e-9, f"the dense attention differs from the reference by {diff}"
    import torch._dynamo

    torch._dynamo.reset()
    prepared = [
        prepare_mode(mode, bucketed if "buckets" in mode else plain, cfg, train, backend, seed) for mode in modes
    ]
    results = time_modes(prepared)
    real = sum(b.num_real_tokens for b in plain)
    assert real == sum(b.num_real_tokens for b in bucketed)  # the same sequences, packed either way
    facts = {
        "microbatches": len(plain),
        "microbatches_buckets": len(bucketed),
        "real_tokens_per_pack": real / len(plain),
        "padding_fraction_buckets": 1 - real / sum(b.num_tokens for b in bucketed),
        "sequences_per_pack": sum(b.num_sequences for b in plain) / len(plain),
        "reference_diff": diff,
    }
    return results, facts


def table(results: Sequence[ModeResult]) -> str:
    eager = next((r for r in results if r.mode == "eager"), results[0])
    lines = [
        "| mode | shapes | graphs compiled | recompile limit hit | compiling steps (s) | steady step (ms) "
        "| real tokens/s | vs eager | first pass (s) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.distinct_shapes} | {r.graphs} | {'yes' if r.hit_limit else 'no'} | "
            f"{r.compile_steps_s:.1f} | {r.steady_step_ms:.2f} | {r.tokens_per_s:,.0f} | "
            f"{r.tokens_per_s / eager.tokens_per_s:.2f}x | {r.total_s:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--samples-per-rank", type=int, default=4, help="samples the wrapper reads a step")
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--buckets", default="64,128,192,256", help="comma-separated token buckets")
    parser.add_argument("--max-sequences", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--pattern", default="AA", help="attention blocks only ('A' per block)")
    parser.add_argument("--mean", type=float, default=48.0, help="mean sequence length of the stream")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--train", action="store_true", help="also backward and an SGD step")
    parser.add_argument(
        "--backend", default="aot_eager", help="aot_eager: dynamo + AOTAutograd, no codegen (fast to compile); inductor"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    buckets = tuple(int(b) for b in args.buckets.split(","))
    modes = [m.strip() for m in args.modes.split(",")]
    results, facts = run(
        steps=args.steps, samples_per_rank=args.samples_per_rank, capacity=args.capacity, buckets=buckets,
        max_sequences=args.max_sequences, d_model=args.d_model, pattern=args.pattern, mean=args.mean,
        sigma=args.sigma, train=args.train,
        backend=args.backend, modes=modes, seed=args.seed,
    )  # fmt: skip
    print(
        f"tiny LM (pattern {args.pattern!r}, d_model {args.d_model}, dense masked attention), "
        f"{'forward+backward+SGD' if args.train else 'forward+loss (no grad)'}, torch {torch.__version__}, "
        f"backend {args.backend!r}, {torch.get_num_threads()} threads; {args.steps} wrapper steps of "
        f"{args.samples_per_rank} samples from a lognormal stream (mean {args.mean:g}, sigma {args.sigma:g}), "
        f"microbatches of capacity {args.capacity}: {facts['microbatches']:.0f} plain and "
        f"{facts['microbatches_buckets']:.0f} bucketed microbatches, "
        f"{facts['sequences_per_pack']:.1f} sequences and {facts['real_tokens_per_pack']:.0f} real tokens a pack; "
        f"buckets {buckets} (padding {100 * facts['padding_fraction_buckets']:.1f}% of bucketed tokens), "
        f"max_sequences {args.max_sequences}; dense attention vs reference on real tokens: "
        f"{facts['reference_diff']:.1e}"
    )
    print(
        "first pass: every mode over every pack once (compiles happen here; 'first pass' is its time); second "
        "pass: the packs again, modes round-robin pack by pack; 'steady step' = its median step, 'real tokens/s' "
        "= its real tokens over its time, 'vs eager' = that against eager on the plain packs"
    )
    print(table(results))
    over = [r for r in results if "buckets" in r.mode and r.graphs > len(buckets)]
    if over:
        raise SystemExit(f"more graphs than buckets: {[(r.mode, r.graphs) for r in over]}")


if __name__ == "__main__":
    main()
