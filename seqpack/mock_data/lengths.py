"""Sequence-length generators for mock workloads, and Megatron's mock-dataset JSON config.

Every generator owns its ``np.random.Generator`` (seeded from ``seed``), never touches the
global RNG, and returns int64 lengths clipped to ``[min_seq_len, max_seq_len]``.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from seqpack.errors import ConfigError
from seqpack.options import INT64_MAX
from seqpack.validation import check_fits_memory, check_int, check_number

__all__ = [
    "DISTRIBUTIONS",
    "bimodal_lengths",
    "constant_lengths",
    "generate_lengths",
    "lengths_from_config",
    "lognormal_lengths",
    "pareto_lengths",
    "uniform_lengths",
]


def _count(n: object) -> int:
    count = check_int("n", n, minimum=0)
    check_fits_memory(f"n={count} lengths", 16 * count)  # int64 out + float64 draw
    return count


def _bounds(min_seq_len: object, max_seq_len: object) -> tuple[int, int]:
    low = check_int("min_seq_len", min_seq_len, minimum=1, maximum=INT64_MAX)
    high = check_int("max_seq_len", max_seq_len, minimum=1, maximum=INT64_MAX)
    if low > high:
        raise ConfigError(f"min_seq_len={low} is larger than max_seq_len={high}")
    return low, high


def _seed(seed: object) -> int | None:
    """A generator seed: a non-negative integer (``None``: fresh entropy, not reproducible)."""
    return None if seed is None else check_int("seed", seed, minimum=0)


def _mu(mean: float, sigma: float, name: str) -> float:
    """``ln(mean) - sigma**2 / 2``: the lognormal location whose mean is ``mean``."""
    try:
        return math.log(mean) - sigma**2 / 2
    except OverflowError:
        raise ConfigError(f"{name}={sigma!r} is too large: sigma**2 overflows") from None


def _clip(values: np.ndarray, low: int, high: int) -> np.ndarray:
    # In place: the float64 draw and the int64 result are the peak (16 bytes per length).
    np.rint(values, out=values)
    np.clip(values, low, high, out=values)
    return values.astype(np.int64)


def lognormal_lengths(
    n: int,
    *,
    min_seq_len: int,
    max_seq_len: int,
    mean_seq_len: float,
    sigma: float = 1.1,
    seed: int = 0,
) -> np.ndarray:
    """Megatron's mock SFT lengths: lognormal with ``mu = ln(mean) - sigma**2 / 2`` (so the
    unclipped mean is ``mean_seq_len``; ``sigma`` is the standard deviation of ``log(length)``),
    rounded and clipped to ``[min_seq_len, max_seq_len]``: int64 ``[n]``."""
    n = _count(n)
    low, high = _bounds(min_seq_len, max_seq_len)
    mean = check_number("mean_seq_len", mean_seq_len, minimum=0.0, allow_zero=False)
    sigma = check_number("sigma", sigma, minimum=0.0)  # -0.0 reads 0.0, a sigma numpy takes
    rng = np.random.default_rng(_seed(seed))
    mu = _mu(mean, sigma, "sigma")
    return _clip(rng.lognormal(mu, sigma, n), low, high)


def uniform_lengths(n: int, *, min_seq_len: int, max_seq_len: int, seed: int = 0) -> np.ndarray:
    """Lengths uniform on ``[min_seq_len, max_seq_len]`` (inclusive)."""
    n = _count(n)
    low, high = _bounds(min_seq_len, max_seq_len)
    return np.random.default_rng(_seed(seed)).integers(low, high, n, endpoint=True, dtype=np.int64)


def pareto_lengths(n: int, *, min_seq_len: int, max_seq_len: int, alpha: float = 1.2, seed: int = 0) -> np.ndarray:
    """Pre-training documents: Pareto (type I) with scale ``min_seq_len`` and tail index
    ``alpha``, clipped at ``max_seq_len``. Most documents are short, a few are very long
    (``P(L > x) = (min_seq_len / x) ** alpha``; web text has ``alpha`` near 1-1.5)."""
    n = _count(n)
    low, high = _bounds(min_seq_len, max_seq_len)
    alpha = check_number("alpha", alpha, minimum=0.0, allow_zero=False)
    rng = np.random.default_rng(_seed(seed))
    return _clip(low * (1.0 + rng.pareto(alpha, n)), low, high)


def bimodal_lengths(
    n: int,
    *,
    min_seq_len: int,
    max_seq_len: int,
    short_mean: float,
    long_mean: float,
    long_fraction: float = 0.25,
    short_sigma: float = 0.6,
    long_sigma: float = 0.4,
    seed: int = 0,
) -> np.ndarray:
    """RL rollouts: a mix of short sequences (prompts with brief answers) and long ones
    (reasoning traces). Each mode is lognormal with the given mean (Megatron's
    parameterization); a sequence is long with probability ``long_fraction``."""
    n = _count(n)
    low, high = _bounds(min_seq_len, max_seq_len)
    short_mean = check_number("short_mean", short_mean, minimum=0.0, allow_zero=False)
    long_mean = check_number("long_mean", long_mean, minimum=0.0, allow_zero=False)
    fraction = check_number("long_fraction", long_fraction, minimum=0.0)
    if fraction > 1:
        raise ConfigError(f"long_fraction must be in [0, 1], got {long_fraction!r}")
    short_sigma = check_number("short_sigma", short_sigma, minimum=0.0)
    long_sigma = check_number("long_sigma", long_sigma, minimum=0.0)
    rng = np.random.default_rng(_seed(seed))
    is_long = rng.random(n) < fraction
    short = rng.lognormal(_mu(short_mean, short_sigma, "short_sigma"), short_sigma, n)
    long = rng.lognormal(_mu(long_mean, long_sigma, "long_sigma"), long_sigma, n)
    return _clip(np.where(is_long, long, short), low, high)


def constant_lengths(n: int, *, length: int) -> np.ndarray:
    """Every sequence ``length`` tokens (fixed-length pre-training)."""
    length = check_int("length", length, minimum=1, maximum=INT64_MAX)
    n = _count(n)
    return np.full(n, length, dtype=np.int64)


DISTRIBUTIONS: dict[str, Callable[..., np.ndarray]] = {
    "lognormal": lognormal_lengths,
    "uniform": uniform_lengths,
    "pareto": pareto_lengths,
    "bimodal": bimodal_lengths,
    "constant": constant_lengths,
}
"""Generators by name, as the JSON config's ``"type"`` and ``seqpack --dist`` name them."""


def generate_lengths(name: str, n: int, **params: Any) -> np.ndarray:
    """Lengths from the distribution registered as ``name`` (see :data:`DISTRIBUTIONS`).

    Raises:
        ConfigError: Unknown name, parameters the generator does not take, or out of range.
        SeqpackTypeError: A parameter of the wrong type.
    """
    if not isinstance(name, str) or name not in DISTRIBUTIONS:
        raise ConfigError(f"unknown length distribution {name!r}; available: {', '.join(DISTRIBUTIONS)}")
    fn = DISTRIBUTIONS[name]
    try:
        inspect.signature(fn).bind(n, **params)
    except TypeError as err:
        raise ConfigError(f"bad parameters for the {name!r} distribution: {err}") from None
    return fn(n, **params)


# Megatron's config key -> this module's keyword.
_CONFIG_ALIASES = {"lognormal_sigma": "sigma"}
_CONFIG_META = {"mode", "type", "path", "column", "num_samples", "seed"}


def lengths_from_config(
    config: Mapping[str, Any] | str | os.PathLike,
    *,
    num_samples: int | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """Lengths from Megatron's mock SFT dataset config.

    ``{"mode": "distribution", "type": "lognormal", "min_seq_len": ..., "max_seq_len": ...,
    "mean_seq_len": ..., "lognormal_sigma": ...}`` draws ``num_samples`` lengths;
    ``{"mode": "file", "path": ...}`` reads them with :func:`lengths_from_file` (relative
    paths are relative to the working directory, or to the config file's folder when the
    config is given as a file). seqpack also accepts the other :data:`DISTRIBUTIONS` as
    ``"type"`` with their keyword parameters, and ``"num_samples"``, ``"seed"`` and
    ``"column"`` keys.

    Args:
        config: A dict, a JSON string, or the path of a JSON file.
        num_samples: Lengths to draw in distribution mode (overrides the config's).
        seed: Generator seed (overrides the config's; default 0).

    Raises:
        ConfigError: Malformed JSON, an unknown mode or type, missing keys (the message
            names the config file when there is one).
        IsADirectoryError: ``config`` names a directory.
    """
    base_dir = None
    what = "config"
    if isinstance(config, (str, os.PathLike)):
        text = os.fspath(config)
        if not text.lstrip().startswith(("{", "[")):
            if os.path.isdir(text):
                raise IsADirectoryError(f"{text}: is a directory, not a JSON config")
            if not os.path.isfile(text):
                raise ConfigError(f"config {text!r} is neither a JSON object nor an existing file")
            base_dir = os.path.dirname(os.path.abspath(text))
            what = f"config file {text}"
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError as err:
                raise ConfigError(f"{what} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{what} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(config, Mapping):
        raise ConfigError(f"{what} must be a JSON object, got {type(config).__name__}")
    mode = config.get("mode", "distribution" if "type" in config else None)
    if mode == "file":
        from seqpack.mock_data.io import lengths_from_file

        if "path" not in config:
            raise ConfigError(f"file-mode {what} needs a 'path'")
        path = os.fspath(config["path"])
        if base_dir is not None and not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        return lengths_from_file(path, column=config.get("column"))
    if mode != "distribution":
        raise ConfigError(f"{what} 'mode' must be 'distribution' or 'file', got {mode!r}")
    kind = config.get("type")
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{what} 'type' must be one of {', '.join(DISTRIBUTIONS)}, got {kind!r}")
    n = num_samples if num_samples is not None else config.get("num_samples")
    if n is None:
        raise ConfigError(f"distribution-mode {what} needs num_samples (in the config or as an argument)")
    n = check_int("num_samples", n, minimum=0)
    check_fits_memory(f"num_samples={n} lengths", 16 * n)
    params = {_CONFIG_ALIASES.get(k, k): v for k, v in config.items() if k not in _CONFIG_META}
    if kind != "constant":
        params["seed"] = seed if seed is not None else config.get("seed", 0)
    return generate_lengths(kind, n, **params)
