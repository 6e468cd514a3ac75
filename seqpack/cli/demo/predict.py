"""What the demo's plans would take on GPUs, not measured here: the demo's length distribution
planned at ``--predict-dp`` GPUs by each mode's scheduler (``padded``: its fixed microbatches),
every microbatch priced by a cost model fitted to a GPU's measured microbatch times
(:data:`GPU_CLOCKS`; the clocks and their error: docs/demo.md); communication is not counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from seqpack.cli.demo.settings import GPU_CAPACITY, DemoSettings
from seqpack.cli.tables import render_table
from seqpack.cost import CostModel
from seqpack.schedulers import get_scheduler, predicted_step_time
from seqpack.thd import padded_lengths

__all__ = ["GPU_CLOCKS", "GpuClock", "gpu_lengths", "padded_step_time", "predict", "format_prediction"]


@dataclasses.dataclass(frozen=True)
class GpuClock:
    """One GPU's microbatch time (seconds) as a fitted cost model, and where it was measured."""

    name: str
    cost: CostModel
    pad_multiple: int
    source: str


# CostModel.fit of the measured microbatches (tests/cli/test_demo.py refits them from the sources).
GPU_CLOCKS = (
    GpuClock(
        "H100",
        CostModel(4.6696015982736277e-07, 8.40760215946689e-11, 0.023741644054740954),
        8,
        "320 microbatches, h2048x4 of /work/shared/data/h100_te_clock.json",
    ),
    GpuClock(
        "H200",
        CostModel(1.2676427373048824e-06, 8.590177983511176e-11, 0.009420464371205766),
        16,
        "16 packs, benchmarks/results/gpu/h200_2026-11-28/gpu_step_transformer.json",
    ),
)


def gpu_samples_per_rank(settings: DemoSettings) -> int:
    """Samples per GPU per step: as many microbatches' worth as a CPU rank reads."""
    return max(1, settings.samples_per_rank * GPU_CAPACITY // (settings.max_tokens_per_rank * settings.cp))


def gpu_lengths(settings: DemoSettings) -> np.ndarray:
    """int64 ``[steps, predict_dp * samples per GPU]``: global batches of the demo's lengths
    (mock: drawn from its lognormal; a corpus: drawn from its documents' lengths)."""
    from seqpack.cli.demo.data import load_dataset, mock_lengths

    shape = (settings.steps, settings.predict_dp * gpu_samples_per_rank(settings))
    if settings.data == "mock":
        return mock_lengths(settings, shape[0] * shape[1]).reshape(shape)
    dataset, _ = load_dataset(settings)
    return np.random.default_rng(settings.seed).choice(dataset.lengths(), size=shape).astype(np.int64)


def padded_step_time(lengths: np.ndarray, dp: int, per_microbatch: int, clock: GpuClock) -> tuple[float, int]:
    """(lockstep seconds, microbatches per replica) of the ``padded`` mode on one global batch:
    each replica's samples in fixed microbatches of ``per_microbatch``, every sequence padded
    to the longest of its microbatch (pads computed)."""
    per_replica = lengths.size // dp
    rounds = -(-per_replica // per_microbatch)
    grid = np.zeros((dp, rounds * per_microbatch), dtype=np.int64)
    grid[:, :per_replica] = lengths.reshape(dp, per_replica)
    packs = grid.reshape(dp, rounds, per_microbatch)  # [dp, M, b]; 0: no sequence
    longest = padded_lengths(packs.max(axis=2).ravel(), clock.pad_multiple).reshape(dp, rounds)
    seconds = clock.cost.constant + (packs > 0).sum(axis=2) * clock.cost.cost(longest)  # [dp, M]
    return float(seconds.max(axis=0).sum()), rounds


def predict(settings: DemoSettings) -> list[dict[str, Any]]:
    """Per GPU clock and mode: microbatches per step and the predicted lockstep step time,
    means over ``settings.steps`` global batches at ``settings.predict_dp`` GPUs."""
    batches = gpu_lengths(settings)
    dp = settings.predict_dp
    rows = []
    for clock in GPU_CLOCKS:
        for mode in settings.modes:
            seconds, mbs = [], []
            for lengths in batches:
                if mode == "padded":
                    t, m = padded_step_time(lengths, dp, max(1, GPU_CAPACITY // settings.max_seq_len), clock)
                else:
                    plan = get_scheduler(mode).schedule(
                        lengths,
                        dp_size=dp,
                        max_tokens_per_rank=GPU_CAPACITY,
                        pad_multiple=clock.pad_multiple,
                        cost=clock.cost,
                        sync="lockstep",
                    )
                    t, m = predicted_step_time(plan, clock.cost), plan.num_microbatches
                seconds.append(t)
                mbs.append(m)
            rows.append(
                {
                    "gpu": clock.name,
                    "mode": str(mode),
                    "microbatches": float(np.mean(mbs)),
                    "step_s": float(np.mean(seconds)),
                }
            )
    return rows


def format_prediction(rows: list[dict[str, Any]], settings: DemoSettings) -> str:
    """The prediction table, headed by what it is and is not."""
    step = {(r["gpu"], r["mode"]): r["step_s"] for r in rows}

    def versus(r: dict[str, Any], base: str) -> str:
        other = step.get((r["gpu"], base))
        return f"{other / r['step_s']:.2f}x" if other else "-"

    table = render_table(
        ("gpu", "mode", "mbs/step", "step ms", "vs dp_bal", "vs padded"),
        [
            (r["gpu"], r["mode"], f"{r['microbatches']:.1f}", f"{r['step_s'] * 1e3:,.1f}")
            + (versus(r, "dp_balanced"), versus(r, "padded"))
            for r in rows
        ],
    )
    sources = "; ".join(f"{c.name}: {c.source}" for c in GPU_CLOCKS)
    return (
        f"predicted, not measured: the same length distribution on dp={settings.predict_dp} GPUs, "
        f"{gpu_samples_per_rank(settings)} samples per GPU per step, {GPU_CAPACITY:,} tokens per microbatch, "
        f"lockstep (FSDP) step time, mean of {settings.steps} global batches; each microbatch priced by a fit to "
        "forward+backward times of 4 TE TransformerLayers (hidden 2048, bf16) measured on one GPU, no "
        f"communication (--predict-dp 0: skip)\n{table}\nclocks: {sources}"
    )
