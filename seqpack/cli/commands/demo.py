"""``seqpack demo``: train a tiny hybrid LM on packed, balanced batches across CPU ranks.

Its flags are the fields of :class:`~seqpack.cli.demo.settings.DemoSettings`, derived by
:mod:`seqpack.cli.flags`; the settings' ``__post_init__`` checks them.
"""

from __future__ import annotations

import argparse

import seqpack.cli.demo as demo_package
from seqpack.cli.demo.settings import DemoSettings
from seqpack.cli.flags import add_options, from_args

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="train a tiny hybrid LM on packed, balanced batches across CPU ranks (gloo, FSDP2)",
        description=demo_package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, DemoSettings)
    return p


def run(args: argparse.Namespace) -> int:
    from seqpack.cli.demo.launch import launch  # here: the demo trains with torch, the other commands need none

    return int(launch(from_args(DemoSettings, args)))
