"""Step time of a real model's microbatches on one GPU, under each scheduler (issue 14).

One global batch of lognormal SFT lengths for ``--dp`` replicas is scheduled four ways:

- ``balanced (FLOPs)``: seqpack's balanced scheduler with the model's training-FLOPs cost;
- ``balanced (fitted)``: the same with a cost fitted on this device (``CostModel.fit`` on
  timed calibration packs); when the fit raises, the error is reported and the row skipped;
- ``dp_balanced``: Megatron's next-fit packing;
- ``padded``: no packing: each replica's own samples in order, ``capacity // max_len`` per
  microbatch, each padded to the microbatch's longest (rounded up to ``--bshd-multiple``), run
  as BSHD with a causal mask on TE layers (pads computed as real, as in padded training).

Every microbatch of every replica then runs forward + backward of the model's layers on this
one device, one after another, each timed alone (CUDA events; ``--warmup`` untimed runs of
that same microbatch first; the median of ``--repeats``). Identical microbatches (same padded
lengths) are timed once. Per scheduler it reports the step time in lockstep mode (sum over
rounds of the slowest replica: FSDP / pipeline) and replica mode (the slowest replica's total:
DDP), microbatches per replica, real tokens/s, and ratios against dp_balanced and padded.

Models: ``transformer``: ``--layers`` TE ``TransformerLayer``s (RMSNorm, SwiGLU, GQA, bf16);
``hybrid``: ``--pattern`` of Mamba2 blocks (``M``: RMSNorm + ``seqpack`` Mamba2Mixer) and TE
layers (``A``). Without CUDA / TE (or ``--attention torch``) the attention layers are seqpack's
torch reference (``ThdAttention``) with a SwiGLU MLP. ``--toy`` runs tiny sizes on the CPU in
seconds (tests/compute/test_gpu_step_bench.py runs it so CI exercises this file).

    python3 benchmarks/gpu_step.py --model transformer --out results/gpu_step_transformer.txt
    python3 benchmarks/gpu_step.py --model hybrid --json results/gpu_step_hybrid.json
    python3 benchmarks/gpu_step.py --toy
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from seqpack.compute import backends
from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.cost import CostModel, ModelSpec
from seqpack.mock_data import lognormal_lengths
from seqpack.schedulers import get_scheduler
from seqpack.thd import PackedBatch, pack_sequences, padding_only_batch
from seqpack.validation import memory_limit


@dataclasses.dataclass
class Settings:
    """Defaults: the GPU run (about a minute per model on an H100 after warm-up)."""

    model: str = "transformer"  # "transformer" or "hybrid"
    layers: int = 4  # transformer: TE TransformerLayers
    pattern: str = "MAMA"  # hybrid: M = Mamba2 block, A = TE TransformerLayer (attention + MLP)
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 4
    ffn: int = 5632
    d_state: int = 128
    mamba_headdim: int = 64
    mamba_groups: int = 8
    dp: int = 8
    samples_per_rank: int = 64
    max_tokens_per_rank: int = 16384
    pad_multiple: int = 16  # packed sequences: a multiple of 16 keeps Triton/cuDNN shapes few
    bshd_multiple: int = 256  # padded baseline: sequence length rounded up to this (few shapes: few cuDNN plans)
    mean_len: int = 1024
    min_len: int = 16
    max_len: int = 8192
    sigma: float = 1.1
    seed: int = 0
    warmup: int = 1
    repeats: int = 2
    calib_packs: int = 16
    sync: str = "lockstep"  # what the schedulers plan for (Scheduler.schedule(sync=)): "lockstep" or "replica"
    device: str = "auto"  # "auto" (cuda when available), "cuda", "cpu"
    attention: str = "auto"  # "auto" (TE when it imports on CUDA), "te", "torch"
    mamba: str = "auto"  # Mamba2Mixer backend: "auto", "mamba_ssm", "torch"
    threads: int = 0  # torch CPU threads during the run (0: leave as is); 1 keeps CPU timings steady on shared cores


TOY = dict(
    layers=2, pattern="MA", hidden=64, heads=4, kv_heads=2, ffn=128, d_state=16, mamba_headdim=16, mamba_groups=1,
    dp=2, samples_per_rank=8, max_tokens_per_rank=256, pad_multiple=4, bshd_multiple=4, mean_len=40, min_len=2,
    max_len=128, warmup=1, repeats=1, calib_packs=6, device="cpu", threads=1,
)  # fmt: skip


# --- the timed model --------------------------------------------------------------------------


@dataclasses.dataclass
class Microbatch:
    """One replica's microbatch, ready on the device."""

    key: tuple  # identical keys are identical work: timed once
    batch: PackedBatch
    real_tokens: int
    te_kwargs: dict[str, Any]
    bshd: tuple[int, int] | None = None  # (sequences, padded length) for the padded baseline


class TorchAttentionLayer(nn.Module):
    """RMSNorm -> QKV -> seqpack ThdAttention -> proj -> residual -> RMSNorm -> SwiGLU -> residual."""

    def __init__(self, s: Settings, backend: str, device: torch.device, dtype: torch.dtype):
        super().__init__()
        f: dict[str, Any] = {"device": device, "dtype": dtype}
        self.head_dim = s.hidden // s.heads
        self.split = [s.hidden, s.kv_heads * self.head_dim, s.kv_heads * self.head_dim]
        self.norm1, self.norm2 = nn.RMSNorm(s.hidden, **f), nn.RMSNorm(s.hidden, **f)
        self.qkv = nn.Linear(s.hidden, sum(self.split), bias=False, **f)
        self.attn = ThdAttention(s.heads, self.head_dim, s.kv_heads, backend=backend)
        self.proj = nn.Linear(s.hidden, s.hidden, bias=False, **f)
        self.up = nn.Linear(s.hidden, 2 * s.ffn, bias=False, **f)
        self.down = nn.Linear(s.ffn, s.hidden, bias=False, **f)

    def forward(self, x: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = (y.reshape(t, -1, self.head_dim) for y in self.qkv(self.norm1(x)).split(self.split, dim=-1))
        x = x + self.proj(self.attn(q, k, v, mb.batch).reshape(t, -1))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TeAttentionLayer(nn.Module):
    """A TE TransformerLayer on THD packs, and a BSHD twin with the same weights for the padded baseline."""

    def __init__(self, s: Settings, number: int, device: torch.device, dtype: torch.dtype):
        super().__init__()
        import transformer_engine.pytorch as te

        def layer(input_format: str, mask: str) -> nn.Module:
            return te.TransformerLayer(
                s.hidden, s.ffn, s.heads, num_gqa_groups=s.kv_heads, hidden_dropout=0.0, attention_dropout=0.0,
                self_attn_mask_type=mask, attn_input_format=input_format, normalization="RMSNorm",
                activation="swiglu", bias=False, params_dtype=dtype, device=device, layer_number=number,
            )  # fmt: skip

        self.thd = layer("thd", "padding_causal")
        self.bshd = layer("bshd", "causal")
        self.bshd.load_state_dict(self.thd.state_dict())

    def forward(self, x: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        if mb.bshd is not None:
            b, s = mb.bshd
            return self.bshd(x.view(b, s, -1)).reshape(b * s, -1)
        return self.thd(x, self_attn_mask_type="padding_causal", **mb.te_kwargs)


class MambaLayer(nn.Module):
    """RMSNorm -> seqpack Mamba2Mixer (state restarts at every packed sequence) -> residual."""

    def __init__(self, s: Settings, backend: str, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.norm = nn.RMSNorm(s.hidden, device=device, dtype=dtype)
        self.mixer = Mamba2Mixer(
            s.hidden, d_state=s.d_state, headdim=s.mamba_headdim, ngroups=s.mamba_groups, backend=backend,
            device=device, dtype=dtype,
        )  # fmt: skip

    def forward(self, x: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        return x + self.mixer(self.norm(x), mb.batch)


class Stack(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mb)
        return x


def build_model(s: Settings, device: torch.device, dtype: torch.dtype) -> tuple[Stack, str, ModelSpec]:
    """The layers, a description, and the ModelSpec whose FLOPs give the balanced scheduler's cost."""
    use_te = s.attention == "te" or (
        s.attention == "auto" and device.type == "cuda" and backends.import_te_attention().ok
    )
    kinds = "A" * s.layers if s.model == "transformer" else s.pattern
    torch.manual_seed(s.seed)
    layers: list[nn.Module] = []
    for i, kind in enumerate(kinds):
        if kind == "M":
            layers.append(MambaLayer(s, s.mamba, device, dtype))
        elif use_te:
            layers.append(TeAttentionLayer(s, i + 1, device, dtype))
        else:
            layers.append(TorchAttentionLayer(s, "torch" if s.attention == "auto" else s.attention, device, dtype))
    attention = "TE TransformerLayer" if use_te else "torch reference attention + SwiGLU"
    mamba = f"Mamba2Mixer(d_state={s.d_state}, headdim={s.mamba_headdim}, ngroups={s.mamba_groups}, backend={s.mamba})"
    description = f"{kinds}: A = {attention} (h{s.hidden}, heads {s.heads}/{s.kv_heads}, ffn {s.ffn})"
    if "M" in kinds:
        description += f", M = RMSNorm + {mamba}"
    pattern = "".join("*-" if kind == "A" else "M" for kind in kinds)
    spec = ModelSpec(
        s.hidden, len(pattern), s.heads, s.ffn, num_query_groups=s.kv_heads, hybrid_layer_pattern=pattern,
        mamba_state_dim=s.d_state, mamba_head_dim=s.mamba_headdim, mamba_num_groups=s.mamba_groups,
    )  # fmt: skip
    return Stack(layers), description + f", {dtype}", spec


# --- microbatches and timing ------------------------------------------------------------------


def padded_len(n: int, multiple: int) -> int:
    return -(-int(n) // multiple) * multiple


def packed_microbatch(lengths: Sequence[int], s: Settings, device: torch.device) -> Microbatch:
    if len(lengths) == 0:  # a replica with nothing this round runs a padding-only filler (as the wrapper does)
        batch = padding_only_batch(s.pad_multiple)
    else:
        batch = pack_sequences([{"input_ids": torch.zeros(int(n), dtype=torch.long)} for n in lengths],
                               pad_multiple=s.pad_multiple)  # fmt: skip
    key = ("thd", tuple(padded_len(n, s.pad_multiple) for n in lengths), tuple(int(n) for n in lengths))
    batch = batch.to(device)
    return Microbatch(key, batch, int(sum(lengths)), batch.te_kwargs(include_format=False))


def padded_microbatch(lengths: Sequence[int], s: Settings, device: torch.device) -> Microbatch:
    width = padded_len(max(lengths), s.bshd_multiple)
    batch = pack_sequences([{"input_ids": torch.zeros(int(n), dtype=torch.long)} for n in lengths], pad_multiple=width)
    batch = dataclasses.replace(batch, cu_seqlens=batch.cu_seqlens_padded).to(device)  # pads computed as real
    return Microbatch(("bshd", len(lengths), width), batch, int(sum(lengths)), batch.te_kwargs(include_format=False),
                      bshd=(len(lengths), width))  # fmt: skip


class Timer:
    """Forward + backward of ``model`` on one microbatch, timed alone after warm-up runs."""

    def __init__(self, model: Stack, s: Settings, device: torch.device, dtype: torch.dtype):
        self.model, self.s, self.device, self.dtype = model, s, device, dtype
        self.cache: dict[tuple, float] = {}
        self.runs = 0

    def _step(self, x: torch.Tensor, mb: Microbatch) -> None:
        self.model(x, mb).float().square().mean().backward()
        self.runs += 1

    def seconds(self, mb: Microbatch) -> float:
        if mb.key in self.cache:
            return self.cache[mb.key]
        x = torch.randn(mb.batch.num_tokens, self.s.hidden, device=self.device, dtype=self.dtype)
        for _ in range(self.s.warmup):
            self._step(x, mb)
        times = []
        for _ in range(self.s.repeats):
            self.model.zero_grad(set_to_none=False)  # outside the timed region; the step accumulates as in training
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                self._step(x, mb)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                begin = time.perf_counter()
                self._step(x, mb)
                times.append(time.perf_counter() - begin)
        self.cache[mb.key] = statistics.median(times)
        return self.cache[mb.key]


# --- schedules -------------------------------------------------------------------------------


def schedule_cells(name: str, lengths: np.ndarray, s: Settings, cost: CostModel | None) -> list[list[list[int]]]:
    """``cells[m][d]``: the lengths packed into microbatch ``m`` of replica ``d``."""
    schedule = get_scheduler(name).schedule(
        lengths, dp_size=s.dp, max_tokens_per_rank=s.max_tokens_per_rank, pad_multiple=s.pad_multiple, cost=cost,
        sync=s.sync,
    )  # fmt: skip
    if schedule.deferred.size or schedule.dropped.size:
        raise SystemExit(f"{name} deferred or dropped sequences; this benchmark expects every sequence scheduled")
    return [[lengths[ids].tolist() for ids in row] for row in schedule.assignment]


def padded_cells(lengths: np.ndarray, s: Settings) -> list[list[list[int]]]:
    """No packing: replica ``d`` runs its own samples in order, ``capacity // max_len`` per microbatch."""
    per_mb = max(1, s.max_tokens_per_rank // s.max_len)
    own = lengths.reshape(s.dp, s.samples_per_rank)
    rounds = -(-s.samples_per_rank // per_mb)
    return [[own[d, m * per_mb : (m + 1) * per_mb].tolist() for d in range(s.dp)] for m in range(rounds)]


@dataclasses.dataclass
class Result:
    name: str
    seconds: list[list[float]]  # [m][d]
    real_tokens: int
    packs: int

    @property
    def lockstep(self) -> float:
        return float(sum(max(row) for row in self.seconds))

    @property
    def replica(self) -> float:
        return float(max(sum(col) for col in zip(*self.seconds, strict=True)))


def run_cells(name: str, cells, make: Callable, timer: Timer, s: Settings, device: torch.device) -> Result:
    seconds = [[timer.seconds(make(cell, s, device)) for cell in row] for row in cells]
    real = int(sum(sum(cell) for row in cells for cell in row))
    return Result(name, seconds, real, sum(len(row) for row in cells))


def calibration_packs(s: Settings) -> list[list[int]]:
    """Packs from empty-ish to full, mixed and single-sequence, for fitting the cost on this device."""
    rng = np.random.default_rng(s.seed + 1)
    pool = lognormal_lengths(4096, min_seq_len=s.min_len, max_seq_len=s.max_len, mean_seq_len=s.mean_len,
                             sigma=s.sigma, seed=s.seed + 1).tolist()  # fmt: skip
    packs = []
    for i in range(s.calib_packs):
        target = s.max_tokens_per_rank * (i + 1) / s.calib_packs
        if i % 4 == 3:  # one long sequence: the quadratic term's best witness
            packs.append([int(min(s.max_len, max(s.min_len, target)))])
            continue
        pack: list[int] = []
        while True:
            n = int(pool[int(rng.integers(len(pool)))])
            if sum(padded_len(m, s.pad_multiple) for m in pack) + padded_len(n, s.pad_multiple) > target:
                break
            pack.append(n)
        packs.append(pack or [int(min(target, s.max_len))])
    return packs


# --- the run ----------------------------------------------------------------------------------


def fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def run(s: Settings) -> tuple[str, dict[str, Any]]:
    """Run the benchmark; return (text report, JSON-able dict)."""
    wall = time.perf_counter()
    device = torch.device("cuda" if s.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if s.device == "auto" else s.device))  # fmt: skip
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    env = backends.environment_report()
    model, description, spec = build_model(s, device, dtype)
    timer = Timer(model, s, device, dtype)
    n = s.dp * s.samples_per_rank
    lengths = lognormal_lengths(n, min_seq_len=s.min_len, max_seq_len=s.max_len, mean_seq_len=s.mean_len,
                                sigma=s.sigma, seed=s.seed)  # fmt: skip

    # Warm-up: one full pack first (Triton autotuning, cuDNN plans), untimed.
    warm = packed_microbatch(calibration_packs(s)[-2], s, device)
    for _ in range(2):
        timer._step(torch.randn(warm.batch.num_tokens, s.hidden, device=device, dtype=dtype), warm)

    calib = calibration_packs(s)
    calib_seconds = [timer.seconds(packed_microbatch(pack, s, device)) for pack in calib]
    calib_padded = [[padded_len(m, s.pad_multiple) for m in pack] for pack in calib]
    fit: dict[str, Any]
    try:
        fitted = CostModel.fit(calib_padded, calib_seconds)
        predicted = np.array([fitted.microbatch_cost(p) for p in calib_padded])
        worst = float(np.max(np.abs(predicted - calib_seconds) / np.asarray(calib_seconds)))
        fit = {"linear": fitted.linear, "quadratic": fitted.quadratic, "constant": fitted.constant,
               "worst_relative_error": worst}  # fmt: skip
    except Exception as exc:  # reported as it is: CostModel.fit's robustness is not this benchmark's job
        fitted, fit = None, {"error": f"{type(exc).__name__}: {exc}"}

    flops_cost = spec.cost_model()
    runs: list[tuple[str, Callable[[], Any], Callable]] = [
        ("balanced (FLOPs)", lambda: schedule_cells("balanced", lengths, s, flops_cost), packed_microbatch),
        ("balanced (fitted)", lambda: schedule_cells("balanced", lengths, s, fitted), packed_microbatch),
        ("dp_balanced", lambda: schedule_cells("dp_balanced", lengths, s, flops_cost), packed_microbatch),
        ("padded", lambda: padded_cells(lengths, s), padded_microbatch),
    ]
    results: dict[str, Result] = {}
    for name, cells, make in runs:
        if name == "balanced (fitted)" and fitted is None:
            continue
        results[name] = run_cells(name, cells(), make, timer, s, device)

    report = _text(s, env, device, dtype, description, lengths, calib, calib_seconds, fit, results, wall)
    data = {
        "settings": dataclasses.asdict(s),
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": str(dtype),
        "model": description,
        "environment": env,
        "lengths": {
            "count": int(n),
            "sum": int(lengths.sum()),
            "mean": float(lengths.mean()),
            "max": int(lengths.max()),
            "sum_sq": int((lengths.astype(np.int64) ** 2).sum()),
        },  # fmt: skip
        "calibration": {"packs": calib, "seconds": calib_seconds, "fit": fit},
        "schedulers": {
            name: {
                "microbatches": len(r.seconds),
                "packs": r.packs,
                "seconds": r.seconds,
                "lockstep_s": r.lockstep,
                "replica_s": r.replica,
                "real_tokens": r.real_tokens,
                "tokens_per_s_lockstep": r.real_tokens / r.lockstep,
                "tokens_per_s_replica": r.real_tokens / r.replica,
            }
            for name, r in results.items()
        },
        "timed_runs": timer.runs,
        "wall_s": time.perf_counter() - wall,
    }
    return report, data


def _text(s, env, device, dtype, description, lengths, calib, calib_seconds, fit, results, wall) -> str:
    t = env["torch"]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    packages = ", ".join(f"{k} {v['version']}" for k, v in env["packages"].items() if v["imports"]) or "none"
    lines = [
        f"gpu_step: {where}; torch {t['version']} (CUDA {t['cuda'] or 'none'}); fast paths imported: {packages}",
        f"model: {description}",
        f"global batch: dp={s.dp} x {s.samples_per_rank} samples = {lengths.size} sequences, {int(lengths.sum()):,} "
        f"real tokens, lognormal mean {s.mean_len} sigma {s.sigma} clipped [{s.min_len}, {s.max_len}] "
        f"(seed {s.seed}); capacity {s.max_tokens_per_rank:,} tokens per microbatch, pad multiple {s.pad_multiple}",
        f"balanced schedules for sync={s.sync!r} (Scheduler.schedule(sync=...): the step time it minimises)",
        f"timing: forward+backward per microbatch, alone, {'CUDA events' if device.type == 'cuda' else 'perf_counter'}"
        f", {s.warmup} warm-up run(s) then the median of {s.repeats}; identical microbatches timed once",
    ]
    if "error" in fit:
        lines.append(f"calibration: {len(calib)} packs timed; CostModel.fit raised {fit['error']} "
                     "-> no 'balanced (fitted)' row")  # fmt: skip
    else:
        lines.append(
            f"calibration: {len(calib)} packs ({min(calib_seconds) * 1e3:.1f}..{max(calib_seconds) * 1e3:.1f} ms); "
            f"fitted cost = {fit['constant']:.3e} s + {fit['linear']:.3e} s*S + {fit['quadratic']:.3e} s*SS, "
            f"worst relative error on the packs {fit['worst_relative_error']:.1%}"
        )
    lines.append("")
    header = (f"{'scheduler':<19}{'mb/rep':>7}{'packs':>7}{'lockstep s':>12}{'replica s':>11}{'tok/s lock':>12}"
              f"{'tok/s repl':>12}{'vs dp_bal (L/R)':>17}{'vs padded (L/R)':>17}")  # fmt: skip
    lines += [header, "-" * len(header)]
    dp, padded = results.get("dp_balanced"), results.get("padded")
    for name, r in results.items():
        vs_dp = f"{fmt_ratio(dp.lockstep, r.lockstep)}/{fmt_ratio(dp.replica, r.replica)}" if dp else "-"
        vs_pad = f"{fmt_ratio(padded.lockstep, r.lockstep)}/{fmt_ratio(padded.replica, r.replica)}" if padded else "-"
        lines.append(
            f"{name:<19}{len(r.seconds):>7}{r.packs:>7}{r.lockstep:>12.4f}{r.replica:>11.4f}"
            f"{r.real_tokens / r.lockstep:>12,.0f}{r.real_tokens / r.replica:>12,.0f}{vs_dp:>17}{vs_pad:>17}"
        )
    lines += [
        "",
        "lockstep: sum over microbatch rounds of the slowest replica (FSDP / pipeline); replica: the slowest "
        "replica's total (DDP). Ratios > 1 mean this scheduler's step is shorter.",
        f"wall time {time.perf_counter() - wall:.1f} s",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true", help="tiny sizes on the CPU (seconds)")
    parser.add_argument("--out", type=Path, help="write the text report here too")
    parser.add_argument("--json", type=Path, help="write the full results as JSON here")
    for field in dataclasses.fields(Settings):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=None, help=f"default {field.default!r}")
    args = parser.parse_args(argv)
    values = dataclasses.asdict(Settings())
    if args.toy:
        values.update(TOY)
    values.update({k: v for k, v in vars(args).items() if k in values and v is not None})
    s = Settings(**values)
    if s.model not in ("transformer", "hybrid") or set(s.pattern) - {"A", "M"}:
        parser.error(f"--model must be transformer or hybrid and --pattern letters A/M, got {s.model!r}, {s.pattern!r}")
    if not args.toy and s.device == "auto" and not torch.cuda.is_available():
        # Full-size models on a CPU grow to tens of GB and run for hours: ask before doing it.
        parser.error(
            "no CUDA device here: the default sizes are for a GPU; run with --toy (tiny sizes on the CPU, "
            "seconds), or pass --device cpu with sizes of your own"
        )
    _check_device(parser, s)
    return s, args


def cpu_bytes(s: Settings) -> int:
    """A lower estimate of the memory one CPU run needs: fp32 weights and gradients, and the
    activations one full microbatch keeps for the backward pass (norms, q/k/v, attention
    output, projection, the MLP's up and gated halves; attention scores left out)."""
    layers = s.layers if s.model == "transformer" else len(s.pattern)
    kv = 2 * s.kv_heads * (s.hidden // s.heads)
    params = layers * (s.hidden * (2 * s.hidden + kv) + 3 * s.hidden * s.ffn)
    activations = layers * s.max_tokens_per_rank * (6 * s.hidden + kv + 3 * s.ffn)
    return 4 * (2 * params + activations)


def _check_device(parser: argparse.ArgumentParser, s: Settings) -> None:
    """Refuse a device this machine lacks, or CPU sizes that cannot fit in its memory (a
    full-size model on a CPU grew to 24 GB and was killed), before anything is built."""
    if s.device != "auto":
        try:
            device = torch.device(s.device)
        except (RuntimeError, TypeError, ValueError):
            parser.error(f"--device must be auto, cpu, cuda or cuda:N, got {s.device!r}")
        if device.type not in ("cpu", "cuda"):
            parser.error(f"--device must be auto, cpu, cuda or cuda:N, got {s.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            parser.error(f"--device {s.device} but no CUDA device here: run with --toy, or --device cpu with sizes "
                         "of your own")  # fmt: skip
    on_cpu = s.device == "cpu" or (s.device == "auto" and not torch.cuda.is_available())
    need, limit = cpu_bytes(s), memory_limit()
    if on_cpu and limit is not None and need > limit:
        parser.error(
            f"--device cpu: these sizes need at least {need / 2**30:.1f} GiB (weights, gradients and one "
            f"{s.max_tokens_per_rank}-token microbatch's activations), more than the {limit / 2**30:.1f} GiB this "
            "process may use; run with --toy, or lower --max-tokens-per-rank, --hidden, --ffn or --layers"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    s, args = parse_args(argv)
    threads = torch.get_num_threads()
    if s.threads:
        torch.set_num_threads(s.threads)
    try:
        text, data = run(s)
    finally:
        torch.set_num_threads(threads)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
