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

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from seqpack.calibrate.base import MAX_SECONDS, MAX_STEP, MIN_SECONDS, Calibrator, check_lengths_count, check_seconds
from seqpack.cost import CostModel, nnls_fit, robust_weights_fit
from seqpack.cost.terms import exact_sums, sequence_features
from seqpack.errors import ConfigError, ResumeError
from seqpack.validation import check_bool, check_int

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "CostCalibrator", "microbatch_sums"]

logger = logging.getLogger(__name__)


class CostCalibrator(Calibrator[CostModel]):
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
    term makes the calibrator fit ``(1, S, SS, SW)`` for its window. The window, time filter,
    counters, state and copy are :class:`~seqpack.calibrate.base.Calibrator`'s.

    Deterministic: the same observations, in the same order, give the same model.
    """

    prior_type: ClassVar[type] = CostModel
    prior_name: ClassVar[str] = "seqpack.CostModel"

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
        super().__init__(
            prior,
            window=window,
            min_points=min_points,
            robust=robust,
            prior_in_seconds=prior_in_seconds,
            warmup_steps=warmup_steps,
        )
        self.keep_prior_shape = check_bool("keep_prior_shape", keep_prior_shape)
        self.shape = "prior"  # after a fit: "prior" (the prior rescaled) or "fitted" (every coefficient)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "keep_prior_shape": self.keep_prior_shape}

    @property
    def terms(self) -> tuple[str, ...]:
        """The terms fitted: the prior's (``("constant", "linear", "quadratic")``, and
        ``"windowed"`` for a prior with a window)."""
        return self.prior.terms

    @property
    def num_sums(self) -> int:
        """2 (``S``, ``SS``), 3 with a windowed prior (and ``SW``)."""
        return len(self.prior.terms) - 1

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
        if step is not None:
            step = check_int("step", step, minimum=0, maximum=MAX_STEP)
        where = "" if step is None else f" (observe of step {step})"
        times = check_seconds("seconds", seconds, where)
        count = check_lengths_count("microbatch_lengths", microbatch_lengths, where)
        if count != times.shape[0]:
            raise ConfigError(
                f"{count} microbatches (microbatch_lengths) but {times.shape[0]} timings (seconds){where}"
            )
        window = self.prior.window
        rows = [exact_sums(mb, window, f"microbatch {i}") for i, mb in enumerate(microbatch_lengths)]
        return self._add(rows, times.tolist(), step)

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

    # -- what the ledger asks -------------------------------------------------------------------

    def schedule_sums(self, schedule: Any) -> np.ndarray:
        """:func:`microbatch_sums` of ``schedule`` for the prior's window."""
        return microbatch_sums(schedule, self.prior.window)

    def sums_hint(self) -> str:
        return f"microbatch_sums(schedule, window={self.prior.window})"

    def predict_sums(self, model: CostModel, sums: np.ndarray) -> np.ndarray:
        return model.predict_sums(sums)

    def model_to_list(self, model: CostModel) -> list[float]:
        """``[linear, quadratic, constant]``, and ``windowed, window`` with a window."""
        values = [model.linear, model.quadratic, model.constant]
        return values if model.window is None else [*values, model.windowed, float(model.window)]

    def model_from_list(self, values: Sequence[float]) -> CostModel:
        """Inverse of :meth:`model_to_list`."""
        if len(values) not in (3, 5):
            raise ValueError(f"a saved cost model has 3 or 5 values, got {len(values)}")
        linear, quadratic, constant = values[:3]
        if len(values) == 3:
            return CostModel(linear, quadratic, constant)
        return CostModel(linear, quadratic, constant, windowed=values[3], window=int(values[4]))

    # -- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Observations and counters (plain Python values). Each point is
        ``[S, SS, seconds, step]``, or ``[S, SS, SW, seconds, step]`` with the prior's
        ``"window"`` saved beside them."""
        state = super().state_dict()
        if self.prior.window is not None:
            state["window"] = self.prior.window
        return state

    def _check_state(self, state: Mapping[str, Any]) -> None:
        if state.get("window") != self.prior.window:
            raise ResumeError(
                f"calibrator state was saved for a prior with window={state.get('window')!r}, this calibrator's "
                f"prior has window={self.prior.window!r}: its length sums do not fit"
            )


def microbatch_sums(schedule: Any, window: int | None = None) -> np.ndarray:
    """int64 ``[M, dp, 2]``: ``S`` and ``SS`` of every microbatch's padded lengths, as the
    rank runs it, or ``[M, dp, 3]`` with ``SW`` for a sliding ``window``
    (:mod:`seqpack.cost.terms`): an empty cell runs a padding-only filler of
    ``pad_multiple`` tokens (exact while ``capacity**2 < 2**63``)."""
    padded = schedule.padded_assigned().astype(np.int64)
    counts = schedule.group_counts
    per_sequence = sequence_features(padded, window)  # [n, k]
    out = np.zeros((counts.shape[0], per_sequence.shape[1]), dtype=np.int64)
    for j in range(per_sequence.shape[1]):
        np.add.at(out[:, j], schedule.group_of, per_sequence[:, j])
    out[counts == 0] = sequence_features(np.array([schedule.pad_multiple]), window)[0]
    return out.reshape(schedule.num_microbatches, schedule.dp_size, per_sequence.shape[1])


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
