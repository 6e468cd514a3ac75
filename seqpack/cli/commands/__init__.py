"""The subcommands of ``seqpack``, one module each (registered in :mod:`seqpack.cli.app`).

A command module exposes ``add_parser(subparsers) -> argparse.ArgumentParser`` and
``run(args) -> int`` (the exit status); it raises a :class:`~seqpack.errors.SeqpackError`
(or ``OSError``) for a user's mistake, which the dispatcher prints as one line, exit 2.
"""
