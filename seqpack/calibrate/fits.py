"""The two fits of :class:`~seqpack.calibrate.CostCalibrator`, pure functions of its points.

* :func:`fit_terms`: a static plan's cost (a prior without ``reference_size``):
  ``seconds ~ constant + linear*S + quadratic*SS (+ windowed*SW) (+ encoder*E)`` by
  :meth:`CostModel.fit <seqpack.cost.CostModel.fit>`'s exact, outlier-resistant NNLS, kept as
  the prior rescaled unless the full fit explains the times significantly better. ``E``, the
  microbatch's vision-encoder training FLOPs, is a feature only when the calibrator prices the
  encoder (``encoder_price``); its coefficient is the price of one encoder FLOP.
* :func:`fit_groups`: a CP group's cost (dynamic CP: a prior with ``reference_size``), the six
  coefficients of :func:`~seqpack.cost.group_features` (constant, ``S/c``, ``SS/c``, ring step
  ``c-1``, ring token ``(c-1) S/c`` within a node and across nodes) by the same NNLS; a
  coefficient whose feature no point exercised keeps the prior's value rescaled to the times.

Both are bit for bit the same on every rank (``math.fsum``, column-by-column products).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from seqpack.calibrate.points import Point
from seqpack.cost import CostModel, group_features, nnls_fit, robust_weights_fit

__all__ = ["fit_encoder_terms", "fit_groups", "fit_terms"]


def _solve(features: np.ndarray, y: np.ndarray, robust: bool) -> tuple[np.ndarray, np.ndarray]:
    if robust:
        return robust_weights_fit(features, y)
    return nnls_fit(features, y), np.ones_like(y)


def fit_terms(prior: CostModel, points: Sequence[Point], robust: bool, keep_prior_shape: bool) -> tuple[CostModel, str]:
    """The fitted compute terms and how: ``"prior"`` (the prior rescaled, when
    ``keep_prior_shape`` and the full fit is no significantly better) or ``"fitted"``."""
    features = np.array([(1.0, *(float(v) for v in sums)) for sums, _, _ in points], dtype=np.float64)
    y = np.array([t for _, t, _ in points], dtype=np.float64)
    coef, weights = _solve(features, y, robust)
    if keep_prior_shape:
        scaled = _scaled_prior(prior.coefficients, features, y, weights, coef)
        if scaled is not None:
            return CostModel.from_coefficients(scaled, window=prior.window), "prior"
    return CostModel.from_coefficients(coef, window=prior.window), "fitted"


def fit_encoder_terms(
    prior: CostModel, encoder_price: float, points: Sequence[Point], robust: bool, keep_prior_shape: bool
) -> tuple[CostModel, float, str]:
    """:func:`fit_terms` with the encoder: each point's sums end with its microbatch's
    encoder FLOPs ``E``, and ``encoder_price`` is the prior's price of one (in its units).
    Returns the fitted terms, the fitted price of an encoder FLOP and how (``"prior"``: both
    the prior's rescaled by one factor). While no point has encoder work the price follows
    the language model's: the prior's times the fitted ``linear`` over the prior's."""
    if not any(sums[-1] for sums, _, _ in points):
        model, shape = fit_terms(prior, [(sums[:-1], t, k) for sums, t, k in points], robust, keep_prior_shape)
        ratio = model.linear / prior.linear if prior.linear > 0 else 1.0
        return model, encoder_price * ratio, shape
    features = np.array([(1.0, *(float(v) for v in sums)) for sums, _, _ in points], dtype=np.float64)
    y = np.array([t for _, t, _ in points], dtype=np.float64)
    coef, weights = _solve(features, y, robust)
    if keep_prior_shape:
        scaled = _scaled_prior((*prior.coefficients, encoder_price), features, y, weights, coef)
        if scaled is not None:
            return CostModel.from_coefficients(scaled[:-1], window=prior.window), scaled[-1], "prior"
    return CostModel.from_coefficients(coef[:-1], window=prior.window), float(coef[-1]), "fitted"


def fit_groups(prior: CostModel, points: Sequence[Point], robust: bool) -> CostModel:
    """The fitted group cost (compute on one rank, ``reference_size=1``)."""
    sums = np.array([p[0] for p in points], dtype=np.int64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    features = group_features(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3].astype(bool))
    active = np.flatnonzero(np.any(features != 0.0, axis=0))
    coef, weights = _solve(features[:, active], y, robust)
    start = prior.group_coefficients(1)  # a prior of this mode has its reference size
    p = features @ start  # elementwise per row: the same bits on every rank
    base = weights / (y * y)
    denominator = math.fsum((base * p * p).tolist())
    alpha = math.fsum((base * p * y).tolist()) / denominator if denominator > 0 else 1.0
    out = start * (alpha if math.isfinite(alpha) and alpha > 0 else 1.0)
    out[active] = coef
    return CostModel.from_group_coefficients(out, prior.ranks_per_node)


# F(extra coefficients, many) beyond which the full fit is significantly better than the
# rescaled prior (p ~ 0.02).
_F_CRITICAL = {2: 4.0, 3: 3.3, 4: 2.9}


def _combine(coefficients: Sequence[float] | np.ndarray, features: np.ndarray) -> np.ndarray:
    """``features @ coefficients`` column by column, left to right (the same bits on every CPU)."""
    out = coefficients[0] * features[:, 0]
    for j in range(1, features.shape[1]):
        out = out + coefficients[j] * features[:, j]
    return np.asarray(out, dtype=np.float64)


def _scaled_prior(
    prior: Sequence[float], features: np.ndarray, y: np.ndarray, weights: np.ndarray, coef: np.ndarray
) -> list[float] | None:
    """The prior's coefficients times ``alpha`` (relative least squares under the fit's robust
    weights), unless the full fit ``coef`` beats it significantly (F-test on the extra
    coefficients); ``None`` then. Sums are ``math.fsum``: the same bits on every rank."""
    p = _combine(prior, features)
    base = weights / (y * y)
    denominator = math.fsum(base * p * p)
    if denominator <= 0:
        return None
    alpha = math.fsum(base * p * y) / denominator
    if not (math.isfinite(alpha) and alpha > 0):
        return None
    full = _combine(coef, features)
    sse_scaled = math.fsum(weights * ((y - alpha * p) / y) ** 2)
    sse_full = math.fsum(weights * ((y - full) / y) ** 2)
    k = features.shape[1]
    dof = int(np.count_nonzero(weights > 0)) - k
    if dof <= 0:
        return None
    if sse_full <= 0:
        f_value = math.inf if sse_scaled > 1e-24 else 0.0
    else:
        f_value = ((sse_scaled - sse_full) / (k - 1)) / (sse_full / dof)
    if f_value > _F_CRITICAL.get(k - 1, min(_F_CRITICAL.values())):
        return None
    return [alpha * c for c in prior]
