"""CostCalibrator: the cost model fitted online to measured microbatch times.

It keeps a sliding window of timed microbatches, each reduced to exact integers
(:mod:`seqpack.calibrate.points`), and fits its prior's terms to them
(:mod:`seqpack.calibrate.fits`): a static plan's compute terms, or, for a prior with a
``reference_size`` (dynamic CP), a CP group's cost with its ring terms. Until it holds
``min_points`` timings its model is the prior. The fit is a pure function of the
observations, bit for bit, so ranks that observe the same timings hold the same model.

State (plain Python values, one format)::

    {"version": 2, "sums": [names], "window": W | None, "points": [[*sums, seconds, step], ...],
     "skipped": int, "observed": int, "last_step": int | None}
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqpack._logging import warn_once
from seqpack.calibrate.fits import fit_encoder_terms, fit_groups, fit_terms
from seqpack.calibrate.points import (
    GROUP_SUMS,
    MAX_SECONDS,
    MAX_STEP,
    MAX_WINDOW,
    MIN_SECONDS,
    Point,
    add_encoder_flops,
    check_lengths_count,
    check_seconds,
    microbatch_encoder_flops,
    microbatch_sums,
    parse_count,
    parse_point,
)
from seqpack.cost import CostModel
from seqpack.cost.terms import exact_sums
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.step_time import group_sums, replica_sums
from seqpack.validation import check_bool, check_int, check_number, int64_array

__all__ = ["CostCalibrator"]

logger = logging.getLogger(__name__)


class CostCalibrator:
    """A cost model fitted online to measured microbatch times (the module docstring).

    Args:
        prior: The model used until ``min_points`` timings are in (any units). With a
            ``reference_size`` (a dynamic-CP cost) the calibrator fits CP groups, its ring
            terms included; ring terms need one.
        window: Keep the newest this many timed microbatches (at least 3; older ones drop
            out, so the model follows a drifting clock).
        min_points: Fit once this many valid timings are in (at least 3, at most ``window``).
        robust: Fit with outlier rejection (``CostModel.fit(..., robust=True)``).
        prior_in_seconds: The prior predicts seconds, so its predictions are compared with
            measured times before the first fit too. Default: its units are unknown (FLOPs).
        warmup_steps: Ignore the times of steps ``0 .. warmup_steps-1`` (observations that
            name their ``step``): the first step compiles and warms allocators up.
        keep_prior_shape: Static fits: once fitted, use the prior rescaled to the timings
            (one coefficient) unless the full fit explains them significantly better (an
            F-test at about 2% false alarms). A group fit keeps the prior, rescaled, only for
            the terms no timing exercised.
        encoder_price: The prior's price of one vision-encoder training FLOP, in its units.
            Given, each timed microbatch's encoder FLOPs are the last feature of a static fit
            and :attr:`encoder_price` is fitted with the model. ``None``: text fits.

    Deterministic: the same observations, in the same order, give the same model.
    """

    STATE_VERSION = 2

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
        encoder_price: float | None = None,
    ) -> None:
        if not isinstance(prior, CostModel):
            raise SeqpackTypeError(f"prior must be a seqpack.CostModel, got {type(prior).__name__}")
        if prior.has_ring and prior.reference_size is None:
            raise ConfigError(
                f"prior={prior!r} has ring terms but no reference_size: give the CP group size its compute terms "
                "are the cost on (1: one rank), so that groups of every size are priced"
            )
        self.prior = prior
        self.window = check_int("window", window, minimum=3, maximum=MAX_WINDOW)
        self.min_points = check_int("min_points", min_points, minimum=3)
        if self.min_points > self.window:
            raise ConfigError(f"min_points={self.min_points} is larger than window={self.window}")
        self.robust = check_bool("robust", robust)
        self.prior_in_seconds = check_bool("prior_in_seconds", prior_in_seconds)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
        self.keep_prior_shape = check_bool("keep_prior_shape", keep_prior_shape)
        self.prior_encoder_price = None
        if encoder_price is not None:
            self.prior_encoder_price = check_number("encoder_price", encoder_price, minimum=0.0, allow_zero=False)
        if self.prior_encoder_price is not None and self.fits_groups:
            raise ConfigError(
                f"encoder_price={encoder_price!r} with a prior that prices CP groups ({prior!r}): dynamic CP plans "
                "no sample_cost, so a group fit has no encoder term"
            )
        self._points: collections.deque[Point] = collections.deque(maxlen=self.window)
        self.skipped = 0  # timings that were NaN, infinite, <= 0 or outside [MIN_SECONDS, MAX_SECONDS]
        self.observed = 0  # valid timings ever observed (also those that left the window)
        self.last_step: int | None = None
        self.shape = "prior"  # after a static fit: "prior" (the prior rescaled) or "fitted" (every coefficient)
        self._model: CostModel | None = None  # cache of the fit; None = refit on demand
        self._encoder_price: float | None = None  # the fitted price of an encoder FLOP, with _model

    def settings(self) -> dict[str, Any]:
        """The keyword arguments after ``prior`` that rebuild it, in order (``encoder_price`` when given)."""
        out: dict[str, Any] = {
            "window": self.window,
            "min_points": self.min_points,
            "robust": self.robust,
            "prior_in_seconds": self.prior_in_seconds,
            "warmup_steps": self.warmup_steps,
            "keep_prior_shape": self.keep_prior_shape,
        }
        if self.prior_encoder_price is not None:
            out["encoder_price"] = self.prior_encoder_price
        return out

    def __repr__(self) -> str:
        # Settings only (what PackingConfig fingerprints: keep it stable), not the observations.
        words = ", ".join(f"{name}={value}" for name, value in self.settings().items())
        return f"{type(self).__name__}(prior={self.prior!r}, {words})"

    @property
    def fits_groups(self) -> bool:
        """Whether it fits CP groups (its prior has a ``reference_size``: dynamic CP)."""
        return self.prior.reference_size is not None

    @property
    def sum_names(self) -> tuple[str, ...]:
        """The integers one timed microbatch is reduced to: :data:`GROUP_SUMS` when it fits
        groups, else ``S``, ``SS`` (``SW`` with a windowed prior, encoder FLOPs last with an
        ``encoder_price``)."""
        if self.fits_groups:
            return GROUP_SUMS
        window = ("seqlen_window_sum",) if self.prior.window is not None else ()
        encoder = ("vision_flops_sum",) if self.prior_encoder_price is not None else ()
        return ("seqlen_sum", "seqlen_sq_sum", *window, *encoder)

    @property
    def num_sums(self) -> int:
        return len(self.sum_names)

    @property
    def terms(self) -> tuple[str, ...]:
        """The prior's compute terms (:attr:`CostModel.terms`)."""
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

    @property
    def model(self) -> CostModel:
        """The fitted model once :attr:`fitted`, else the prior."""
        if not self.fitted:
            return self.prior
        if self._model is None:
            if self.fits_groups:
                self._model = fit_groups(self.prior, self._points, self.robust)
            elif self.prior_encoder_price is not None:
                self._model, self._encoder_price, self.shape = fit_encoder_terms(
                    self.prior, self.prior_encoder_price, self._points, self.robust, self.keep_prior_shape
                )
            else:
                self._model, self.shape = fit_terms(self.prior, self._points, self.robust, self.keep_prior_shape)
        return self._model

    @property
    def encoder_price(self) -> float | None:
        """The price of one vision-encoder training FLOP in :attr:`model`'s units (the
        prior's ``encoder_price`` until :attr:`fitted`; ``None`` without one)."""
        if self.prior_encoder_price is None or not self.fitted:
            return self.prior_encoder_price
        self.model  # noqa: B018 - fits the price with the model
        return self._encoder_price

    def observe(
        self,
        microbatch_lengths: Sequence[Sequence[int] | np.ndarray],
        seconds: Sequence[float] | np.ndarray,
        *,
        step: int | None = None,
        group_sizes: Sequence[int] | np.ndarray | None = None,
        spans: Sequence[bool] | np.ndarray | None = None,
        encoder_flops: Sequence[int] | np.ndarray | None = None,
    ) -> int:
        """Add timed microbatches.

        Args:
            microbatch_lengths: Per microbatch, the (padded) lengths of its sequences.
            seconds: Per microbatch, its measured time (real numbers). NaN, infinite or
                non-positive times, and times outside ``[MIN_SECONDS, MAX_SECONDS]``, are
                skipped and counted in :attr:`skipped`.
            step: The training step these times belong to (for :attr:`last_step`; steps
                below ``warmup_steps`` are left out).
            group_sizes, spans: When it :attr:`fits_groups` (and only then): per microbatch
                its CP group's size, and whether the group spans nodes (default: none does).
            encoder_flops: With an ``encoder_price`` (and only then): per microbatch its
                vision encoder's training FLOPs (default: none).

        Returns:
            How many timings were kept (0 for a warm-up step).

        Raises:
            SeqpackTypeError: A time that is no real number, lengths or sizes that are not
                integers.
            ConfigError: Arguments of different lengths, a negative length, a size < 1,
                group sizes missing or given as this calibrator's mode asks.
        """
        step, where, times = self._check_call(step, seconds)
        count = check_lengths_count("microbatch_lengths", microbatch_lengths, where)
        if count != times.shape[0]:
            raise ConfigError(
                f"{count} microbatches (microbatch_lengths) but {times.shape[0]} timings (seconds){where}"
            )
        if not self.fits_groups:
            if group_sizes is not None or spans is not None:
                raise ConfigError("group_sizes and spans are for a prior that prices CP groups (its reference_size)")
            window = self.prior.window
            rows = [exact_sums(mb, window, f"microbatch {i}") for i, mb in enumerate(microbatch_lengths)]
            if self.prior_encoder_price is not None:
                rows = self._checked(add_encoder_flops(rows, encoder_flops, where), where)
            elif encoder_flops is not None:
                raise ConfigError("encoder_flops are for a calibrator with an encoder_price")
            return self._add(rows, times.tolist(), step)
        if group_sizes is None:
            raise ConfigError(f"this calibrator fits CP groups (prior {self.prior!r}): pass group_sizes={where}")
        sizes = _column("group_sizes", group_sizes, where)
        flags = np.zeros(count, dtype=np.int64) if spans is None else _column("spans", spans, where)
        if sizes.shape[0] != count or flags.shape[0] != count:
            given = f"{sizes.shape[0]} group_sizes and {flags.shape[0]} spans"
            raise ConfigError(f"{count} microbatches but {given}{where}")
        sums = [exact_sums(mb, None, f"microbatch {i}") for i, mb in enumerate(microbatch_lengths)]
        rows = [(int(c), s, ss, int(f)) for c, (s, ss), f in zip(sizes.tolist(), sums, flags.tolist(), strict=True)]
        return self._add(self._checked(rows, where), times.tolist(), step)

    def observe_sums(
        self,
        sums: Sequence[Sequence[int]] | np.ndarray,
        seconds: Sequence[float] | np.ndarray,
        *,
        step: int | None = None,
    ) -> int:
        """:meth:`observe` of microbatches given as their integer sums, one row each in
        :attr:`sum_names` order.

        Raises:
            SeqpackTypeError: Sums that are no integers (bools pass for ``spans``).
            ConfigError: Rows of the wrong width or count, a negative sum, a size < 1 or
                spans not 0 or 1 (named by microbatch).
        """
        step, where, times = self._check_call(step, seconds)
        table = np.asarray(sums)
        table = table.astype(np.int64) if table.dtype == np.bool_ else int64_array("sums", sums)
        if table.ndim != 2 or table.shape != (times.shape[0], self.num_sums):
            raise ConfigError(
                f"sums must be one row of {self.sum_names} per timing ({times.shape[0]}){where}, got shape "
                f"{table.shape}"
            )
        rows = [tuple(int(v) for v in row) for row in table.tolist()]
        return self._add(self._checked(rows, where), times.tolist(), step)

    def _check_call(self, step: int | None, seconds: object) -> tuple[int | None, str, np.ndarray]:
        if step is not None:
            step = check_int("step", step, minimum=0, maximum=MAX_STEP)
        where = "" if step is None else f" (observe of step {step})"
        return step, where, check_seconds("seconds", seconds, where)

    def _checked(self, rows: list[tuple[int, ...]], where: str) -> list[tuple[int, ...]]:
        for i, row in enumerate(rows):
            problem = self._check_sums(row)
            if problem is not None:
                raise ConfigError(f"microbatch {i}{where}: {problem}")
        return rows

    def _check_sums(self, sums: tuple[int, ...]) -> str | None:
        """What is wrong with one point's sums (``None``: nothing)."""
        if not self.fits_groups:
            return None if min(sums) >= 0 else "a negative length sum"
        size, s, ss, spans = sums
        if size < 1 or s < 0 or ss < 0 or spans not in (0, 1):
            return f"size {size}, S {s}, SS {ss}, spans {spans} (sizes >= 1, sums >= 0, spans 0 or 1)"
        return None

    def _add(self, rows: Sequence[tuple[int, ...]], times: Sequence[float], step: int | None) -> int:
        """Observe microbatches given as exact sums; times outside ``[MIN_SECONDS,
        MAX_SECONDS]`` are skipped and counted (a positive one with a warning, once). Returns
        how many timings were kept."""
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step
        if step is not None and step < self.warmup_steps:
            return 0
        kept = 0
        for sums, t in zip(rows, times, strict=True):
            if not (math.isfinite(t) and MIN_SECONDS <= t <= MAX_SECONDS):
                self.skipped += 1
                if math.isfinite(t) and t > 0:
                    warn_once(
                        logger,
                        "absurd-time:CostCalibrator",
                        "step %s: a microbatch time of %r s is outside [%.2g, %.2g] s; it is skipped (counted in "
                        "CostCalibrator.skipped); further ones are not reported",
                        step,
                        t,
                        MIN_SECONDS,
                        MAX_SECONDS,
                    )
                continue
            self._points.append((tuple(int(v) for v in sums), float(t), -1 if step is None else step))
            kept += 1
        if kept:
            self.observed += kept
            self._model = self._encoder_price = None
        return kept

    def schedule_sums(self, schedule: Any, encoder_price: float | None = None) -> np.ndarray:
        """int64 ``[M, dp, num_sums]``: the sums of every microbatch of a scheduled step (when
        it fits groups, per round and DP replica those of the group its slowest CP rank runs
        under the current model); with an encoder term, the encoder FLOPs at ``encoder_price`` last."""
        if self.fits_groups:
            return replica_sums(_plan(schedule), self.model)
        sums = microbatch_sums(schedule, self.prior.window)
        if self.prior_encoder_price is None:
            return sums
        flops = microbatch_encoder_flops(schedule, encoder_price)
        return np.concatenate([sums, flops[..., None]], axis=-1)

    def rank_sums(self, schedule: Any) -> tuple[np.ndarray, np.ndarray]:
        """Per round and plane rank (``d*cp + c``), the ``(size, S, SS, spans)`` of its group
        (int64 ``[num_microbatches, dp*cp, 4]``) and the group's index (``[num_microbatches,
        dp*cp]``): what the ledger keeps when every CP rank's time travels on its own. Only
        when it fits groups."""
        if not self.fits_groups:
            raise ConfigError("rank_sums is for a calibrator that fits CP groups (a prior with reference_size)")
        plan = _plan(schedule)
        groups = plan.rank_group()  # [rounds, dp*cp]
        return group_sums(plan, self.prior.ranks_per_node)[groups], groups

    def predict_sums(self, model: CostModel, sums: np.ndarray, encoder_price: float | None = None) -> np.ndarray:
        """float64 ``[...]``: what ``model`` predicts for microbatches given as sums (the last
        axis in :attr:`sum_names` order); with an encoder term the encoder FLOPs at
        ``encoder_price``, the model's (``None``: priced 0)."""
        if self.fits_groups:
            return model.predict_group_sums(sums, 1)  # models of this mode have their reference size
        if self.prior_encoder_price is None:
            return model.predict_sums(sums)
        sums = np.asarray(sums)
        price = 0.0 if encoder_price is None else encoder_price
        return model.predict_sums(sums[..., :-1]) + price * sums[..., -1].astype(np.float64)

    def state_dict(self) -> dict[str, Any]:
        """Observations (``[*sums, seconds, step]`` each) and counters, plain Python values."""
        return {
            "version": self.STATE_VERSION,
            "sums": list(self.sum_names),
            "window": self.prior.window,
            "points": [[*sums, t, k] for sums, t, k in self._points],
            "skipped": self.skipped,
            "observed": self.observed,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the settings stay this calibrator's; a smaller window
        keeps the newest points).

        Raises:
            ResumeError: Another version, sums of another kind (a group cost's into a static
                one's or back), another sliding window, or a malformed state (named).
        """
        if not isinstance(state, Mapping):
            what = type(state).__name__
            raise ResumeError(f"calibrator state must be a CostCalibrator.state_dict() (a mapping), got {what}")
        if state.get("version") != self.STATE_VERSION:
            raise ResumeError(f"calibrator state version {state.get('version')!r} is not {self.STATE_VERSION}")
        names, window = tuple(state.get("sums") or ()), state.get("window")
        if names != self.sum_names or window != self.prior.window:
            raise ResumeError(
                f"calibrator state holds sums {names} for window={window!r}; this calibrator keeps "
                f"{self.sum_names} for window={self.prior.window!r} (its prior {self.prior!r})"
            )
        try:
            points = [parse_point(item, self.num_sums) for item in state["points"]]
            skipped, observed = parse_count(state["skipped"]), parse_count(state["observed"])
            last = state.get("last_step")
            last_step = None if last is None else int(last)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"CostCalibrator state is malformed: {exc}") from None
        for i, (sums, t, _) in enumerate(points):
            problem = self._check_sums(sums) if math.isfinite(t) and t > 0 else f"the time {t!r}"
            if problem is not None:
                raise ResumeError(f"CostCalibrator state is malformed: point {i} ({[*sums, t]}) has {problem}")
        self._points = collections.deque(points, maxlen=self.window)
        self.skipped, self.observed, self.last_step = skipped, observed, last_step
        self._model = self._encoder_price = None

    def copy(self) -> CostCalibrator:
        """A calibrator with the same settings and observations."""
        other = CostCalibrator(self.prior, **self.settings())
        other.load_state_dict(self.state_dict())
        return other


def _plan(schedule: object) -> Schedule:
    if not isinstance(schedule, Schedule):
        raise ConfigError(f"a group cost's calibrator times seqpack Schedules, got a {type(schedule).__name__}")
    return schedule


def _column(name: str, value: object, where: str) -> np.ndarray:
    """One integer per microbatch (bools pass for ``spans``)."""
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
