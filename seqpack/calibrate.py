"""Online calibration: fit the scheduler's cost model to measured microbatch times.

:class:`CostCalibrator` keeps a sliding window of timed microbatches (each reduced to its
exact length sums ``S = sum(s)`` and ``SS = sum(s**2)``) and fits
``seconds ~ constant + linear*S + quadratic*SS`` with :meth:`CostModel.fit
<seqpack.cost.CostModel.fit>`'s exact, outlier-resistant NNLS. Until it holds
``min_points`` timings its model is the prior (e.g. the FLOPs model). The fit is a pure
function of the observations, bit for bit (see :func:`seqpack.cost.nnls_fit`), so ranks
that observe the same timings hold the same model.

Observations are keyed by step: ``observe(lengths, seconds, step=s)`` says "these are the
times of step ``s``". The wrapper (``wrap_data_iterator(..., calibrate=True)``) feeds its
calibrator with a lag: the times of step ``t`` travel with a later step's length gather and
are observed once every rank holds them (:class:`TimingLedger`). The calibrator does not
care how late a step arrives; ``last_step`` says the newest step it has seen.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from seqpack._logging import warn_once
from seqpack.cost import CostModel, nnls_fit, robust_weights_fit
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.options import Sync
from seqpack.stats import step_objective
from seqpack.validation import check_bool, check_choice, check_int

__all__ = [
    "CostCalibrator",
    "Measurement",
    "TimingLedger",
    "ABSENT",
    "INVALID",
    "MISSING",
    "decode_seconds",
    "encode_seconds",
    "microbatch_sums",
    "step_time",
]

logger = logging.getLogger(__name__)

_LOCAL_KEPT = 64  # recorded times kept per rank, in steps (for late snapshots under prefetch)

# Words of the wire encoding of one time (int64, see encode_seconds). The copies of a
# replica combine their words with an int64 MAX: a copy that has not recorded its time yet
# (MISSING, the largest word) holds the step back until every copy has, the slowest valid
# time wins over the others, and ranks that keep no times (ABSENT, the smallest) never count.
MISSING = (1 << 63) - 1  # not recorded (yet) on this rank
INVALID = -2  # recorded, but NaN, infinite or <= 0
ABSENT = -(1 << 63)  # this rank keeps no times (e.g. a middle pipeline stage)


def _sums(lengths: Sequence[int] | np.ndarray, where: str) -> tuple[int, int]:
    """Exact ``(S, SS)`` of one microbatch's lengths."""
    arr = np.asarray(lengths).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise SeqpackTypeError(f"{where} lengths must be integers, got {arr.dtype}")
    values = [int(v) for v in arr.tolist()]
    if any(v < 0 for v in values):
        raise ConfigError(f"{where} has a negative length: {min(values)}")
    return sum(values), sum(v * v for v in values)


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
            coefficient) unless the 3-coefficient fit explains them significantly better
            (an F-test, ``F > 4`` with 2 extra coefficients: about 2% false alarms). When
            the clock is the prior's shape (FLOPs on a compute-bound GPU), the schedules
            then stay exactly the prior's instead of following noise in the fit.

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
        self.shape = "prior"  # after a fit: "prior" (the prior rescaled) or "fitted" (3 coefficients)
        # Each point: (S, SS, seconds, step); S and SS exact ints.
        self._points: collections.deque[tuple[int, int, float, int]] = collections.deque(maxlen=self.window)
        self.skipped = 0  # timings that were NaN, infinite or <= 0
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
            seconds: Per microbatch, its measured time. NaN, infinite or non-positive
                times are skipped and counted in :attr:`skipped`.
            step: The training step these times belong to (for :attr:`last_step`; steps
                below ``warmup_steps`` are left out).

        Returns:
            How many timings were kept (0 for a warm-up step).

        Raises:
            ConfigError: ``microbatch_lengths`` and ``seconds`` differ in length, or a
                negative length.
        """
        times = np.asarray(seconds, dtype=np.float64).reshape(-1)
        if len(microbatch_lengths) != times.shape[0]:
            raise ConfigError(f"{len(microbatch_lengths)} microbatches but {times.shape[0]} timings")
        if step is not None:
            step = check_int("step", step, minimum=0)
        rows = [_sums(mb, f"microbatch {i}") for i, mb in enumerate(microbatch_lengths)]
        return self._add(rows, times.tolist(), step)

    def _add(self, rows: Sequence[tuple[int, int]], times: Sequence[float], step: int | None) -> int:
        """Observe microbatches given as exact ``(S, SS)`` sums."""
        if step is not None and step < self.warmup_steps:
            if self.last_step is None or step > self.last_step:
                self.last_step = step
            return 0
        kept = 0
        for (s, ss), t in zip(rows, times, strict=True):
            if not math.isfinite(t) or t <= 0:
                self.skipped += 1
                continue
            self._points.append((s, ss, float(t), -1 if step is None else step))
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
        features = np.array([(1.0, float(s), float(ss)) for s, ss, _, _ in points], dtype=np.float64)
        y = np.array([t for _, _, t, _ in points], dtype=np.float64)
        if self.robust:
            coef, weights = robust_weights_fit(features, y)
        else:
            coef, weights = nnls_fit(features, y), np.ones_like(y)
        self.shape = "fitted"
        full = CostModel.from_coefficients(coef)
        if self.keep_prior_shape:
            scaled = _scaled_prior(self.prior, features, y, weights, coef)
            if scaled is not None:
                self.shape = "prior"
                return scaled
        return full

    # -- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Observations and counters (plain Python values)."""
        return {
            "version": self.STATE_VERSION,
            "points": [list(p) for p in self._points],
            "skipped": self.skipped,
            "observed": self.observed,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the settings stay this calibrator's; a smaller window
        keeps the newest points).

        Raises:
            ResumeError: Not a calibrator state, or another version.
        """
        if not isinstance(state, Mapping) or state.get("version") != self.STATE_VERSION:
            got = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeError(f"calibrator state must be a CostCalibrator.state_dict() of version 1, got {got!r}")
        try:
            points = [(int(s), int(ss), float(t), int(k)) for s, ss, t, k in state["points"]]
            skipped, observed = int(state["skipped"]), int(state["observed"])
            last = state.get("last_step")
            last_step = None if last is None else int(last)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"calibrator state is malformed: {exc}") from None
        if any(s < 0 or ss < 0 or not (math.isfinite(t) and t > 0) for s, ss, t, _ in points):
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


_F_CRITICAL = 4.0  # F(2, many) beyond this: the 3-coefficient fit is significantly better (p ~ 0.02)


def _scaled_prior(
    prior: CostModel, features: np.ndarray, y: np.ndarray, weights: np.ndarray, coef: np.ndarray
) -> CostModel | None:
    """The prior times ``alpha`` (relative least squares under the fit's robust weights),
    unless the full fit ``coef`` beats it significantly (F-test on the two extra
    coefficients); ``None`` then. Sums are ``math.fsum``: the same bits on every rank."""
    p = prior.constant * features[:, 0] + prior.linear * features[:, 1] + prior.quadratic * features[:, 2]
    base = weights / (y * y)
    denominator = math.fsum(base * p * p)
    if denominator <= 0:
        return None
    alpha = math.fsum(base * p * y) / denominator
    if not (math.isfinite(alpha) and alpha > 0):
        return None
    full = coef[0] * features[:, 0] + coef[1] * features[:, 1] + coef[2] * features[:, 2]
    sse_scaled = math.fsum(weights * ((y - alpha * p) / y) ** 2)
    sse_full = math.fsum(weights * ((y - full) / y) ** 2)
    dof = int(np.count_nonzero(weights > 0)) - 3
    if dof <= 0:
        return None
    if sse_full <= 0:
        f_value = math.inf if sse_scaled > 1e-24 else 0.0
    else:
        f_value = ((sse_scaled - sse_full) / 2) / (sse_full / dof)
    if f_value > _F_CRITICAL:
        return None
    return CostModel.from_coefficients([alpha * prior.constant, alpha * prior.linear, alpha * prior.quadratic])


# -- step times -----------------------------------------------------------------------------


def step_time(seconds: np.ndarray, sync: str | None) -> float:
    """Step time of per-microbatch times ``[M, dp]``: ``sum_m max_d`` (lockstep, also for
    ``None``) or ``max_d sum_m`` (replica)."""
    return step_objective(seconds, Sync.LOCKSTEP if sync is None else sync)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One step whose microbatch times every rank holds.

    Attributes:
        step: The step.
        seconds: ``[M, dp]`` times (NaN where missing or invalid).
        measured: Measured step time (``None`` unless every microbatch was timed).
        predicted: Step time the model the step was scheduled with predicts (``None`` when
            that model was not in seconds: an unfitted FLOPs prior).
        model: The model the step was scheduled with.
    """

    step: int
    seconds: np.ndarray
    measured: float | None
    predicted: float | None
    model: CostModel | None

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1``, when both are known."""
        if self.measured is None or self.predicted is None or self.measured <= 0:
            return None
        return self.predicted / self.measured - 1.0


def encode_seconds(seconds: Sequence[float] | np.ndarray) -> np.ndarray:
    """Times as int64 words for the wire: the IEEE-754 bits of a valid time (positive
    doubles order like their bits, so an int64 MAX reduce picks the largest time),
    :data:`INVALID` for NaN, infinite or <= 0, :data:`MISSING` stays missing."""
    values = np.asarray(seconds, dtype=np.float64).reshape(-1)
    valid = np.isfinite(values) & (values > 0)
    words = np.where(valid, values, 1.0).view(np.int64).copy()
    words[~valid] = INVALID
    return words


def decode_seconds(words: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode_seconds`: float64 times, NaN where missing or invalid."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    out = words.view(np.float64).copy()
    out[(words < 0) | (words == MISSING)] = np.nan
    return out


@dataclasses.dataclass
class _Slot:
    """A scheduled step waiting for its times."""

    step: int
    sums: np.ndarray  # int64 [M, dp, 2]: S and SS of microbatch m of replica d (padded lengths)
    model: CostModel | None  # the model it was scheduled with, when fitted


def microbatch_sums(schedule: Any) -> np.ndarray:
    """int64 ``[M, dp, 2]``: ``S`` and ``SS`` of every microbatch's padded lengths, as the
    rank runs it: an empty cell runs a padding-only filler of ``pad_multiple`` tokens (exact
    while ``capacity**2 < 2**63``)."""
    from seqpack.thd import padded_lengths

    padded = padded_lengths(schedule.lengths, schedule.pad_multiple).astype(np.int64)
    ids, cell, counts = schedule._flat
    out = np.zeros((counts.shape[0], 2), dtype=np.int64)
    np.add.at(out[:, 0], cell, padded[ids])
    np.add.at(out[:, 1], cell, padded[ids] * padded[ids])
    out[counts == 0] = (schedule.pad_multiple, schedule.pad_multiple**2)
    return out.reshape(schedule.num_microbatches, schedule.dp_size, 2)


class TimingLedger:
    """The wrapper's bookkeeping of microbatch times, between ``record`` and ``observe``.

    Per scheduled step ``t`` it keeps the microbatch layout (from the schedule every rank
    holds). This rank's times of step ``t`` arrive with :meth:`record` (from
    ``Step.record_times``, on the training thread). Every later step ``s`` sends, for each
    pending step ``t``, this rank's times as int64 words (:meth:`outgoing`, one row of
    ``sum_t M_t`` words); the ranks combine them (DP gather, then an int64 MAX over the
    copies of each replica) and :meth:`incoming` hands the combined ``[dp, words]`` table
    back: a step all of whose microbatches are timed, or that has waited ``window``
    steps, is observed by the calibrator and leaves the ledger. Every rank sees the same
    table, so every rank's calibrator makes the same observations.

    Lag: with times recorded before the next ``next()``, step ``t``'s times travel with
    step ``t+1`` and the calibrator holds them once step ``t+1`` is scheduled: the
    schedule of step ``n+1`` uses the model fitted through step ``n-1``. Times recorded
    later (a :class:`~seqpack.timing.MicrobatchTimer` reads CUDA events one step late) wait
    up to ``window`` steps. With prefetch ``k``, step ``s`` is produced while the training
    loop is ``k`` steps behind: pass ``window >= k + 2``, take a :meth:`snapshot` with every
    prepared step and save ``state_dict(snapshot_of_the_last_step_handed_over)``.

    Thread-safe: :meth:`record` runs on the training thread, the rest where steps are made.
    """

    def __init__(
        self, calibrator: CostCalibrator, *, dp_size: int, dp_rank: int, window: int = 2, sync: str | None = None
    ) -> None:
        self.calibrator = calibrator
        self.dp_size = check_int("dp_size", dp_size, minimum=1)
        self.dp_rank = check_int("dp_rank", dp_rank, minimum=0)
        self.window = check_int("window", window, minimum=1)
        self.sync = None if sync is None else check_choice("sync", sync, Sync)
        self._slots: dict[int, _Slot] = {}
        self._local: dict[int, np.ndarray] = {}  # this rank's recorded times by step (recent ones)
        self._lock = threading.Lock()
        self.error: str | None = None  # a bad record_times on this rank, sent with the next gather
        self.last: Measurement | None = None
        self.late = 0  # times recorded for a step that had already left the ledger

    # -- producer side (the thread that makes steps) --------------------------------------------

    def add_step(self, step: int, sums: np.ndarray, model: CostModel | None) -> None:
        """Register a scheduled step (``sums``: :func:`microbatch_sums` of its schedule) and
        the model it was scheduled with (``None`` when it does not predict seconds)."""
        sums = np.asarray(sums, dtype=np.int64)
        if sums.ndim != 3 or sums.shape[1:] != (self.dp_size, 2):
            raise ConfigError(f"sums must have shape [M, {self.dp_size}, 2], got {sums.shape}")
        with self._lock:
            self._slots[step] = _Slot(step, sums, model)

    def pending(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)

    def outgoing(self, upto: int | None = None) -> np.ndarray:
        """This rank's words for every pending step, oldest first (``sum_t M_t`` int64).

        Args:
            upto: Send times of steps ``<= upto`` only (later ones as missing, even when
                already recorded). Under prefetch the training thread records step ``t``'s
                times while the producer may already gather step ``t + 1 + k``: sending only
                steps ``<= s - 1 - k`` with step ``s`` makes what travels independent of that
                race, so a run calibrates the same way whatever the threads' timing.
        """
        with self._lock:
            parts = []
            for t in sorted(self._slots):
                slot = self._slots[t]
                m = slot.sums.shape[0]
                local = self._local.get(t)
                if local is None or (upto is not None and t > upto):
                    parts.append(np.full(m, MISSING, dtype=np.int64))
                else:
                    parts.append(encode_seconds(local))
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def width(self) -> int:
        with self._lock:
            return sum(slot.sums.shape[0] for slot in self._slots.values())

    def take_error(self) -> str | None:
        with self._lock:
            error, self.error = self.error, None
            return error

    def incoming(self, step: int, table: np.ndarray) -> list[Measurement]:
        """Absorb the combined words ``[dp, width]`` gathered with step ``step``; observe
        (and drop) every pending step that is fully timed or ``window`` steps old.

        Returns:
            The steps observed, oldest first.
        """
        table = np.asarray(table, dtype=np.int64).reshape(self.dp_size, -1)
        done = []
        with self._lock:
            offset = 0
            for t in sorted(self._slots):
                slot = self._slots[t]
                m = slot.sums.shape[0]
                words = table[:, offset : offset + m]  # [dp, M_t]
                offset += m
                complete = bool(((words >= 0) & (words != MISSING)).all())
                if not (complete or t <= step - self.window):
                    continue
                del self._slots[t]
                done.append((slot, words))
            if offset != table.shape[1]:
                raise ConfigError(f"timing table has {table.shape[1]} words per rank but {offset} are pending")
        out = [self._observe(slot, words) for slot, words in done]
        measured = [m for m in out if m.measured is not None]
        if measured:
            self.last = measured[-1]
        return out

    def _observe(self, slot: _Slot, words: np.ndarray) -> Measurement:
        """Feed the calibrator with one step's combined words ``[dp, M]``."""
        seconds = decode_seconds(words.T.reshape(-1)).reshape(words.shape[1], words.shape[0])  # [M, dp]
        present = (words.T != MISSING) & (words.T != ABSENT)  # [M, dp]; INVALID ones are observed, skipped, counted
        rows = [(int(s), int(ss)) for s, ss in slot.sums[present].tolist()]
        self.calibrator._add(rows, seconds[present].tolist(), slot.step)
        complete = bool(np.isfinite(seconds).all())
        measured = step_time(seconds, self.sync) if complete else None
        predicted = None
        if slot.model is not None:
            model = slot.model
            costs = model.constant + model.linear * slot.sums[..., 0] + model.quadratic * slot.sums[..., 1]
            predicted = step_time(costs.astype(np.float64), self.sync)
        if not complete:
            missing = int(np.count_nonzero(~np.isfinite(seconds)))
            warn_once(
                logger,
                "incomplete-times",
                "step %d: %d of %d microbatch times were missing or invalid when the calibrator took them (record "
                "times before the next steps, or raise the ledger window); further incomplete steps are not reported",
                slot.step,
                missing,
                seconds.size,
            )
        return Measurement(slot.step, seconds, measured, predicted, slot.model)

    # -- training side ------------------------------------------------------------------------

    def record(self, step: int, seconds: Sequence[float] | np.ndarray, num_microbatches: int) -> None:
        """This rank's times of ``step``, one per microbatch.

        Raises:
            ConfigError: Not ``num_microbatches`` times (also sent as this rank's error
                with the next gather, so every rank fails the next step).
        """
        values = np.asarray(seconds, dtype=np.float64).reshape(-1)
        if values.shape[0] != num_microbatches:
            message = (
                f"record_times got {values.shape[0]} times for step {step} on DP rank {self.dp_rank}, which ran "
                f"{num_microbatches} microbatches: pass one time per microbatch"
            )
            with self._lock:
                self.error = self.error or message
            raise ConfigError(message)
        with self._lock:
            self._local[step] = values.copy()
            for old in [t for t in self._local if t < step - _LOCAL_KEPT]:
                del self._local[old]
            if step not in self._slots:
                self.late += 1
                warn_once(
                    logger,
                    "late-times",
                    "times of step %d arrived after the calibrator stopped waiting for them; they are dropped (record "
                    "them sooner, or raise the ledger window); later ones are counted in TimingLedger.late",
                    step,
                )

    # -- resume -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The producer side of :meth:`state_dict` (calibrator, pending steps, last
        measurement), without this rank's recorded times. Under prefetch, take one with
        every prepared step and pass the one of the last step handed over to
        :meth:`state_dict`: the ledger itself is ahead of the training loop."""
        with self._lock:
            slots = [
                {
                    "step": slot.step,
                    "sums": slot.sums.tolist(),
                    "model": None if slot.model is None else _model_list(slot.model),
                }
                for slot in (self._slots[t] for t in sorted(self._slots))
            ]
        last = self.last
        return {
            "calibrator": self.calibrator.state_dict(),
            "pending": slots,
            "last": None
            if last is None
            else {
                "step": last.step,
                "measured": last.measured,
                "predicted": last.predicted,
                "model": None if last.model is None else _model_list(last.model),
            },
        }

    def state_dict(self, snapshot: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The calibrator's state, the steps still waiting for their times with this rank's
        own times of them (those recorded so far) and the last measurement: a resumed
        iterator sends and observes exactly what this one would have.

        Args:
            snapshot: A :meth:`snapshot` taken earlier (prefetch); default: now.
        """
        state = dict(self.snapshot() if snapshot is None else snapshot)
        with self._lock:
            state["pending"] = [
                dict(item, local=None if item["step"] not in self._local else self._local[item["step"]].tolist())
                for item in state["pending"]
            ]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ResumeError: Not a ledger state, or steps laid out for another ``dp_size``.
        """
        if not isinstance(state, Mapping) or "calibrator" not in state:
            raise ResumeError("calibration state must be a TimingLedger.state_dict() (it has no 'calibrator')")
        try:
            slots, local = {}, {}
            for item in state.get("pending", []):
                step = int(item["step"])
                sums = np.asarray(item["sums"], dtype=np.int64).reshape(-1, self.dp_size, 2)
                slots[step] = _Slot(step, sums, _model_from(item.get("model")))
                if item.get("local") is not None:
                    local[step] = np.asarray(item["local"], dtype=np.float64).reshape(-1)
            last = state.get("last")
            measurement = None
            if isinstance(last, Mapping):
                measurement = Measurement(
                    int(last["step"]),
                    np.zeros((0, self.dp_size)),
                    last.get("measured"),
                    last.get("predicted"),
                    _model_from(last.get("model")),
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"calibration state is malformed: {exc}") from None
        self.calibrator.load_state_dict(state["calibrator"])
        with self._lock:
            self._slots, self._local = slots, local
            self.last = measurement
            self.error = None


def _model_list(model: CostModel) -> list[float]:
    return [model.linear, model.quadratic, model.constant]


def _model_from(values: Any) -> CostModel | None:
    return None if values is None else CostModel(*(float(v) for v in values))
