"""Fitting a cost model to measured times: exact, reproducible non-negative least squares.

The fits are scale-invariant: targets (and weights) are divided by a power of two before
fitting and the coefficients multiplied back, which changes no bit of the result and keeps
squares of times around 1e-200 or 1e200 seconds inside float64.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from seqpack.cost.terms import length_features
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.validation import check_numbers

__all__ = ["check_timings", "nnls_fit", "predict", "robust_weights_fit"]

_MAX_SPAN = 2.0**500  # largest/smallest timing: beyond it 1/y**2 (robust weights) leaves float64
_TIE = 1e-12  # residual improvements below this fraction of |y|^2 are rounding
_HUBER = 1.345  # Huber's constant (95% efficiency under Gaussian noise)
_BISQUARE = 4.685  # Tukey's bisquare constant (95% efficiency)
_MIN_SCALE = 0.1  # relative-residual scale floor (see robust_weights_fit)
_IRLS_STEPS = 20  # per weight rule


@functools.cache
def _supports(k: int) -> tuple[tuple[int, ...], ...]:
    """Every non-empty subset of ``k`` coefficients, smallest first (a larger support must
    beat a smaller one by more than rounding to win)."""
    return tuple(support for size in range(1, k + 1) for support in itertools.combinations(range(k), size))


def _power_of_two(values: np.ndarray) -> float:
    """``2**e`` with ``max|values| / 2**e`` in ``[0.5, 1)`` (1 for no or zero values, ``e``
    at most 1023): dividing by it changes no significand."""
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    if largest == 0 or not math.isfinite(largest):
        return 1.0
    return math.ldexp(1.0, min(math.frexp(largest)[1], 1023))


def check_timings(
    microbatches: Sequence[Sequence[int] | np.ndarray], seconds: object, window: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows and float64 targets of timed microbatches, checked as
    :meth:`CostModel.fit <seqpack.cost.CostModel.fit>` says."""
    for name, value in (("microbatches", microbatches), ("seconds", seconds)):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or getattr(value, "ndim", 1) == 0:
            raise SeqpackTypeError(f"{name} must be a list (one entry per microbatch), got {type(value).__name__}")
    try:
        shape = tuple(np.shape(seconds))  # type: ignore[call-overload]
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged: check_numbers names it
        shape = ()
    if len(shape) > 1:
        raise SeqpackTypeError(f"seconds must be one time per microbatch (1-D), got an array of shape {shape}")
    count = len(seconds)  # type: ignore[arg-type]
    if len(microbatches) != count:
        raise ConfigError(f"{len(microbatches)} microbatches but {count} timings (seconds)")
    if count < 3:
        raise ConfigError(f"fitting 3 coefficients needs at least 3 timed microbatches, got {count}")
    y = check_numbers("seconds", seconds)
    if y.shape[0] != count:
        raise SeqpackTypeError(f"seconds must hold one number per microbatch, got {seconds!r:.60}")
    bad = np.flatnonzero(~np.isfinite(y) | (y <= 0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"timings must be finite and > 0: seconds[{i}]={float(y[i])!r} ({bad.size} bad timing(s))")
    lo, hi = int(np.argmin(y)), int(np.argmax(y))
    if float(y[hi]) / _MAX_SPAN > float(y[lo]):
        raise ConfigError(
            f"timings span seconds[{lo}]={float(y[lo])!r} to seconds[{hi}]={float(y[hi])!r}, more than 2**500 "
            "(~3e150) apart: no cost model fits both (are they in the same unit?)"
        )
    try:
        features = length_features(microbatches, window)
    except SeqpackError:
        raise
    except (TypeError, ValueError):
        raise SeqpackTypeError(f"microbatches must hold lists of lengths, got {microbatches!r:.60}") from None
    return features, y


def nnls_fit(features: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Exact non-negative least squares of ``y ~ features @ coef`` with ``coef >= 0``.

    Every one of the ``2**k - 1`` supports is solved by unconstrained least squares (columns
    scaled to 1) and the feasible solution with the smallest (weighted) residual kept: the
    NNLS optimum is the least-squares solution on its own support, so this is exact. Of
    solutions equally good up to rounding the one with fewer coefficients wins (flat timings
    give exactly ``(constant, 0, 0)``). Bit-for-bit the same on every machine: the normal
    equations are summed with ``math.fsum`` and solved in Python floats (no BLAS).

    Args:
        features: ``[n, k]`` (:func:`~seqpack.cost.terms.length_features`).
        y: ``[n]`` targets.
        weights: Optional ``[n]`` non-negative row weights (weighted least squares).

    Returns:
        float64 ``[k]`` coefficients, all >= 0.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    y_scale = _power_of_two(y)
    y = y / y_scale
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / _power_of_two(w)
    k = x.shape[1]
    scale = np.abs(x).max(axis=0) if x.size else np.ones(k)
    scale[scale == 0] = 1.0
    xs = [x[:, j] / scale[j] for j in range(k)]
    gram = [[math.fsum(w * xs[i] * xs[j]) for j in range(k)] for i in range(k)]
    rhs = [math.fsum(w * xs[i] * y) for i in range(k)]
    total = math.fsum(w * y * y)
    best, best_residual = [0.0] * k, total
    for support in _supports(k):
        sol = _solve([[gram[i][j] for j in support] for i in support], [rhs[i] for i in support])
        if sol is None or any(v < 0 or not math.isfinite(v) for v in sol):
            continue
        # |y - X c|^2 = y'y - 2 c'X'y + c'X'X c, from the sums already taken.
        fit = math.fsum(c * rhs[i] for c, i in zip(sol, support, strict=True))
        quad = math.fsum(sol[a] * sol[b] * gram[i][j] for a, i in enumerate(support) for b, j in enumerate(support))
        value = total - 2.0 * fit + quad
        if value < best_residual - _TIE * total:
            best, best_residual = [0.0] * k, value
            for c, i in zip(sol, support, strict=True):
                best[i] = c
    return np.array(best, dtype=np.float64) / scale * y_scale


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting in Python floats; None when singular."""
    n = len(b)
    a = [row[:] + [b[i]] for i, row in enumerate(a)]
    largest = max(abs(a[i][i]) for i in range(n))
    if largest == 0:
        return None
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-13 * largest:
            return None  # collinear columns (e.g. every microbatch holds the same tokens)
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - math.fsum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out


def robust_weights_fit(features: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Outlier-resistant NNLS on relative errors ``r = (y - pred) / y``: the coefficients and
    the final robust weights ``w`` (0 for rejected points).

    Rows are weighted ``w(r/s) / y**2`` (a 5% miss counts the same on a 10 ms and a 100 ms
    microbatch) with ``s`` the median absolute deviation of ``r`` (times 1.4826, at least
    10%): Huber's weights first (convex, so the start does not matter), then Tukey's
    bisquare, which gives weight 0 to points more than 4.685 scales off. Outliers are
    ignored as long as they are fewer than the rest.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    y_scale = _power_of_two(y)
    y = y / y_scale
    base = 1.0 / (y * y)
    coef = nnls_fit(x, y, base)
    weights = np.ones_like(y)
    for rule in ("huber", "bisquare"):
        for _ in range(_IRLS_STEPS):
            r = (y - predict(x, coef)) / y
            s = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), _MIN_SCALE)
            u = np.abs(r) / s
            if rule == "huber":
                w = np.minimum(1.0, _HUBER / np.maximum(u, _HUBER))
            else:
                w = np.where(u < _BISQUARE, (1 - (u / _BISQUARE) ** 2) ** 2, 0.0)
            if np.count_nonzero(w) < x.shape[1]:
                return coef * y_scale, weights
            new = nnls_fit(x, y, w * base)
            done = np.allclose(new, coef, rtol=1e-9, atol=1e-300)
            coef, weights = new, w
            if done:
                break
    return coef * y_scale, weights


def predict(x: np.ndarray, coef: Sequence[float] | np.ndarray) -> np.ndarray:
    """float64 ``x @ coef`` column by column (no BLAS: the same bits on every CPU)."""
    out = np.zeros(x.shape[0], dtype=np.float64)
    for j in range(x.shape[1]):
        out = out + x[:, j] * coef[j]
    return out
