"""``seqpack demo``: train a tiny hybrid LM on packed, balanced THD batches across CPU ranks.

The demo starts ``dp * cp`` processes (gloo), wraps a dataset with
:func:`~seqpack.wrapper.wrap_data_iterator`, shards a tiny attention + Mamba2 language model
with FSDP2 (``fully_shard``) over the flattened ``dp x cp`` mesh, and trains it for a few
steps. It then trains the same model on the same data with Megatron's ``dp_balanced``
scheduler and with a padded baseline (fixed microbatches, every sequence padded to the
longest of its microbatch), and prints a summary table with real tokens/s, padding, balance
and FLOPs / MFU.

Equivalent torchrun launch (one process per rank; the demo's own launcher does this, and
sets the glibc malloc variables below so that ranks keep their heap between steps)::

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456 \
        torchrun --standalone --nproc-per-node 4 -m seqpack.demo --dp 2 --cp 2
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

MODES = ("balanced", "dp_balanced", "padded")
COSTS = ("measured", "flops", "tokens")


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """Everything a demo or benchmark run depends on (identical on every rank)."""

    dp: int = 2
    cp: int = 2
    steps: int = 4
    warmup_steps: int = 1
    modes: tuple[str, ...] = MODES
    data: str = "mock"  # "mock", "stdlib" or a Parquet path
    samples_per_rank: int = 16
    max_tokens_per_rank: int = 4096
    min_seq_len: int = 16
    mean_seq_len: int = 320
    max_seq_len: int = 4096
    sigma: float = 1.1
    d_model: int = 64
    pattern: str = "AMAM"
    lr: float = 3e-3
    seed: int = 0
    threads: int = 1
    cost: str = "measured"  # the scheduler's cost: "measured" (fit on this CPU), "flops" or "tokens"
    fsdp_units: str = "model"  # "model": one FSDP unit; "block": one per block as well
    port: int = 0
    timeout_s: float = 300.0
    json_out: str | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "cp", "steps", "samples_per_rank", "max_tokens_per_rank", "d_model", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"--modes must be a non-empty subset of {MODES}, got {list(self.modes)}")
        if not 1 <= self.min_seq_len <= self.mean_seq_len <= self.max_seq_len:
            raise ValueError(
                f"need 1 <= min_seq_len ({self.min_seq_len}) <= mean_seq_len ({self.mean_seq_len}) "
                f"<= max_seq_len ({self.max_seq_len})"
            )
        if self.max_seq_len > self.max_tokens_per_rank * self.cp:
            raise ValueError(
                f"max_seq_len={self.max_seq_len} exceeds a microbatch (max_tokens_per_rank {self.max_tokens_per_rank}"
                f" x cp {self.cp} = {self.max_tokens_per_rank * self.cp}); raise --max-tokens-per-rank"
            )
        if self.fsdp_units not in ("model", "block"):
            raise ValueError(f"--fsdp-units must be 'model' or 'block', got {self.fsdp_units!r}")
        if self.cost not in COSTS:
            raise ValueError(f"--cost must be one of {COSTS}, got {self.cost!r}")
        if self.data not in ("mock", "stdlib") and not os.path.isfile(self.data):
            raise ValueError(f"--data {self.data!r}: no such file (use 'mock', 'stdlib' or a Parquet path)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")

    @property
    def world_size(self) -> int:
        return self.dp * self.cp

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def load_dataset(settings: DemoSettings) -> tuple[Any, int]:
    """(map-style dataset of ``{"input_ids": ...}``, vocab size) for ``settings.data``."""
    from seqpack.mock_data import MockSFTDataset, lognormal_lengths
    from seqpack.mock_data.text import BYTE_VOCAB_SIZE, TokenDataset, stdlib_corpus

    needed = settings.total_steps * settings.dp * settings.samples_per_rank
    if settings.data == "mock":
        lengths = lognormal_lengths(
            needed,
            min_seq_len=settings.min_seq_len,
            max_seq_len=settings.max_seq_len,
            mean_seq_len=settings.mean_seq_len,
            sigma=settings.sigma,
            seed=settings.seed,
        )
        return MockSFTDataset(lengths, vocab_size=BYTE_VOCAB_SIZE, seed=settings.seed), BYTE_VOCAB_SIZE
    if settings.data == "stdlib":
        dataset = TokenDataset(stdlib_corpus(max_len=settings.max_seq_len))
        vocab = BYTE_VOCAB_SIZE
    else:
        dataset = TokenDataset(settings.data)
        vocab = max(BYTE_VOCAB_SIZE, dataset.vocab_size)
        too_long = int((dataset.lengths() > settings.max_seq_len).sum())
        if too_long:
            raise ValueError(
                f"--data {settings.data!r}: {too_long} documents are longer than --max-seq-len {settings.max_seq_len}"
            )
    if len(dataset) < needed:
        raise ValueError(
            f"--data {settings.data!r} has {len(dataset)} documents; the run needs {needed} "
            f"(steps x dp x samples_per_rank); lower --steps or --samples-per-rank"
        )
    return dataset, vocab


def sample_order(settings: DemoSettings, num_documents: int) -> np.ndarray:
    """Global sample order: a seeded shuffle for real corpora (files arrive sorted)."""
    if settings.data == "mock":
        return np.arange(num_documents)
    return np.random.default_rng(settings.seed).permutation(num_documents)


def rank_indices(settings: DemoSettings, order: np.ndarray, dp_rank: int) -> Iterator[int]:
    """Document indices DP rank ``dp_rank`` reads, step by step: the global batch of step
    ``s`` is ``order[s*dp*spr : (s+1)*dp*spr]``, DP rank ``d`` reads its ``d``-th block."""
    spr, dp = settings.samples_per_rank, settings.dp
    for step in range(settings.total_steps):
        start = (step * dp + dp_rank) * spr
        yield from (int(i) for i in order[start : start + spr])


# --------------------------------------------------------------------------------------
# Padded baseline
# --------------------------------------------------------------------------------------


def padded_microbatches(samples: Sequence[dict], settings: DemoSettings, sample_ids: Sequence[int]):
    """The no-packing baseline: fixed microbatches of ``b = capacity // max_seq_len``
    sequences (the most that always fits), each sequence padded to the longest of its
    microbatch. Pads are computed as if real (``cu_seqlens = cu_seqlens_padded``), as a
    padded BSHD batch would be; they carry no loss."""
    from seqpack.thd import pack_sequences

    capacity = settings.max_tokens_per_rank * settings.cp
    per_mb = max(1, capacity // settings.max_seq_len)
    multiple = 2 * settings.cp if settings.cp > 1 else 1
    batches = []
    for start in range(0, len(samples), per_mb):
        group = samples[start : start + per_mb]
        longest = max(int(s["input_ids"].numel()) for s in group)
        longest = -(-longest // multiple) * multiple
        batch = pack_sequences(group, pad_multiple=longest, sample_ids=sample_ids[start : start + per_mb])
        batches.append(dataclasses.replace(batch, cu_seqlens=batch.cu_seqlens_padded))
    return batches


# --------------------------------------------------------------------------------------
# Training (runs on every rank)
# --------------------------------------------------------------------------------------


def _tiny_config(settings: DemoSettings, vocab_size: int):
    from seqpack.compute.tiny_lm import TinyConfig

    heads = max(1, settings.d_model // 16)
    return TinyConfig(
        vocab_size=vocab_size,
        d_model=settings.d_model,
        pattern=settings.pattern,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2),
        d_state=16,
        mamba_headdim=16,
    )


def measure_gemm_flops(threads: int, size: int = 384, repeats: int = 5) -> float:
    """fp32 GEMM FLOP/s of this process (the 'peak' that MFU is measured against)."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * size**3 / best


def calibrate_cost(cfg, max_len: int, tokens: int = 4096, repeats: int = 2):
    """The tiny model's cost on this CPU: time forward+backward of packs of equal-length
    sequences (64 tokens up to ``max_len``) and fit ``constant + linear*S + quadratic*SS``.

    Attention on CPU runs far below GEMM speed, so the measured cost is more quadratic than
    the FLOPs count says; this is what a rank actually waits for.
    """
    from seqpack.compute.tiny_lm import TinyHybridLM
    from seqpack.cost import CostModel
    from seqpack.thd import pack_sequences

    model = TinyHybridLM(cfg)
    gen = torch.Generator().manual_seed(0)
    sizes, length = [], 64
    while length < max_len:
        sizes.append(length)
        length *= 2
    sizes.append(max_len)
    packs = []
    for length in sizes:
        for total in (tokens // 2, tokens):
            count = max(1, total // length)
            packs.append([length] * count)
    times = []
    for lengths in packs:
        batch = pack_sequences([{"input_ids": torch.randint(1, cfg.vocab_size, (n,), generator=gen)} for n in lengths])
        best = math.inf
        for _ in range(repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            loss, _ = model.loss_sum(batch)
            loss.backward()
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    return CostModel.fit(packs, times)


def warm_up(cfg, settings: DemoSettings) -> None:
    """Run a full-capacity microbatch holding a longest-possible sequence once, so that no
    mode pays this process's first touch of its peak memory (slow on VMs) in its timings."""
    from seqpack.compute.tiny_lm import TinyHybridLM
    from seqpack.thd import pack_sequences

    model = TinyHybridLM(cfg)
    capacity = settings.max_tokens_per_rank  # what one rank holds (CP shards are smaller)
    lengths = [settings.max_seq_len]
    while sum(lengths) + settings.mean_seq_len <= capacity:
        lengths.append(settings.mean_seq_len)
    batch = pack_sequences([{"input_ids": torch.ones(n, dtype=torch.int64)} for n in lengths])
    for _ in range(2):
        loss, _ = model.loss_sum(batch)
        loss.backward()


def resolve_cost(settings: DemoSettings, cfg, spec):
    """The scheduler's cost model, identical on every rank (rank 0 measures, all receive)."""
    import torch.distributed as dist

    from seqpack.cost import CostModel

    if settings.cost == "flops":
        return spec.cost_model()
    if settings.cost == "tokens":
        return CostModel.tokens()
    coef = torch.zeros(3, dtype=torch.float64)
    if dist.get_rank() == 0:
        model = calibrate_cost(cfg, settings.max_seq_len)
        coef = torch.tensor([model.linear, model.quadratic, model.constant], dtype=torch.float64)
    dist.broadcast(coef, src=0)  # coefficients are reals; everyone must schedule with the same ones
    return CostModel(float(coef[0]), float(coef[1]), float(coef[2]))


class _Run:
    """One mode's model, optimizer and batches; trained one step at a time so that modes
    interleave and share the machine's noise fairly."""

    def __init__(self, mode, settings, mesh, topology, dataset, order, vocab_size, spec, cost):
        from torch.distributed.fsdp import fully_shard

        from seqpack.compute.tiny_lm import TinyHybridLM
        from seqpack.wrapper import wrap_data_iterator

        self.mode, self.settings, self.topology, self.spec = mode, settings, topology, spec
        cp_group = mesh["cp"].get_group() if settings.cp > 1 else None
        torch.manual_seed(settings.seed)  # every mode starts from the same weights
        self.model = TinyHybridLM(_tiny_config(settings, vocab_size), cp_group=cp_group)
        if settings.world_size > 1:
            flat = mesh["dp", "cp"]._flatten("dp_cp")
            if settings.fsdp_units == "block":
                for block in self.model.blocks:
                    fully_shard(block, mesh=flat)
            fully_shard(self.model, mesh=flat)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=settings.lr)
        self.samples = (dataset[i] for i in rank_indices(settings, order, topology.dp_rank))
        if mode != "padded":
            self.steps = wrap_data_iterator(
                self.samples,
                topology,
                samples_per_rank=settings.samples_per_rank,
                max_tokens_per_rank=settings.max_tokens_per_rank,
                scheduler=mode,
                data_owner="tp0",
                cost=cost,
                flops_fn=spec.flops,
            )
        self.totals = {"tokens": 0, "time": 0.0, "flops": 0.0, "pad": 0, "padded": 0, "mbs": 0, "measured": 0}
        self.imbalances: list[float] = []
        self.round_imbalances: list[float] = []
        self.losses: list[float] = []

    def _batches(self):
        """(microbatches, real tokens, sum of squared lengths, padded tokens, mbs, imbalance)."""
        import torch.distributed as dist

        from seqpack.cp import shard_for_cp

        settings, topology = self.settings, self.topology
        if self.mode != "padded":
            step = next(self.steps)
            st = step.stats
            self.round_imbalances.append(st.round_imbalance)
            return step.microbatches, st.real_tokens, st.seqlen_sq_sum, st.padded_tokens, step.num_microbatches, st.imbalance
        local = [next(self.samples) for _ in range(settings.samples_per_rank)]
        batches = padded_microbatches(local, settings, list(range(len(local))))
        microbatches = [shard_for_cp(b, settings.cp, topology.cp_rank) for b in batches]
        lengths = torch.tensor([int(s["input_ids"].numel()) for s in local], dtype=torch.int64)
        counts = torch.tensor([int(lengths.sum()), int((lengths * lengths).sum()), sum(b.num_tokens for b in batches)])
        if topology.cp_rank != 0:  # the CP ranks of a replica hold the same samples: count once
            counts.zero_()
        dist.all_reduce(counts)
        real, sq_sum, padded = (int(v) for v in counts)
        return microbatches, real, sq_sum, padded, len(microbatches), float("nan")

    def train_step(self, index: int, log) -> None:
        import torch.distributed as dist

        settings = self.settings
        world = settings.world_size
        dist.barrier()
        t0 = time.perf_counter()
        microbatches, real_tokens, sq_sum, padded_tokens, num_mbs, imbalance = self._batches()
        loss_tokens = torch.stack([mb.loss_mask.sum() for mb in microbatches]).sum().reshape(1)
        dist.all_reduce(loss_tokens)
        total = torch.zeros(())
        for mb in microbatches:
            loss_sum, _ = self.model.loss_sum(mb)
            # FSDP averages gradients over dp x cp; scaling by world makes them the gradient
            # of the global mean loss (CP ranks hold disjoint tokens of the same sequences).
            (loss_sum * world / loss_tokens).backward()
            total = total + loss_sum.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        elapsed = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed)
        loss = float(total / loss_tokens)
        measured = index >= settings.warmup_steps
        if measured:
            t = self.totals
            t["tokens"] += real_tokens
            t["time"] += seconds
            t["flops"] += float(self.spec.flops(real_tokens, sq_sum))
            t["pad"] += padded_tokens - real_tokens
            t["padded"] += padded_tokens
            t["mbs"] += num_mbs
            t["measured"] += 1
            if not math.isnan(imbalance):
                self.imbalances.append(imbalance)
        self.losses.append(loss)
        log(self.mode, index, settings, loss, real_tokens / seconds, 1 - real_tokens / max(padded_tokens, 1),
            imbalance, num_mbs, measured)

    def result(self, peak_flops: float) -> dict[str, Any]:
        t = self.totals
        achieved = t["flops"] / t["time"] if t["time"] else 0.0
        cores = min(self.settings.world_size, os.cpu_count() or 1)
        return {
            "mode": self.mode,
            "tokens_per_s": t["tokens"] / t["time"] if t["time"] else 0.0,
            "pad_fraction": t["pad"] / t["padded"] if t["padded"] else 0.0,
            "imbalance": float(np.mean(self.imbalances)) if self.imbalances else None,
            "round_imbalance": float(np.mean(self.round_imbalances[self.settings.warmup_steps :]))
            if self.round_imbalances
            else None,
            "microbatches_per_step": t["mbs"] / max(t["measured"], 1),
            "first_loss": self.losses[0],
            "last_loss": self.losses[-1],
            "model_flops_per_s": achieved,
            "mfu": achieved / (peak_flops * cores) if peak_flops else None,
            "seconds": t["time"],
            "steps": t["measured"],
            "real_tokens": t["tokens"],
        }


def _log_step(mode, step, settings, loss, tokens_per_s, pad, imbalance, mbs, measured):
    width = 16
    done = int(round((step + 1) / settings.total_steps * width))
    bar = "#" * done + "." * (width - done)
    imb = "  n/a " if math.isnan(imbalance) else f"{imbalance:6.3f}"
    tag = "" if measured else "  (warm-up)"
    print(
        f"[{mode:>11}] step {step + 1:>2}/{settings.total_steps} [{bar}] loss {loss:6.3f} | "
        f"{tokens_per_s:8,.0f} real tok/s | pad {pad * 100:5.1f}% | imbalance {imb} | {mbs:>2} mbs{tag}",
        flush=True,
    )


def _quiet_log(*args: Any) -> None:
    pass


def worker(settings: DemoSettings) -> list[dict[str, Any]] | None:
    """One rank of the demo (``torch.distributed`` initialised by the caller)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from seqpack.topology import Topology

    torch.set_num_threads(settings.threads)
    rank = dist.get_rank()
    if dist.get_world_size() != settings.world_size:
        raise ValueError(
            f"world size {dist.get_world_size()} != dp({settings.dp}) * cp({settings.cp}) = {settings.world_size}"
        )
    mesh = init_device_mesh("cpu", (settings.dp, settings.cp), mesh_dim_names=("dp", "cp"))
    topology = Topology.from_device_mesh(mesh)
    dataset, vocab = load_dataset(settings)
    order = sample_order(settings, len(dataset))
    cfg = _tiny_config(settings, vocab)
    spec = cfg.model_spec()
    warm_up(cfg, settings)
    cost = resolve_cost(settings, cfg, spec)
    # The GEMM 'peak' is measured by rank 0 while the others wait, so that ranks sharing a
    # core do not halve it.
    peak_t = torch.tensor([measure_gemm_flops(settings.threads) if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(peak_t, src=0)
    peak = float(peak_t)
    if rank == 0 and not settings.quiet:
        share = cost.quadratic_share(settings.mean_seq_len)
        print(f"scheduler cost ({settings.cost}): {cost.linear:.4g}*s + {cost.quadratic:.4g}*s^2 + {cost.constant:.4g} "
              f"per microbatch; attention-like quadratic share at {settings.mean_seq_len} tokens: {share:.0%}, "
              f"at {settings.max_seq_len}: {cost.quadratic_share(settings.max_seq_len):.0%}", flush=True)
    log = _log_step if rank == 0 and not settings.quiet else _quiet_log
    runs = [_Run(mode, settings, mesh, topology, dataset, order, vocab, spec, cost) for mode in settings.modes]
    # Modes take turns step by step, so that warm-up and the noise of a shared machine fall
    # on all of them alike.
    for index in range(settings.total_steps):
        for run_ in runs:
            run_.train_step(index, log)
    results = [run_.result(peak) for run_ in runs]
    if rank == 0:
        for r in results:
            r["peak_gemm_flops_per_process"] = peak
        return results
    return None


def format_summary(results: list[dict[str, Any]], settings: DemoSettings) -> str:
    base = {r["mode"]: r["tokens_per_s"] for r in results}
    lines = [
        f"summary: dp={settings.dp} cp={settings.cp}, {settings.steps} measured steps after {settings.warmup_steps}"
        f" warm-up, {settings.samples_per_rank} samples per DP rank per step, data={settings.data}",
        f"{'mode':<12}{'real tok/s':>12}{'vs padded':>11}{'vs dp_bal':>11}{'pad %':>8}{'imbalance':>11}"
        f"{'round imb':>11}{'mbs/step':>10}{'loss':>15}{'GFLOP/s':>10}{'MFU':>8}",
    ]
    for r in results:
        rel_pad = f"{r['tokens_per_s'] / base['padded']:.2f}x" if base.get("padded") else "-"
        rel_dp = f"{r['tokens_per_s'] / base['dp_balanced']:.2f}x" if base.get("dp_balanced") else "-"
        imb = f"{r['imbalance']:.3f}" if r["imbalance"] is not None else "n/a"
        rimb = f"{r['round_imbalance']:.3f}" if r["round_imbalance"] is not None else "n/a"
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "-"
        lines.append(
            f"{r['mode']:<12}{r['tokens_per_s']:>12,.0f}{rel_pad:>11}{rel_dp:>11}{r['pad_fraction'] * 100:>7.1f}%"
            f"{imb:>11}{rimb:>11}{r['microbatches_per_step']:>10.1f}{r['first_loss']:>7.3f}->{r['last_loss']:<6.3f}"
            f"{r['model_flops_per_s'] / 1e9:>10.2f}{mfu:>8}"
        )
    cores = os.cpu_count() or 1
    if settings.world_size > cores:
        lines.append(
            f"note: {settings.world_size} ranks share {cores} cores, so a rank waiting on a slower peer hands its core "
            "to the others and tokens/s understates what balance buys; benchmarks/end_to_end.py runs one rank per core"
        )
    lines.append(
        "imbalance: busiest replica's cost / mean (what DDP waits for); round imb: sum over microbatch rounds of "
        "the slowest replica / mean (what FSDP, which syncs every microbatch, waits for); costs in the scheduler's "
        "cost model"
    )
    peak = results[0].get("peak_gemm_flops_per_process")
    if peak:
        lines.append(
            f"MFU = model training FLOPs (seqpack.cost, real lengths) / (measured fp32 GEMM rate "
            f"{peak / 1e9:.1f} GFLOP/s per process x {min(settings.world_size, os.cpu_count() or 1)} cores)"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Launching
# --------------------------------------------------------------------------------------


# glibc returns freed memory to the OS past these thresholds and faults it back in on the
# next step; on CPU VMs that doubled the time of microbatches with long sequences and made
# timings depend on allocation history instead of on work. Ranks the demo spawns keep their
# heap (set them yourself under torchrun: they are read when a process starts).
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ValueError(f"--port {port} is already in use ({exc.strerror}); pass --port 0 to pick a free one") from None


def _spawned(local_rank: int, settings: DemoSettings, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=local_rank,
        world_size=settings.world_size,
        timeout=datetime.timedelta(seconds=settings.timeout_s),
    )
    _run_rank(settings)


def _run_rank(settings: DemoSettings) -> None:
    """This rank's whole demo, then a clean teardown (``torch.distributed`` initialised)."""
    import torch.distributed as dist

    try:
        results = worker(settings)
        dist.barrier()  # nobody tears gloo down while a peer still finishes its last collective
        if results is not None:
            _finish(results, settings)
    finally:
        dist.destroy_process_group()


def _finish(results: list[dict[str, Any]], settings: DemoSettings) -> None:
    if not settings.quiet:
        print(format_summary(results, settings), flush=True)
    if settings.json_out:
        with open(settings.json_out, "w") as f:
            json.dump({"settings": dataclasses.asdict(settings), "results": results}, f, indent=2)


def launch(settings: DemoSettings) -> int:
    """Run the demo: under torchrun (``RANK`` set) as this rank, else spawn all ranks."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=settings.timeout_s))
        _run_rank(settings)
        return 0
    port = settings.port
    if port:
        _check_port(port)
    else:
        port = _free_port()
    if not settings.quiet:
        print(
            f"seqpack demo: {settings.world_size} CPU processes (dp={settings.dp} x cp={settings.cp}, gloo on "
            f"127.0.0.1:{port}), data={settings.data}, modes={', '.join(settings.modes)}",
            flush=True,
        )
    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)
    try:
        mp.start_processes(_spawned, args=(settings, port), nprocs=settings.world_size, join=True, start_method="spawn")
    except mp.ProcessRaisedException as exc:
        print(f"seqpack demo failed: a rank raised an error:\n{exc}", file=sys.stderr)
        return 1
    except mp.ProcessExitedException as exc:
        print(f"seqpack demo failed: rank {exc.error_index} died (exit code {exc.exit_code}); the others were stopped",
              file=sys.stderr)
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoSettings()
    parser.add_argument("--dp", type=int, default=d.dp, help="data-parallel replicas (default %(default)s)")
    parser.add_argument("--cp", type=int, default=d.cp, help="context-parallel ranks per replica (default %(default)s)")
    parser.add_argument("--steps", type=int, default=d.steps, help="measured steps per mode (default %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--modes", default=",".join(d.modes), help="comma list of balanced,dp_balanced,padded")
    parser.add_argument("--data", default=d.data, help="'mock' (lognormal SFT lengths), 'stdlib' (the standard "
                        "library's source, byte-tokenized) or a Parquet file with input_ids or text")
    parser.add_argument("--samples-per-rank", type=int, default=d.samples_per_rank)
    parser.add_argument("--max-tokens-per-rank", type=int, default=d.max_tokens_per_rank)
    parser.add_argument("--mean-seq-len", type=int, default=d.mean_seq_len)
    parser.add_argument("--max-seq-len", type=int, default=d.max_seq_len)
    parser.add_argument("--min-seq-len", type=int, default=d.min_seq_len)
    parser.add_argument("--d-model", type=int, default=d.d_model)
    parser.add_argument("--pattern", default=d.pattern, help="blocks: A = attention+MLP, M = Mamba2 (default %(default)s)")
    parser.add_argument("--cost", default=d.cost, choices=COSTS, help="scheduler cost model: measured on this CPU "
                        "(default), the tiny model's FLOPs, or tokens")
    parser.add_argument("--fsdp-units", default=d.fsdp_units, choices=("model", "block"),
                        help="fully_shard the whole model as one unit (default) or every block too")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per process")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--port", type=int, default=d.port, help="rendezvous port (0 = pick a free one)")
    parser.add_argument("--json-out", default=None, help="write settings and results as JSON")
    parser.add_argument("--quiet", action="store_true")


def settings_from_args(args: argparse.Namespace) -> DemoSettings:
    return DemoSettings(
        dp=args.dp,
        cp=args.cp,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        data=args.data,
        samples_per_rank=args.samples_per_rank,
        max_tokens_per_rank=args.max_tokens_per_rank,
        min_seq_len=args.min_seq_len,
        mean_seq_len=args.mean_seq_len,
        max_seq_len=args.max_seq_len,
        d_model=args.d_model,
        pattern=args.pattern,
        cost=args.cost,
        fsdp_units=args.fsdp_units,
        threads=args.threads,
        seed=args.seed,
        port=args.port,
        json_out=args.json_out,
        quiet=args.quiet,
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"seqpack demo: {exc}", file=sys.stderr)
        return 2
    try:
        return launch(settings)
    except ValueError as exc:
        print(f"seqpack demo: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seqpack demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
