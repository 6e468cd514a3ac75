"""The ``seqpack`` command line: the only part of seqpack that prints.

- :mod:`~seqpack.cli.app`: the parser, the registry of subcommands, exit codes
- :mod:`~seqpack.cli.commands`: one module per subcommand (mock, stats, simulate, demo)
- :mod:`~seqpack.cli.demo`: the demo's settings, data, per-rank training and launcher
- :mod:`~seqpack.cli.flags`: flags derived from a settings dataclass
- :mod:`~seqpack.cli.length_sources`: lengths from a file, a config or a distribution
- :mod:`~seqpack.cli.files`, :mod:`~seqpack.cli.plots`, :mod:`~seqpack.cli.tables`,
  :mod:`~seqpack.cli.progress`: output paths, figures, tables, progress bars
- :mod:`~seqpack.cli.exit`: exit codes and the one-line error of a user's mistake
"""

from __future__ import annotations

from seqpack.cli.app import COMMANDS, build_parser, main
from seqpack.cli.commands.simulate import simulate
from seqpack.cli.commands.stats import length_summary
from seqpack.cli.exit import CommandError, ExitCode

__all__ = ["COMMANDS", "CommandError", "ExitCode", "build_parser", "length_summary", "main", "simulate"]
