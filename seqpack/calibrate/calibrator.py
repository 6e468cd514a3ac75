"""CostCalibrator: a cost model fitted online to measured microbatch times.

:class:`CostCalibrator` keeps a sliding window of timed microbatches (each reduced to its
exact length sums ``S = sum(s)`` and ``SS = sum(s**2)``, and ``SW`` when the prior has a
sliding-window term: :mod:`seqpack.cost.terms`) and fits
``seconds ~ constant + linear*S + quadratic*SS (+ windowed*SW)`` with :meth:`CostModel.fit
<seqpack.cost.CostModel.fit>`'s exact, outlier-resistant NNLS. Until it holds
``min_points`` timings its model is the prior (e.g. the FLOPs model). The fit is a pure
function of the observations, bit for bit (see :func:`seqpack.cost.nnls_fit`), so ranks
that observe the same timings hold the same model.

Observations are keyed by step: ``observe(lengths, seconds, step=s)`` says "these are the
times of step ``s``"; ``last_step`` says the newest step it has seen, however late a step
arrives.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

import numpy as np

from seqpack._logging import warn_once
from seqpack.cost import CostModel, nnls_fit, robust_weights_fit
from seqpack.cost.terms import exact_sums
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.validation import check_bool, check_int, check_numbers

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "CostCalibrator"]

logger = logging.getLogger(__name__)

MIN_SECONDS = 2.0**-120
MAX_SECONDS = 2.0**120
"""Times the calibrator fits (about 7.5e-37 to 1.3e36 s): beyond them no clock measured a
microbatch, and their squares (relative weights) would leave float64. Others are skipped
and counted like NaN."""

# One observation: the microbatch's exact feature sums (S, SS[, SW]), its seconds, its step (-1: none).
_Point: TypeAlias = tuple[tuple[int, ...], float, int]


class CostCalibrator:
    """A cost model fitted online to measured microbatch times.

    Args:
        prior: The model used until ``min_points`` timings are in (any units: FLOPs for
            :meth:`CostModel.from_transformer`, seconds for a model fitted offline).
        window: Keep the newest this many timed microbatches (older ones drop out, so the
            model follows a drifting clock).
        min_points: Fit once this many valid timings are in (at least 3).
        robust: Fit with outlier rejection (``CostModel.fit(..., robust=True)``): a
            compile step or a GC pause 3x slower does not drag the model.
        prior_in_seconds: The prior predicts seconds (e.g. ``CostModel.fit`` on an offline
            measurement), so its predictions are compared with measured times (prediction
            error) before the first fit too. Default: its units are unknown (FLOPs).
        warmup_steps: Ignore the times of steps ``0 .. warmup_steps-1`` (observations that
            name their ``step``): the first step compiles and warms allocators up (3x slower
            is common), and as half of the first fit's points no robust fit could reject
            it. (After a resume the first step compiles again, but the window is full by
            then and the robust fit rejects it.)
        keep_prior_shape: Once fitted, use the prior rescaled to the timings (one
            coefficient) unless the full fit explains them significantly better (an F-test,
            ``F > 4`` with 2 extra coefficients, ``F > 3.3`` with 3 (a windowed prior):
            about 2% false alarms). When
            the clock is the prior's shape (FLOPs on a compute-bound GPU), the schedules
            then stay exactly the prior's instead of following noise in the fit.

    The terms fitted are the prior's (:attr:`CostModel.terms`): a prior with a sliding-window
    term makes the calibrator fit ``(1, S, SS, SW)`` for its window.

    Deterministic: the same observations, in the same order, give the same model.
    """

    STATE_VERSION: ClassVar[int] = 1

    def __init__(
        self,
        prior: CostModel,
        *,
        window: int = 1024,
        min_points: int = 32,
        robust: bool = True,
        prior_in_seconds: bool = False,
        warmup_steps: int = 1,
        keep_prior_shape: bool = True,
    ) -> None:
        if not isinstance(prior, CostModel):
            raise SeqpackTypeError(f"prior must be a seqpack.CostModel, got {type(prior).__name__}")
        self.prior = prior
        self.window = check_int("window", window, minimum=3)
        self.min_points = check_int("min_points", min_points, minimum=3)
        if self.min_points > self.window:
            raise ConfigError(f"min_points={self.min_points} is larger than window={self.window}")
        self.robust = check_bool("robust", robust)
        self.prior_in_seconds = check_bool("prior_in_seconds", prior_in_seconds)
        self.keep_prior_shape = check_bool("keep_prior_shape", keep_prior_shape)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
        self.shape = "prior"  # after a fit: "prior" (the prior rescaled) or "fitted" (every coefficient)
        self._points: collections.deque[_Point] = collections.deque(maxlen=self.window)
        self.skipped = 0  # timings that were NaN, infinite, <= 0 or outside [MIN_SECONDS, MAX_SECONDS]
        self.observed = 0  # valid timings ever observed (also those that left the window)
        self.last_step: int | None = None
        self._model: CostModel | None = None  # cache of the fit; None = refit on demand

    def __repr__(self) -> str:
        # Settings only (what PackingConfig fingerprints), not the observations.
        return (
            f"CostCalibrator(prior={self.prior!r}, window={self.window}, min_points={self.min_points}, "
            f"robust={self.robust}, prior_in_seconds={self.prior_in_seconds}, warmup_steps={self.warmup_steps}, "
            f"keep_prior_shape={self.keep_prior_shape})"
        )

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms fitted: the prior's (``("constant", "linear", "quadratic")``, and
        ``"windowed"`` for a prior with a window)."""
        return self.prior.terms

    @property
    def num_points(self) -> int:
        """Timings in the window."""
        return len(self._points)

    @property
    def fitted(self) -> bool:
        """Whether :attr:`model` is fitted (else it is the prior)."""
        return len(self._points) >= self.min_points

    @property
    def in_seconds(self) -> bool:
        """Whether :attr:`model` predicts seconds (fitted, or a prior in seconds)."""
        return self.fitted or self.prior_in_seconds

    def observe(
        self,
        microbatch_lengths: Sequence[Sequence[int] | np.ndarray],
        seconds: Sequence[float] | np.ndarray,
        *,
        step: int | None = None,
    ) -> int:
        """Add timed microbatches.

        Args:
            microbatch_lengths: Per microbatch, the (padded) lengths of its sequences.
            seconds: Per microbatch, its measured time (real numbers). NaN, infinite or
                non-positive times, and times outside ``[MIN_SECONDS, MAX_SECONDS]``, are
                skipped and counted in :attr:`skipped`.
            step: The training step these times belong to (for :attr:`last_step`; steps
                below ``warmup_steps`` are left out).

        Returns:
            How many timings were kept (0 for a warm-up step).

        Raises:
            SeqpackTypeError: A time that is no real number (a string, a bool), or lengths
                that are not integers.
            ConfigError: ``microbatch_lengths`` and ``seconds`` differ in length, or a
                negative length.
        """
        times = check_numbers("seconds", seconds)
        if len(microbatch_lengths) != times.shape[0]:
            raise ConfigError(f"{len(microbatch_lengths)} microbatches but {times.shape[0]} timings")
        if step is not None:
            step = check_int("step", step, minimum=0)
        window = self.prior.window
        rows = [exact_sums(mb, window, f"microbatch {i}") for i, mb in enumerate(microbatch_lengths)]
        return self._add(rows, times.tolist(), step)

    def _add(self, rows: Sequence[tuple[int, ...]], times: Sequence[float], step: int | None) -> int:
        """Observe microbatches given as exact feature sums (``(S, SS)``, or ``(S, SS, SW)``
        for a windowed prior)."""
        if step is not None and step < self.warmup_steps:
            if self.last_step is None or step > self.last_step:
                self.last_step = step
            return 0
        kept = 0
        for sums, t in zip(rows, times, strict=True):
            if not math.isfinite(t) or t <= 0:
                self.skipped += 1
                continue
            if not MIN_SECONDS <= t <= MAX_SECONDS:
                self.skipped += 1
                warn_once(
                    logger,
                    "absurd-time",
                    "step %s: a microbatch time of %r s is outside [%.2g, %.2g] s; it is skipped (counted in "
                    "CostCalibrator.skipped); further ones are not reported",
                    step,
                    t,
                    MIN_SECONDS,
                    MAX_SECONDS,
                )
                continue
            self._points.append((tuple(sums), float(t), -1 if step is None else step))
            kept += 1
        if kept:
            self.observed += kept
            self._model = None
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step
        return kept

    @property
    def model(self) -> CostModel:
        """The fitted model once :attr:`fitted`, else the prior."""
        if not self.fitted:
            return self.prior
        if self._model is None:
            self._model = self._fit()
        return self._model

    def _fit(self) -> CostModel:
        points = list(self._points)
        features = np.array([(1.0, *(float(v) for v in sums)) for sums, _, _ in points], dtype=np.float64)
        y = np.array([t for _, t, _ in points], dtype=np.float64)
        if self.robust:
            coef, weights = robust_weights_fit(features, y)
        else:
            coef, weights = nnls_fit(features, y), np.ones_like(y)
        self.shape = "fitted"
        full = CostModel.from_coefficients(coef, window=self.prior.window)
        if self.keep_prior_shape:
            scaled = _scaled_prior(self.prior, features, y, weights, coef)
            if scaled is not None:
                self.shape = "prior"
                return scaled
        return full

    # -- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Observations and counters (plain Python values). Each point is
        ``[S, SS, seconds, step]``, or ``[S, SS, SW, seconds, step]`` with the prior's
        ``"window"`` saved beside them."""
        state: dict[str, Any] = {
            "version": self.STATE_VERSION,
            "points": [[*sums, t, k] for sums, t, k in self._points],
            "skipped": self.skipped,
            "observed": self.observed,
            "last_step": self.last_step,
        }
        if self.prior.window is not None:
            state["window"] = self.prior.window
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the settings stay this calibrator's; a smaller window
        keeps the newest points).

        Raises:
            ResumeError: Not a calibrator state, another version, or a state saved with
                another sliding window than this prior's.
        """
        if not isinstance(state, Mapping) or state.get("version") != self.STATE_VERSION:
            got = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeError(f"calibrator state must be a CostCalibrator.state_dict() of version 1, got {got!r}")
        if state.get("window") != self.prior.window:
            raise ResumeError(
                f"calibrator state was saved for a prior with window={state.get('window')!r}, this calibrator's "
                f"prior has window={self.prior.window!r}: its length sums do not fit"
            )
        width = len(self.terms) - 1
        try:
            points = [_point(item, width) for item in state["points"]]
            skipped, observed = int(state["skipped"]), int(state["observed"])
            last = state.get("last_step")
            last_step = None if last is None else int(last)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"calibrator state is malformed: {exc}") from None
        if any(min(sums) < 0 or not (math.isfinite(t) and t > 0) for sums, t, _ in points):
            raise ResumeError("calibrator state holds a negative length sum or a non-positive time")
        self._points = collections.deque(points, maxlen=self.window)
        self.skipped, self.observed, self.last_step = skipped, observed, last_step
        self._model = None

    def copy(self) -> CostCalibrator:
        """A calibrator with the same settings and observations."""
        other = CostCalibrator(
            self.prior,
            window=self.window,
            min_points=self.min_points,
            robust=self.robust,
            prior_in_seconds=self.prior_in_seconds,
            warmup_steps=self.warmup_steps,
            keep_prior_shape=self.keep_prior_shape,
        )
        other.load_state_dict(self.state_dict())
        return other


def _point(item: Sequence[Any], width: int) -> _Point:
    """A saved ``[*sums, seconds, step]`` with ``width`` sums."""
    if len(item) != width + 2:
        raise ValueError(f"a point has {len(item)} values, expected {width + 2}")
    return tuple(int(v) for v in item[:width]), float(item[width]), int(item[width + 1])


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
    prior: CostModel, features: np.ndarray, y: np.ndarray, weights: np.ndarray, coef: np.ndarray
) -> CostModel | None:
    """The prior times ``alpha`` (relative least squares under the fit's robust weights),
    unless the full fit ``coef`` beats it significantly (F-test on the extra coefficients);
    ``None`` then. Sums are ``math.fsum``: the same bits on every rank."""
    p = _combine(prior.coefficients, features)
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
    return CostModel.from_coefficients([alpha * c for c in prior.coefficients], window=prior.window)
