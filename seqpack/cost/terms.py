"""The terms of a cost model: which feature of a microbatch each coefficient multiplies.

A microbatch of lengths ``s_i`` costs ``constant * 1 + linear * S + quadratic * SS`` (``S =
sum(s_i)``, ``SS = sum(s_i**2)``), plus ``windowed * SW`` (``SW = sum(window_feature(s_i,
window))``) in a model with a ``window``. Features are summed as exact Python ints. A new term
is a :class:`~seqpack.cost.CostModel` coefficient (default 0) and its feature in
:func:`feature_names`, :func:`exact_sums`, :func:`sequence_features` and ``CostModel.cost``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError, SeqpackTypeError

__all__ = [
    "as_lengths",
    "exact_sums",
    "feature_names",
    "length_features",
    "sequence_features",
    "window_feature",
    "window_ratio",
]

BASE_TERMS = ("constant", "linear", "quadratic")


def window_feature(length: int, window: int) -> int:
    """The windowed term's per-sequence feature ``w(s, W) = 2*P(s, W) - s``, with ``P`` the
    (query, key) pairs of causal attention with a left window ``W`` (derivation:
    docs/cost_models.md): ``s**2`` up to ``s = W + 1``, ``(2W+1)*s - W*(W+1)`` beyond, so a
    windowed layer and a full one share one coefficient per unit.
    """
    s, w = int(length), int(window)
    return s * s if s <= w + 1 else (2 * w + 1) * s - w * (w + 1)


def feature_names(window: int | None) -> tuple[str, ...]:
    """The terms of a model with this ``window``, in feature order."""
    return BASE_TERMS if window is None else (*BASE_TERMS, "windowed")


def exact_sums(lengths: Sequence[int] | np.ndarray, window: int | None, where: str) -> tuple[int, ...]:
    """``(S, SS)``, or ``(S, SS, SW)`` with a window, of one microbatch: exact Python ints.

    Raises:
        SeqpackTypeError: Lengths that are not whole numbers (``where`` names the microbatch).
        ConfigError: A negative length.
    """
    arr = np.asarray(lengths).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise SeqpackTypeError(f"{where} lengths must be integers, got {arr.dtype}")
    values = [int(v) for v in arr.tolist()]
    if any(v < 0 for v in values):
        raise ConfigError(f"{where} has a negative length: {min(values)}")
    sums = (sum(values), sum(v * v for v in values))
    if window is None:
        return sums
    return (*sums, sum(window_feature(v, window) for v in values))


def length_features(microbatches: Sequence[Sequence[int] | np.ndarray], window: int | None = None) -> np.ndarray:
    """float64 ``[n, 3]``: ``(1, S, SS)`` per microbatch, or ``[n, 4]``: ``(1, S, SS, SW)``
    with a ``window`` (sums taken as exact ints)."""
    rows = np.empty((len(microbatches), len(feature_names(window))), dtype=np.float64)
    for i, mb in enumerate(microbatches):
        rows[i] = (1.0, *(float(v) for v in exact_sums(mb, window, f"microbatch {i}")))
    return rows


def sequence_features(lengths: np.ndarray, window: int | None) -> np.ndarray:
    """int64 ``[n, 2]`` (``s``, ``s**2``) or ``[n, 3]`` (and ``w(s, W)``) per sequence of
    non-negative int64 ``lengths`` (exact while ``s**2 < 2**63``)."""
    s = np.asarray(lengths, dtype=np.int64).reshape(-1)
    columns = [s, s * s]
    if window is not None:
        windowed = s * s
        beyond = s > window + 1
        windowed[beyond] = (2 * window + 1) * s[beyond] - window * (window + 1)
        columns.append(windowed)
    return np.stack(columns, axis=1)


def as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``lengths`` (ints or floats) as float64 for a cost model, same shape.

    Raises:
        SeqpackTypeError: Strings, bools, complex numbers, objects that are no numbers.
        ConfigError: NaN, infinite, or past int64.
    """
    s = np.asarray(lengths)
    if s.dtype.kind not in "iuf":
        numbers = None
        try:
            numbers = np.asarray(lengths, dtype=np.float64) if s.dtype.kind == "O" else None
        except (TypeError, ValueError, OverflowError):
            pass
        if numbers is None:
            raise SeqpackTypeError(f"lengths must be numbers, got {lengths!r:.60}")
        s = numbers
    if s.dtype.kind == "f" and s.size and not (np.all(np.isfinite(s)) and np.abs(s).max() < 2.0**63):
        raise ConfigError(f"lengths must be finite and within int64, got {lengths!r:.60}")
    return s.astype(np.float64, copy=False)


def window_ratio(lengths: np.ndarray, window: int) -> np.ndarray:
    """``w(s, W) / s`` of float64 ``lengths``: ``s`` itself up to ``W + 1`` (so
    ``s * window_ratio`` is ``s * s`` there, bit for bit), ``2W + 1 - W(W+1)/s`` beyond."""
    w = float(window)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lengths <= w + 1, lengths, (2 * w + 1) - w * (w + 1) / lengths)
