"""The subcommands of ``seqpack``, one module each.

A command module exposes ``add_parser(subparsers) -> argparse.ArgumentParser`` (its flags,
help and description) and ``run(args) -> int`` (the exit status). It raises a
:class:`~seqpack.errors.SeqpackError` (or ``OSError``) for a user's mistake; the dispatcher
(:mod:`seqpack.cli.app`, where every command is registered) turns that into one line on
stderr and exit status 2.

- :mod:`~seqpack.cli.commands.mock`: write mock lengths or a mock SFT dataset
- :mod:`~seqpack.cli.commands.stats`: summarize a file of lengths
- :mod:`~seqpack.cli.commands.simulate`: compare schedulers at any scale on one CPU
- :mod:`~seqpack.cli.commands.demo`: train a tiny hybrid LM across CPU ranks
"""
