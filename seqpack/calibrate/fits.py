"""The two fits of :class:`~seqpack.calibrate.CostCalibrator`, pure functions of its points.

* :func:`fit_terms`: a static plan's cost, ``seconds ~ constant + linear*S + quadratic*SS
  (+ windowed*SW) (+ encoder*E)`` (``E``: the microbatch's vision-encoder FLOPs, with an
  ``encoder_price``), kept as the prior rescaled unless the full fit is significantly better.
* :func:`fit_groups`: a CP group's cost (dynamic CP), the six coefficients of
  :func:`~seqpack.cost.group_features`; a coefficient whose feature no point exercised keeps
  the prior's value rescaled to the times.

Both are bit for bit the same on every rank (``math.fsum``, column-by-column products).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from seqpack.calibrate.points import Point
from seqpack.cost import CostModel, group_features, nnls_fit, robust_weights_fit
from seqpack.cost.fit import predict

__all__ = ["fit_encoder_terms", "fit_groups", "fit_terms"]

# F(extra coefficients, many) beyond which the full fit is significantly better than the
# rescaled prior (p ~ 0.02).
_F_CRITICAL = {2: 4.0, 3: 3.3, 4: 2.9}


def fit_terms(prior: CostModel, points: Sequence[Point], robust: bool, keep_prior_shape: bool) -> tuple[CostModel, str]:
    """The fitted compute terms and how: ``"prior"`` (the prior rescaled, when
    ``keep_prior_shape`` and the full fit is no significantly better) or ``"fitted"``."""
    coef, shape = _fit(prior.coefficients, points, robust, keep_prior_shape)
    return CostModel.from_coefficients(coef, window=prior.window), shape


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
    coef, shape = _fit((*prior.coefficients, encoder_price), points, robust, keep_prior_shape)
    return CostModel.from_coefficients(coef[:-1], window=prior.window), float(coef[-1]), shape


def fit_groups(prior: CostModel, points: Sequence[Point], robust: bool) -> CostModel:
    """The fitted group cost (compute on one rank, ``reference_size=1``)."""
    sums = np.array([p[0] for p in points], dtype=np.int64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    features = group_features(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3].astype(bool))
    active = np.flatnonzero(np.any(features != 0.0, axis=0))
    coef, weights = _solve(features[:, active], y, robust)
    start = prior.group_coefficients(1)  # a prior of this mode has its reference size
    out = start * (_rescale(predict(features, start), y, weights) or 1.0)
    out[active] = coef
    return CostModel.from_group_coefficients(out, prior.ranks_per_node)


def _solve(features: np.ndarray, y: np.ndarray, robust: bool) -> tuple[np.ndarray, np.ndarray]:
    if robust:
        return robust_weights_fit(features, y)
    return nnls_fit(features, y), np.ones_like(y)


def _fit(
    prior: Sequence[float], points: Sequence[Point], robust: bool, keep_prior_shape: bool
) -> tuple[Sequence[float] | np.ndarray, str]:
    """Coefficients ``(constant, *sums)`` fitted to ``points``, or the ``prior``'s rescaled
    (:func:`_scaled_prior`), and which."""
    features = np.array([(1.0, *(float(v) for v in sums)) for sums, _, _ in points], dtype=np.float64)
    y = np.array([t for _, t, _ in points], dtype=np.float64)
    coef, weights = _solve(features, y, robust)
    scaled = _scaled_prior(prior, features, y, weights, coef) if keep_prior_shape else None
    return (coef, "fitted") if scaled is None else (scaled, "prior")


def _rescale(p: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float | None:
    """The positive ``alpha`` of ``alpha * p ~ y`` in relative least squares under ``weights``
    (``None`` where there is none). Sums are ``math.fsum``: the same bits on every rank."""
    base = weights / (y * y)
    denominator = math.fsum(base * p * p)
    if denominator <= 0:
        return None
    alpha = math.fsum(base * p * y) / denominator
    return alpha if math.isfinite(alpha) and alpha > 0 else None


def _scaled_prior(
    prior: Sequence[float], features: np.ndarray, y: np.ndarray, weights: np.ndarray, coef: np.ndarray
) -> list[float] | None:
    """The prior's coefficients times :func:`_rescale`'s ``alpha``, unless the full fit
    ``coef`` beats it significantly (F-test on the extra coefficients); ``None`` then."""
    p = predict(features, prior)
    alpha = _rescale(p, y, weights)
    if alpha is None:
        return None
    full = predict(features, coef)
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
