"""``seqpack doctor``: which compute paths this machine can run, and why not."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="report torch / CUDA / GPU, Transformer Engine, mamba_ssm, causal_conv1d and numba",
        description="Report the environment that decides seqpack's compute paths: torch, CUDA and the GPUs; "
        "Transformer Engine, mamba_ssm and causal_conv1d (installed version, whether each imports, the error "
        "if not); which backend backend='auto' picks for bf16 CUDA inputs; numba and its threading layer. "
        "See docs/gpu.md.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from seqpack.compute.backends import environment_report, format_environment_report

    report = environment_report()
    print(json.dumps(report, indent=1) if args.json else format_environment_report(report))
    return 0
