"""GroupCostCalibrator: a dynamic-CP :class:`~seqpack.cost.CostModel` fitted online to
measured microbatch times (``PackingConfig(dynamic_cp=True, calibrate=True)``).

The dynamic-CP twin of :class:`~seqpack.calibrate.CostCalibrator`. Each timed microbatch is
reduced to the exact integers of its group: size ``c``, padded ``S``, ``SS`` and whether the
group spans nodes; the fit is ``seconds ~ group_features(c, S, SS, spans) @ coefficients``
(:data:`~seqpack.cost.FEATURES`: constant, ``S/c``, ``SS/c``, ``c-1`` and the
ring's ``(c-1) S/c`` within a node and across nodes) by the same exact, outlier-resistant
NNLS, so the CP communication term is fitted like the compute terms. A coefficient whose
feature no observation exercised (no group spanning nodes yet, or no group at all) keeps the
prior's value rescaled to the timings (relative least squares of the prior's predictions), so
an unfitted ring term is neither free nor in the prior's units. The fit is a pure function of
the observations, bit for bit, so ranks that observe the same timings hold the same model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from seqpack.calibrate.base import MAX_STEP, Calibrator, check_seconds
from seqpack.cost import FEATURES, CostModel, group_features, nnls_fit, robust_weights_fit
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.step_time import group_sums, replica_sums
from seqpack.validation import check_int, int64_array

__all__ = ["GROUP_SUMS", "GroupCostCalibrator"]

GROUP_SUMS: tuple[str, ...] = ("size", "seqlen_sum", "seqlen_sq_sum", "spans")
"""The integers one timed microbatch is reduced to (what the ledger keeps per microbatch)."""


class GroupCostCalibrator(Calibrator[CostModel]):
    """A CP group's :class:`~seqpack.cost.CostModel` fitted online to measured microbatch
    times (module docstring); a prior without ``reference_size`` is taken on one rank.

    Args:
        prior: The model used until ``min_points`` timings are in (and whose ring
            coefficients, rescaled, stand for those no timing exercised yet).
        window, min_points, robust, prior_in_seconds, warmup_steps: As for
            :class:`~seqpack.calibrate.CostCalibrator`.

    The window, time filter, counters, state (with ``"kind": "group"``) and copy are
    :class:`~seqpack.calibrate.base.Calibrator`'s.
    """

    KIND: ClassVar[str | None] = "group"
    prior_type: ClassVar[type] = CostModel
    prior_name: ClassVar[str] = "seqpack CostModel"
    terms: ClassVar[tuple[str, ...]] = FEATURES
    num_sums: ClassVar[int] = len(GROUP_SUMS)

    def schedule_sums(self, schedule: object) -> np.ndarray:
        """What :class:`~seqpack.calibrate.TimingLedger` keeps of a scheduled step: per round
        and DP replica, the ``(size, S, SS, spans)`` of the group its slowest CP rank runs
        under the current model (:func:`~seqpack.schedulers.step_time.replica_sums`).

        Raises:
            ConfigError: Not a :class:`Schedule`.
        """
        if not isinstance(schedule, Schedule):
            raise ConfigError(f"a GroupCostCalibrator times dynamic CP plans, got a {type(schedule).__name__}")
        return replica_sums(schedule, self.model)

    def rank_sums(self, schedule: object) -> tuple[np.ndarray, np.ndarray]:
        """Per round and plane rank (``d*cp + c``), the ``(size, S, SS, spans)`` of its group
        (int64 ``[num_microbatches, dp*cp, 4]``) and the group's index (``[num_microbatches, dp*cp]``):
        what the ledger keeps when every CP rank's time travels on its own, so that the fit
        sees every group (the slowest rank's time of each), not only each replica's slowest.

        Raises:
            ConfigError: Not a :class:`Schedule`.
        """
        if not isinstance(schedule, Schedule):
            raise ConfigError(f"a GroupCostCalibrator times dynamic CP plans, got a {type(schedule).__name__}")
        groups = schedule.rank_group()  # [rounds, dp*cp]
        return group_sums(schedule, self.prior.ranks_per_node)[groups], groups

    def predict_sums(self, model: CostModel, sums: np.ndarray) -> np.ndarray:
        return model.predict_group_sums(sums, 1)

    @staticmethod
    def model_to_list(model: CostModel) -> list[float]:
        """A model as plain floats for a resume state (its 6 coefficients and ``ranks_per_node``)."""
        return [*(float(c) for c in model.group_coefficients(1)), float(model.ranks_per_node)]

    @staticmethod
    def model_from_list(values: Sequence[float]) -> CostModel:
        """Inverse of :meth:`model_to_list`."""
        if len(values) != 7:
            raise ValueError(f"a saved group cost has 7 values, got {len(values)}")
        return CostModel.from_group_coefficients(np.array(values[:6], dtype=np.float64), int(values[6]))

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
            SeqpackTypeError: Sizes or sums that are no integers, spans that are no
                booleans (0/1 pass), times that are no real numbers.
            ConfigError: Arrays of different lengths, a size < 1 or a negative sum.
        """
        if step is not None:
            step = check_int("step", step, minimum=0, maximum=MAX_STEP)
        where = "" if step is None else f" (observe of step {step})"
        times = check_seconds("seconds", seconds, where)
        names = ("sizes", "seqlen_sum", "seqlen_sq_sum", "spans")
        columns = [
            _column(name, value, where)
            for name, value in zip(names, (sizes, seqlen_sum, seqlen_sq_sum, spans), strict=True)
        ]
        if any(c.shape[0] != times.shape[0] for c in columns):
            lengths = dict(zip((*names, "seconds"), [*(c.shape[0] for c in columns), times.shape[0]], strict=True))
            raise ConfigError(f"sizes, sums, spans and seconds differ in length{where}: {lengths}")
        rows = [tuple(int(v) for v in row) for row in zip(*(c.tolist() for c in columns), strict=True)]
        for i, row in enumerate(rows):
            problem = self._check_sums(row)
            if problem is not None:
                raise ConfigError(f"microbatch {i}{where}: {problem} (sizes >= 1, sums >= 0, spans 0 or 1)")
        return self._add(rows, times.tolist(), step)

    def _check_sums(self, sums: tuple[int, ...]) -> str | None:
        size, s, ss, spans = sums
        if size < 1 or s < 0 or ss < 0 or spans not in (0, 1):
            return f"size {size}, S {s}, SS {ss}, spans {spans}"
        return None

    def _fit(self) -> CostModel:
        sums = np.array([p[0] for p in self._points], dtype=np.int64)
        y = np.array([p[1] for p in self._points], dtype=np.float64)
        features = group_features(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3].astype(bool))
        active = np.flatnonzero(np.any(features != 0.0, axis=0))
        x = features[:, active]
        if self.robust:
            coef, weights = robust_weights_fit(x, y)
        else:
            coef, weights = nnls_fit(x, y), np.ones_like(y)
        prior = self.prior.group_coefficients(1)
        p = features @ prior  # elementwise per row: the same bits on every rank
        base = weights / (y * y)
        denominator = math.fsum((base * p * p).tolist())
        alpha = math.fsum((base * p * y).tolist()) / denominator if denominator > 0 else 1.0
        out = prior * (alpha if math.isfinite(alpha) and alpha > 0 else 1.0)
        out[active] = coef
        return CostModel.from_group_coefficients(out, self.prior.ranks_per_node)


def _column(name: str, value: object, where: str) -> np.ndarray:
    """One integer column of :meth:`GroupCostCalibrator.observe` (bools pass for ``spans``)."""
    if name == "spans":
        arr = np.asarray(value) if not isinstance(value, (str, bytes)) else np.asarray([value])
        if arr.dtype == np.bool_:
            if arr.ndim > 1:
                raise SeqpackTypeError(f"spans must be one flag per microbatch (1-D){where}, got shape {arr.shape}")
            return arr.reshape(-1).astype(np.int64)
    try:
        arr = int64_array(name, value)
    except SeqpackTypeError as exc:
        raise SeqpackTypeError(f"{exc}{where}") from None
    if arr.ndim > 1:
        raise SeqpackTypeError(f"{name} must be one integer per microbatch (1-D){where}, got shape {arr.shape}")
    return arr.reshape(-1)
