"""Figures of ``seqpack stats --plot`` and ``seqpack simulate --plot`` (matplotlib, optional).

:func:`plot_target` is called before any work: it checks that matplotlib is installed, that
the path can be written and names a format matplotlib writes. The figure is then saved to
exactly that path (matplotlib alone would append ``.png`` to a name without an extension).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seqpack.cli.exit import CommandError
from seqpack.cli.files import check_output_file

__all__ = ["histogram", "plot_target", "replica_loads"]

DEFAULT_FORMAT = "png"


def plot_target(flag: str, path: str) -> str:
    """The format to write ``path`` in (its extension, or PNG without one).

    Raises:
        CommandError: matplotlib is missing, ``path`` is a directory or in a missing
            directory, or its extension is a format matplotlib does not write.
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as err:
        raise CommandError(f"{flag} needs matplotlib ({err}); pip install 'seqpack[plot]'") from None
    check_output_file(flag, path)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        return DEFAULT_FORMAT
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext not in formats:
        raise CommandError(
            f"{flag} {path!r}: matplotlib cannot write .{ext} files; use one of .{', .'.join(sorted(formats))}"
        )
    return ext


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def histogram(lengths: np.ndarray, path: str, title: str, bins: int, fmt: str = DEFAULT_FORMAT) -> None:
    """Histogram of the non-zero ``lengths`` (log-spaced bins when they span > 50x), with the
    median, p99 and mean marked."""
    plt = _pyplot()
    arr = lengths[lengths > 0]
    assert arr.size, "the caller refuses lengths with nothing to plot"
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    log = bool(arr.max() / max(arr.min(), 1) > 50)
    edges = np.geomspace(max(float(arr.min()), 1.0), float(arr.max()) + 1.0, bins + 1) if log else bins
    ax.hist(arr, bins=edges, color="#4C72B0", edgecolor="white", linewidth=0.4)
    if log:
        ax.set_xscale("log")
    for q, style in ((50, "--"), (99, ":")):
        v = np.percentile(arr, q)
        ax.axvline(v, color="#C44E52", linestyle=style, linewidth=1.2, label=f"p{q} = {v:,.0f}")
    ax.axvline(arr.mean(), color="#55A868", linestyle="-", linewidth=1.2, label=f"mean = {arr.mean():,.0f}")
    ax.set_xlabel("sequence length (tokens)" + (", log scale" if log else ""))
    ax.set_ylabel("sequences")
    ax.set_title(title)
    ax.legend(frameon=False)
    ax.grid(alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)


def replica_loads(report: dict[str, Any], path: str, fmt: str = DEFAULT_FORMAT) -> None:
    """Per-replica load of step 0 for each scheduler of a ``simulate(..., keep_first=True)``
    report, relative to the lower bound."""
    from seqpack.cost import CostModel
    from seqpack.schedulers.objective import microbatch_costs

    plt = _pyplot()
    cfg = report["config"]
    cost = CostModel(**cfg["cost"])
    names = list(report["results"])
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.4 * len(names) + 0.8), dpi=120, sharex=True, squeeze=False)
    dp = cfg["dp_size"]
    x = np.arange(dp)
    ymax = 1.0
    for name in names:
        _, st = report["results"][name]["first"]
        ymax = max(ymax, max(st.replica_cost) / st.lower_bound)
    for ax, name in zip(axes[:, 0], names, strict=True):
        schedule, st = report["results"][name]["first"]
        costs = microbatch_costs(schedule, cost) / st.lower_bound  # [M, dp]
        m_count = costs.shape[0]
        if dp <= 128 and m_count <= 64:
            bottom = np.zeros(dp)
            colors = plt.cm.viridis(np.linspace(0.1, 0.9, max(m_count, 1)))
            for m in range(m_count):
                ax.bar(x, costs[m], bottom=bottom, width=0.85, color=colors[m], linewidth=0)
                bottom += costs[m]
        else:
            ax.fill_between(x, costs.sum(axis=0), step="mid", color="#4C72B0", alpha=0.8, linewidth=0)
        ax.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1.0)
        ax.set_ylim(0, ymax * 1.08)
        ax.set_ylabel("load / bound")
        ax.set_title(
            f"{name}: {m_count} microbatches, busiest replica {st.bound_ratio:.3f} x bound, "
            f"rounds {st.round_imbalance:.3f} x ideal",
            fontsize=10,
            loc="left",
        )
        ax.grid(axis="y", alpha=0.25)
    axes[-1, 0].set_xlabel(
        "DP replica" + ("  (bar segments: microbatch 0, 1, ... from the bottom)" if dp <= 128 else "")
    )
    fig.suptitle(
        f"Per-replica cost of step 0, dp={dp} cp={cfg['cp_size']}, capacity {cfg['capacity']:,} tokens, "
        f"model {cfg['model'] or 'tokens'}; dashed: max(total/dp, largest sequence)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)
