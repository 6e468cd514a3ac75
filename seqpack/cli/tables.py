"""Tables the commands print, laid out by rich and returned as plain text (no colour codes,
so the output reads the same in a terminal, a CI log or a pipe)."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from seqpack.cli.demo.settings import DemoSettings

__all__ = ["format_demo_summary", "format_table", "render_table", "time_shared", "usable_cores"]


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` of preformatted cells under ``header``: the first column left-aligned, the
    others right-aligned, a rule under the header; no trailing blanks."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="")
    for index, name in enumerate(header):
        table.add_column(name, justify="left" if index == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    # Wide enough that rich never folds a column; lines are only as long as the table.
    Console(file=buffer, width=1000, color_system=None, force_terminal=False, soft_wrap=False).print(table)
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "─".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        text = text.replace("─", "-")  # an ASCII terminal or log: a plain rule
    return text


def format_table(report: dict[str, Any]) -> str:
    """The side-by-side table ``seqpack simulate`` prints."""
    header = (
        "scheduler", "microbatches", "replica/LB", "max", "round imb.", "(bound)", "pad %", "moved %", "MB/rank",
        "FLOP/step", "plan ms", "peak MB",
    )  # fmt: skip
    rows = []
    for name, r in report["results"].items():
        flops = f"{r['flops_per_step']:.3e}" if r["flops_per_step"] is not None else "-"
        rows.append(
            (
                name,
                f"{r['microbatches']:.1f} ({r['min_microbatches']:>3.0f})",
                f"{r['bound_ratio']:.4f}",
                f"{r['bound_ratio_max']:.4f}",
                f"{r['round_imbalance']:.4f}",
                f"{r['round_lower_bound']:.4f}",
                f"{100 * r['pad_fraction']:.2f}",
                f"{100 * r['moved_fraction']:.1f}",
                f"{r['rank_moved_bytes'] / 2**20:.2f}",
                flops,
                f"{1e3 * r['seconds_mean']:.2f}",
                f"{r['peak_bytes'] / 2**20:.0f}" if r.get("peak_bytes") is not None else "-",
            )
        )
    return render_table(header, rows)


def format_demo_summary(results: list[dict[str, Any]], settings: DemoSettings) -> str:
    """The summary ``seqpack demo`` prints after training: one row per mode, then notes."""
    by_mode = {r["mode"]: r for r in results}

    def versus(r: dict[str, Any], key: str, base: str) -> str:
        return f"{r[key] / by_mode[base][key]:.2f}x" if by_mode.get(base, {}).get(key) else "-"

    header = (
        "mode", "real tok/s", "vs padded", "vs dp_bal", "busy tok/s", "vs padded", "vs dp_bal", "pad %", "round imb",
        "mbs/step", "loss", "MFU",
    )  # fmt: skip
    rows = []
    for r in results:
        rimb = f"{r['round_imbalance']:.3f}" if r["round_imbalance"] is not None else "n/a"
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "-"
        rows.append(
            (
                str(r["mode"]),
                f"{r['tokens_per_s']:,.0f}",
                versus(r, "tokens_per_s", "padded"),
                versus(r, "tokens_per_s", "dp_balanced"),
                f"{r['busy_tokens_per_s']:,.0f}",
                versus(r, "busy_tokens_per_s", "padded"),
                versus(r, "busy_tokens_per_s", "dp_balanced"),
                f"{r['pad_fraction'] * 100:.1f}%",
                rimb,
                f"{r['microbatches_per_step']:.1f}",
                f"{r['first_loss']:.3f}->{r['last_loss']:.3f}",
                mfu,
            )
        )
    lines = [
        f"summary: dp={settings.dp} cp={settings.cp}, {settings.steps} measured steps after {settings.warmup_steps}"
        f" warm-up, {settings.samples_per_rank} samples per DP rank per step, data={settings.data}",
        render_table(header, rows),
    ]
    cores = usable_cores()
    shared = time_shared(settings.world_size, cores, results[0].get("load_average") if results else None)
    if shared:
        lines.append(
            f"note: {shared}, so a rank waiting on a slower peer hands its CPU time to the others and real tok/s "
            "understates what balance buys; busy tok/s does not depend on it"
        )
    lines.append(
        "real tok/s: wall clock; busy tok/s: per microbatch round the CPU time of the slowest rank, summed (what a "
        "step takes with a core per rank, whatever else runs); round imb: sum over microbatch rounds of the slowest "
        "replica / mean (what FSDP, which syncs every microbatch, waits for), in the scheduler's cost model"
    )
    for r in results:
        if r.get("cost_model") is not None:
            shared = time_shared(settings.world_size, cores, r.get("load_average"))
            lines.append(_online_cost_line(r, shared))
    peak = results[0].get("peak_gemm_flops_per_process") if results else None
    if peak:
        lines.append(
            f"MFU = model training FLOPs (seqpack.cost, real lengths) / (measured fp32 GEMM rate "
            f"{peak / 1e9:.1f} GFLOP/s per process x {min(settings.world_size, cores)} cores)"
        )
    return "\n".join(lines)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; all of the machine's without one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def time_shared(world: int, cores: int, load: float | None) -> str | None:
    """Why the ranks' wall-clock times include waiting for a core, or ``None``: more ranks
    than usable cores, or a 1-minute load average (taken at the end of the run, the ranks'
    own load included) above the cores."""
    if world > cores:
        return f"{world} ranks time-share {cores} cores"
    if load is not None and load > cores + 0.5:
        return f"the machine is time-shared (1-minute load average {load:.1f} on {cores} usable cores)"
    return None


def _online_cost_line(r: dict[str, Any], shared: str | None) -> str:
    """The calibrated model and how well it predicted the measured step times. When ranks
    share cores (``shared``: why, see :func:`time_shared`) the measured times include waiting
    for a core, so the error is no verdict on the model and the line says so before giving it."""
    lin, quad, const = r["cost_model"]
    err = r.get("prediction_error_mean_abs")
    checked = len(r.get("predictions") or [])
    head = (
        f"online cost ({r['mode']}): {lin:.4g}*s + {quad:.4g}*s^2 + {const:.4g} s per microbatch"
        f"{' (fitted)' if r.get('calibrated') else ' (prior: not enough timings yet)'}; "
    )
    if err is None:
        return head + "no step's prediction checked yet"
    measured = f"mean |error| {err * 100:.1f}% over {checked} steps" + _fitted_error(r)
    if shared:
        return head + (
            f"predicted vs measured step time is not a measure of the model here: {shared}, so every microbatch "
            f"time includes waiting for a core ({measured}); benchmarks/calibration.py measures the calibration's "
            "accuracy"
        )
    return (
        head
        + f"predicted vs measured step time (sum over rounds of the slowest replica's microbatch times): {measured}"
    )


def _fitted_error(result: dict) -> str:
    """The error of the steps scheduled with a fitted model, apart from those on the prior."""
    fitted = result.get("predicted_by_fitted") or 0
    checked = len(result.get("predictions") or [])
    if not checked or fitted == checked:
        return ""
    if fitted == 0:
        return " (all on the prior, measured once on an idle rank: run more --steps to see the fit take over)"
    return f", {result['prediction_error_fitted'] * 100:.1f}% over the {fitted} scheduled with a fitted model"
