"""Where ``seqpack mock`` and ``seqpack simulate`` take their lengths from: a file
(``--lengths``), Megatron's mock-dataset config (``--config``) or a named distribution
(``--dist`` and its parameters)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from seqpack.cli.exit import CommandError
from seqpack.errors import SeqpackError
from seqpack.validation import check_fits_memory, check_int

__all__ = ["DIST_DEFAULTS", "add_source_args", "column_arg", "load_lengths"]

# Defaults of every distribution's parameters when the command line leaves them out
# (lognormal: the example config of Megatron's mock SFT dataset).
DIST_DEFAULTS: dict[str, dict[str, Any]] = {
    "lognormal": {"min_seq_len": 1024, "max_seq_len": 8192, "mean_seq_len": 4096, "sigma": 1.1},
    "uniform": {"min_seq_len": 128, "max_seq_len": 8192},
    "pareto": {"min_seq_len": 128, "max_seq_len": 32768, "alpha": 1.2},
    "bimodal": {"min_seq_len": 64, "max_seq_len": 32768, "short_mean": 1024, "long_mean": 16384,
                "long_fraction": 0.25},
    "constant": {"length": 4096},
}  # fmt: skip
DIST_ARGS = tuple(dict.fromkeys(key for params in DIST_DEFAULTS.values() for key in params))


def add_source_args(p: argparse.ArgumentParser, *, allow_file: bool) -> None:
    src = p.add_argument_group("lengths (one source; default: --dist lognormal)")
    if allow_file:
        src.add_argument("--lengths", metavar="FILE", help="CSV, Parquet, Arrow or JSONL file of lengths")
        src.add_argument("--column", help="length column of --lengths (name or 0-based index)")
    src.add_argument("--config", metavar="JSON", help="Megatron mock-dataset config: a JSON string or file")
    src.add_argument("--dist", choices=sorted(DIST_DEFAULTS), help="named distribution (default lognormal)")
    src.add_argument("--seed", type=int, default=0, help="seed of the generated lengths (default 0)")
    dist = p.add_argument_group("distribution parameters (defaults per distribution; see docs/schedulers.md)")
    dist.add_argument("--min-seq-len", type=int)
    dist.add_argument("--max-seq-len", type=int)
    dist.add_argument("--mean-seq-len", type=float, help="lognormal mean")
    dist.add_argument("--sigma", type=float, help="lognormal sigma (Megatron's lognormal_sigma)")
    dist.add_argument("--alpha", type=float, help="Pareto tail index")
    dist.add_argument("--short-mean", type=float, help="bimodal: mean of the short mode")
    dist.add_argument("--long-mean", type=float, help="bimodal: mean of the long mode")
    dist.add_argument("--long-fraction", type=float, help="bimodal: share of long sequences")
    dist.add_argument("--length", type=int, help="constant: the length")


def column_arg(text: str | None) -> str | int | None:
    """``--column``: a 0-based index when it is all digits, else a name."""
    return int(text) if text is not None and text.isdigit() else text


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _dist_params(args: argparse.Namespace, name: str) -> tuple[dict[str, Any], list[str]]:
    """The distribution's parameters (defaults overridden by flags) and the flags given."""
    params = dict(DIST_DEFAULTS[name])
    given = []
    for key in DIST_ARGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in params:
            raise CommandError(f"{_flag(key)} does not apply to the {name!r} distribution")
        params[key] = value
        given.append(f"{_flag(key)} {value}")
    return params, given


def _count_flags(args: argparse.Namespace, n: int) -> str:
    """The flags that set how many lengths a command draws."""
    if hasattr(args, "steps") and hasattr(args, "global_batch"):
        return f"--steps {args.steps} x --global-batch {args.global_batch} = {n}"
    return f"--num-samples {n}"


def load_lengths(args: argparse.Namespace, n: int | None) -> tuple[np.ndarray, str]:
    """Lengths and a one-line description of where they came from.

    Raises:
        SeqpackError: Two sources, a parameter of another distribution, or what the
            library refuses (a bad file or config, an out-of-range parameter); errors from
            a distribution name ``--dist`` and the flags given.
        OSError: A length file that cannot be read.
    """
    from seqpack.mock_data import generate_lengths, lengths_from_config, lengths_from_file

    # ``is not None``: an empty --lengths '' is a mistake, not "no file" (the default source).
    sources = [s for s in ("lengths", "config", "dist") if getattr(args, s, None) is not None]
    if len(sources) > 1:
        raise CommandError(f"give one source of lengths, got --{' and --'.join(sources)}")
    for source in ("lengths", "config"):
        value = getattr(args, source, None)
        if value is not None and not value.strip():
            raise CommandError(
                f"--{source} needs a {'file name' if source == 'lengths' else 'JSON config'}, got {value!r}"
            )
    check_int("--seed", args.seed, minimum=0)
    if getattr(args, "lengths", None) is not None:
        return lengths_from_file(args.lengths, column=column_arg(args.column)), f"file {args.lengths}"
    if n:
        # Refused here, naming the flags that asked for n lengths, before any is drawn.
        check_fits_memory(f"{_count_flags(args, n)} lengths", 16 * n)
    if args.config is not None:
        return lengths_from_config(args.config, num_samples=n, seed=args.seed), "config"
    name = args.dist or "lognormal"
    params, given = _dist_params(args, name)
    if name != "constant":
        params["seed"] = args.seed
    try:
        lengths = generate_lengths(name, n or 0, **params)
    except SeqpackError as err:
        flags = f" ({', '.join(given)})" if given else " (its default parameters)"
        raise CommandError(f"--dist {name}{flags}: {err}") from None
    shown = ", ".join(f"{k}={v}" for k, v in params.items() if k != "seed")
    return lengths, f"{name}({shown}, seed={args.seed})"
