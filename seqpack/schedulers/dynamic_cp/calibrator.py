"""GroupCostCalibrator: a dynamic-CP :class:`~seqpack.schedulers.dynamic_cp.GroupCost` fitted
online to measured microbatch times (``PackingConfig(dynamic_cp=True, calibrate=True)``).

The dynamic-CP twin of :class:`~seqpack.calibrate.CostCalibrator`. Each timed microbatch is
reduced to the exact integers of its group: size ``c``, padded ``S``, ``SS`` and whether the
group spans nodes; the fit is ``seconds ~ GroupCost.features(c, S, SS, spans) @ coefficients``
(:data:`~seqpack.schedulers.dynamic_cp.FEATURES`: constant, ``S/c``, ``SS/c``, ``c-1`` and the
ring's ``(c-1) S/c`` within a node and across nodes) by the same exact, outlier-resistant
NNLS, so the CP communication term is fitted like the compute terms. A coefficient whose
feature no observation exercised (no group spanning nodes yet, or no group at all) keeps the
prior's value rescaled to the timings (relative least squares of the prior's predictions), so
an unfitted ring term is neither free nor in the prior's units. The fit is a pure function of
the observations, bit for bit, so ranks that observe the same timings hold the same model.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

import numpy as np

from seqpack._logging import warn_once
from seqpack.calibrate.calibrator import MAX_SECONDS, MIN_SECONDS
from seqpack.cost import nnls_fit, robust_weights_fit
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.schedulers.dynamic_cp.cost import FEATURES, GroupCost, replica_sums
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.validation import check_bool, check_int, check_numbers

__all__ = ["GROUP_SUMS", "GroupCostCalibrator"]

logger = logging.getLogger(__name__)

GROUP_SUMS: tuple[str, ...] = ("size", "seqlen_sum", "seqlen_sq_sum", "spans")
"""The integers one timed microbatch is reduced to (what the ledger keeps per microbatch)."""

_Point: TypeAlias = tuple[tuple[int, ...], float, int]  # (size, S, SS, spans), seconds, step (-1: none)


class GroupCostCalibrator:
    """A :class:`GroupCost` fitted online to measured microbatch times (module docstring).

    Args:
        prior: The model used until ``min_points`` timings are in (and whose ring
            coefficients, rescaled, stand for those no timing exercised yet).
        window, min_points, robust, prior_in_seconds, warmup_steps: As for
            :class:`~seqpack.calibrate.CostCalibrator`.
    """

    STATE_VERSION: ClassVar[int] = 1
    terms: ClassVar[tuple[str, ...]] = FEATURES
    num_sums: ClassVar[int] = len(GROUP_SUMS)

    def __init__(
        self,
        prior: GroupCost,
        *,
        window: int = 1024,
        min_points: int = 32,
        robust: bool = True,
        prior_in_seconds: bool = False,
        warmup_steps: int = 1,
    ) -> None:
        if not isinstance(prior, GroupCost):
            raise SeqpackTypeError(f"prior must be a seqpack GroupCost, got {type(prior).__name__}")
        self.prior = prior
        self.window = check_int("window", window, minimum=3)
        self.min_points = check_int("min_points", min_points, minimum=3)
        if self.min_points > self.window:
            raise ConfigError(f"min_points={self.min_points} is larger than window={self.window}")
        self.robust = check_bool("robust", robust)
        self.prior_in_seconds = check_bool("prior_in_seconds", prior_in_seconds)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
        self._points: collections.deque[_Point] = collections.deque(maxlen=self.window)
        self.skipped = 0
        self.observed = 0
        self.last_step: int | None = None
        self._model: GroupCost | None = None

    def __repr__(self) -> str:
        return (
            f"GroupCostCalibrator(prior={self.prior!r}, window={self.window}, min_points={self.min_points}, "
            f"robust={self.robust}, prior_in_seconds={self.prior_in_seconds}, warmup_steps={self.warmup_steps})"
        )

    def schedule_sums(self, schedule: object) -> np.ndarray:
        """What :class:`~seqpack.calibrate.TimingLedger` keeps of a scheduled step: per round
        and DP replica, the ``(size, S, SS, spans)`` of the group its slowest CP rank runs
        under the current model (:func:`~seqpack.schedulers.dynamic_cp.cost.replica_sums`).

        Raises:
            ConfigError: Not a :class:`DynamicCpSchedule`.
        """
        if not isinstance(schedule, DynamicCpSchedule):
            raise ConfigError(f"a GroupCostCalibrator times dynamic CP plans, got a {type(schedule).__name__}")
        return replica_sums(schedule, self.model)

    @staticmethod
    def model_to_list(model: GroupCost) -> list[float]:
        """A model as plain floats for a resume state (its 6 coefficients and ``ranks_per_node``)."""
        return [*(float(c) for c in model.coefficients), float(model.ranks_per_node)]

    @staticmethod
    def model_from_list(values: Sequence[float]) -> GroupCost:
        """Inverse of :meth:`model_to_list`."""
        if len(values) != 7:
            raise ValueError(f"a saved group cost has 7 values, got {len(values)}")
        return GroupCost.from_coefficients(np.array(values[:6], dtype=np.float64), int(values[6]))

    @property
    def num_points(self) -> int:
        return len(self._points)

    @property
    def fitted(self) -> bool:
        return len(self._points) >= self.min_points

    @property
    def in_seconds(self) -> bool:
        return self.fitted or self.prior_in_seconds

    def observe(
        self,
        sizes: Sequence[int] | np.ndarray,
        seqlen_sum: Sequence[int] | np.ndarray,
        seqlen_sq_sum: Sequence[int] | np.ndarray,
        spans: Sequence[bool] | np.ndarray,
        seconds: Sequence[float] | np.ndarray,
        *,
        step: int | None = None,
    ) -> int:
        """Add timed microbatches, one per entry: its group's size, its padded ``S`` and
        ``SS``, whether its group spans nodes, and its measured seconds. Returns how many
        timings were kept (invalid times are skipped and counted in :attr:`skipped`).

        Raises:
            ConfigError: Arrays of different lengths, a size < 1 or a negative sum.
        """
        times = check_numbers("seconds", seconds)
        columns = [np.asarray(v).reshape(-1) for v in (sizes, seqlen_sum, seqlen_sq_sum, spans)]
        if any(c.shape[0] != times.shape[0] for c in columns):
            raise ConfigError(f"sizes, sums, spans and seconds differ in length: {[c.shape[0] for c in columns]}")
        rows = [tuple(int(v) for v in row) for row in zip(*(c.tolist() for c in columns), strict=True)]
        for i, (size, s, ss, _) in enumerate(rows):
            if size < 1 or s < 0 or ss < 0:
                raise ConfigError(f"microbatch {i}: size {size}, S {s}, SS {ss} (sizes >= 1, sums >= 0)")
        if step is not None:
            step = check_int("step", step, minimum=0)
        return self._add(rows, times.tolist(), step)

    def _add(self, rows: Sequence[tuple[int, ...]], times: Sequence[float], step: int | None) -> int:
        """Observe microbatches given as ``(size, S, SS, spans)`` rows (what the ledger calls)."""
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step
        if step is not None and step < self.warmup_steps:
            return 0
        kept = 0
        for sums, t in zip(rows, times, strict=True):
            if not (math.isfinite(t) and MIN_SECONDS <= t <= MAX_SECONDS):
                self.skipped += 1
                if math.isfinite(t) and t > 0:
                    warn_once(logger, "absurd-group-time", "step %s: a microbatch time of %r s is skipped", step, t)
                continue
            self._points.append((tuple(int(v) for v in sums), float(t), -1 if step is None else step))
            kept += 1
        if kept:
            self.observed += kept
            self._model = None
        return kept

    @property
    def model(self) -> GroupCost:
        """The fitted model once :attr:`fitted`, else the prior."""
        if not self.fitted:
            return self.prior
        if self._model is None:
            self._model = self._fit()
        return self._model

    def _fit(self) -> GroupCost:
        sums = np.array([p[0] for p in self._points], dtype=np.int64)
        y = np.array([p[1] for p in self._points], dtype=np.float64)
        features = self.prior.features(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3].astype(bool))
        active = np.flatnonzero(np.any(features != 0.0, axis=0))
        x = features[:, active]
        if self.robust:
            coef, weights = robust_weights_fit(x, y)
        else:
            coef, weights = nnls_fit(x, y), np.ones_like(y)
        prior = self.prior.coefficients
        p = features @ prior  # elementwise per row: the same bits on every rank
        base = weights / (y * y)
        denominator = math.fsum((base * p * p).tolist())
        alpha = math.fsum((base * p * y).tolist()) / denominator if denominator > 0 else 1.0
        out = prior * (alpha if math.isfinite(alpha) and alpha > 0 else 1.0)
        out[active] = coef
        return GroupCost.from_coefficients(out, self.prior.ranks_per_node)

    # -- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Observations (``[size, S, SS, spans, seconds, step]`` each) and counters."""
        return {
            "version": self.STATE_VERSION,
            "kind": "group",
            "points": [[*sums, t, k] for sums, t, k in self._points],
            "skipped": self.skipped,
            "observed": self.observed,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ResumeError: Not a group calibrator's state, or a malformed one.
        """
        if not isinstance(state, Mapping) or state.get("version") != self.STATE_VERSION or state.get("kind") != "group":
            raise ResumeError("calibrator state must be a GroupCostCalibrator.state_dict() of version 1")
        try:
            points: list[_Point] = []
            for item in state["points"]:
                if len(item) != self.num_sums + 2:
                    raise ValueError(f"a point has {len(item)} values, expected {self.num_sums + 2}")
                points.append((tuple(int(v) for v in item[:4]), float(item[4]), int(item[5])))
            skipped, observed = int(state["skipped"]), int(state["observed"])
            last = state.get("last_step")
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"calibrator state is malformed: {exc}") from None
        self._points = collections.deque(points, maxlen=self.window)
        self.skipped, self.observed = skipped, observed
        self.last_step = None if last is None else int(last)
        self._model = None

    def copy(self) -> GroupCostCalibrator:
        other = GroupCostCalibrator(
            self.prior,
            window=self.window,
            min_points=self.min_points,
            robust=self.robust,
            prior_in_seconds=self.prior_in_seconds,
            warmup_steps=self.warmup_steps,
        )
        other.load_state_dict(self.state_dict())
        return other
