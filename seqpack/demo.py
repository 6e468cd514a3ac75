"""Moved to :mod:`seqpack.cli.demo` (the demo is a tool, not the library); this module keeps
the old import path and ``python -m seqpack.demo`` (e.g. under torchrun) working."""

from __future__ import annotations

import argparse
import sys

from seqpack._compat import warn_moved
from seqpack.cli.demo.data import load_dataset, padded_microbatches, rank_indices, sample_order
from seqpack.cli.demo.launch import MALLOC_ENV, launch, preflight
from seqpack.cli.demo.settings import COSTS, MODES, DemoSettings
from seqpack.cli.demo.train import calibrate_cost, measure_gemm_flops, resolve_cost, warm_up, worker
from seqpack.cli.options import add_options, from_args
from seqpack.cli.tables import format_demo_summary as format_summary

warn_moved(__name__, "seqpack.cli.demo", stacklevel=2)

__all__ = [
    "COSTS",
    "MALLOC_ENV",
    "MODES",
    "DemoSettings",
    "add_arguments",
    "calibrate_cost",
    "format_summary",
    "launch",
    "load_dataset",
    "main",
    "measure_gemm_flops",
    "padded_microbatches",
    "preflight",
    "rank_indices",
    "resolve_cost",
    "run",
    "sample_order",
    "settings_from_args",
    "warm_up",
    "worker",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``seqpack demo`` (one per :class:`DemoSettings` field)."""
    add_options(parser, DemoSettings)


def settings_from_args(args: argparse.Namespace) -> DemoSettings:
    return from_args(DemoSettings, args)


def run(args: argparse.Namespace) -> int:
    """``seqpack demo`` on parsed flags; a mistake is one line on stderr and status 2."""
    from seqpack.cli.app import run_command
    from seqpack.cli.commands import demo

    args.command, args._run = "demo", demo.run
    return run_command(args)


def main(argv: list[str] | None = None) -> int:
    """``python -m seqpack.demo [flags]``: the same as ``seqpack demo [flags]``."""
    from seqpack.cli.app import main as cli_main

    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
