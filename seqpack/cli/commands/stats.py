"""``seqpack stats``: count, percentiles and attention's FLOPs share of a file of lengths."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from seqpack.cli.exit import CommandError
from seqpack.cli.length_sources import column_arg
from seqpack.schedulers.objective import exact_sum
from seqpack.validation import check_int

__all__ = ["PERCENTILES", "add_parser", "length_summary", "run"]

PERCENTILES = (1, 10, 25, 50, 75, 90, 99)
MAX_BINS = 100_000


def length_summary(lengths: Any, model: str | None = "llama3-8b") -> dict[str, Any]:
    """Count, tokens, mean, std, percentiles of ``lengths`` and, for a model preset, the
    share of training FLOPs spent in attention's quadratic term. Token counts are exact
    Python ints."""
    from seqpack.cost import model_preset

    arr = np.asarray(lengths, dtype=np.int64)
    tokens = exact_sum(arr)
    out: dict[str, Any] = {"count": int(arr.size), "tokens": tokens}
    if arr.size == 0:
        return out
    out.update(mean=tokens / arr.size, std=float(arr.std()), min=int(arr.min()), max=int(arr.max()))
    for q, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{q}"] = float(v)
    out["zeros"] = int(np.count_nonzero(arr == 0))
    if model:
        spec = model_preset(model)
        total = spec.sequence_flops(arr)  # every term, sliding-window layers included
        attention = total - spec.linear_flops * tokens  # the part that is not per token
        out["model"] = model
        out["train_flops"] = float(total)
        out["attention_share"] = attention / total if total else 0.0
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from seqpack.cost import DEFAULT_MODEL, MODEL_PRESETS

    p = subparsers.add_parser(
        "stats",
        help="summarize a file of sequence lengths",
        description="Count, mean, percentiles and attention's FLOPs share of the lengths in FILE.",
    )
    p.add_argument("file", metavar="FILE", help="CSV, Parquet, Arrow or JSONL file of lengths")
    p.add_argument("--column", help="length column (name or 0-based index)")
    p.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODEL_PRESETS) + ["none"])
    p.add_argument("--plot", metavar="FILE.png", help="draw a histogram (needs matplotlib: seqpack[plot])")
    p.add_argument("--bins", type=int, default=60, help="histogram bins (default 60)")
    p.add_argument("--json", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    from seqpack.cli import plots
    from seqpack.mock_data import lengths_from_file

    fmt = plots.DEFAULT_FORMAT
    if args.plot:
        check_int("--bins", args.bins, minimum=1, maximum=MAX_BINS)
        fmt = plots.plot_target("--plot", args.plot)
    lengths = lengths_from_file(args.file, column=column_arg(args.column))
    summary = length_summary(lengths, None if args.model == "none" else args.model)
    if args.plot:
        if not np.count_nonzero(lengths):
            raise CommandError(f"--plot: {args.file} holds no non-zero lengths to draw ({lengths.size} rows)")
        plots.histogram(lengths, args.plot, f"{args.file}: {lengths.size:,} sequences", args.bins, fmt=fmt)
    if args.json:
        print(json.dumps({"file": args.file, **summary}, indent=2))
        return 0
    print(f"{args.file}: {summary['count']:,} sequences, {summary['tokens']:,} tokens")
    if summary["count"]:
        print(
            f"  mean {summary['mean']:,.1f}  std {summary['std']:,.1f}  min {summary['min']:,}  max {summary['max']:,}"
        )
        print("  " + "  ".join(f"p{q} {summary[f'p{q}']:,.0f}" for q in PERCENTILES))
        if summary["zeros"]:
            print(f"  {summary['zeros']} zero-length samples")
        if "model" in summary:
            print(
                f"  {summary['model']}: {summary['train_flops'] / 1e12:,.1f} TFLOP to train on once; "
                f"attention's quadratic term is {100 * summary['attention_share']:.1f}% of it"
            )
    if args.plot:
        print(f"  histogram written to {args.plot}")
    return 0
