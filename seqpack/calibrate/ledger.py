"""TimingLedger: the wrapper's bookkeeping of microbatch times, from ``record_times`` to the
calibrator; :class:`Measurement`, one step whose times every rank holds. How the times
travel, and the lag: docs/cost_models.md, "How the times travel, and the lag".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqpack._logging import warn_once
from seqpack.calibrate.calibrator import CostCalibrator
from seqpack.calibrate.points import MAX_SECONDS, MIN_SECONDS, check_seconds, microbatch_sums
from seqpack.calibrate.words import ABSENT, MISSING, decode_seconds, encode_seconds
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ResumeError, SeqpackError
from seqpack.options import Sync
from seqpack.schedulers.objective import step_objective
from seqpack.validation import check_choice, check_int

__all__ = ["Measurement", "TimingLedger", "check_times", "microbatch_sums"]

logger = logging.getLogger(__name__)

_LOCAL_KEPT = 64  # recorded times kept per rank, in steps (for late snapshots under prefetch)


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
    model: Any  # CostModel | None

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1``, when both are known."""
        if self.measured is None or self.predicted is None or self.measured <= 0:
            return None
        return self.predicted / self.measured - 1.0


@dataclasses.dataclass
class _Slot:
    """A scheduled step waiting for its times."""

    step: int
    sums: np.ndarray  # int64 [M, dp, num_sums]: S, SS (and SW) of microbatch m of replica d (padded lengths),
    # or under dynamic CP the (size, S, SS, spans) of its group (a calibrator fitting groups); per rank:
    # [M, dp*copies, 4]
    model: Any  # the CostModel it was scheduled with, when it predicts seconds
    groups: np.ndarray | None = None  # per rank: int64 [M, dp*copies], the group of each rank (None: per replica)
    copies: int = 1  # time columns per replica and microbatch: 1, or cp when each CP rank's time travels
    encoder_price: float | None = None  # the price of an encoder FLOP it was scheduled at (an encoder term)


def check_times(seconds: object, num_microbatches: int, *, step: int, dp_rank: int) -> np.ndarray:
    """What ``Step.record_times`` takes: ``seconds`` as float64 ``[num_microbatches]``. NaN,
    infinite or non-positive times pass (the calibrator skips and counts them; NaN marks an
    untimed microbatch).

    Raises:
        SeqpackTypeError: A time that is no real number (a string, a bool, ``None``), named.
        ConfigError: Not one time per microbatch.
    """
    values = check_seconds("seconds", seconds, f" (record_times of step {step} on DP rank {dp_rank})")
    if values.shape[0] != num_microbatches:
        raise ConfigError(
            f"record_times got {values.shape[0]} times for step {step} on DP rank {dp_rank}, which ran "
            f"{num_microbatches} microbatches: pass one time per microbatch"
        )
    return values


class TimingLedger:
    """The wrapper's bookkeeping of microbatch times, between ``record`` and ``observe``.

    Per scheduled step it keeps the microbatch layout; :meth:`record` takes this rank's times
    (``Step.record_times``, on the training thread); :meth:`outgoing` gives this rank's words
    for every pending step and :meth:`incoming` takes the combined ``[dp, words]`` table back,
    observing every step that is fully timed or ``window`` steps old. Every rank sees the same
    table, so every rank's calibrator makes the same observations. With prefetch ``k`` pass
    ``window >= k + 2``, take a :meth:`snapshot` with every prepared step and save
    ``state_dict(snapshot_of_the_last_step_handed_over)``.

    Thread-safe: :meth:`record` runs on the training thread, the rest where steps are made.
    """

    def __init__(
        self,
        calibrator: CostCalibrator,
        *,
        dp_size: int,
        dp_rank: int,
        window: int = 2,
        sync: str = Sync.LOCKSTEP,
        copies: int | None = None,
        copy_rank: int = 0,
    ) -> None:
        self.calibrator = calibrator
        self.dp_size = check_int("dp_size", dp_size, minimum=1)
        self.dp_rank = check_int("dp_rank", dp_rank, minimum=0)
        self.window = check_int("window", window, minimum=1)
        self.sync = check_choice("sync", sync, Sync)
        # copies (dynamic CP: cp ranks per replica): each rank's times travel in their own
        # column (copy_rank; ABSENT in the others); None: one column per replica, the copies'
        # slowest time.
        self.per_rank = copies is not None
        self.copies = 1 if copies is None else check_int("copies", copies, minimum=1)
        self.copy_rank = check_int("copy_rank", copy_rank, minimum=0, maximum=self.copies - 1)
        self._slots: dict[int, _Slot] = {}
        self._local: dict[int, np.ndarray] = {}  # this rank's recorded times by step (recent ones)
        self._lock = threading.Lock()
        self.error: str | None = None  # a bad record_times on this rank, sent with the next gather
        self.last: Measurement | None = None
        self.late = 0  # times recorded for a step that had already left the ledger

    def add_step(
        self,
        step: int,
        sums: np.ndarray,
        model: Any,
        groups: np.ndarray | None = None,
        encoder_price: float | None = None,
    ) -> None:
        """Register a scheduled step (``sums``: ``CostCalibrator.schedule_sums`` of its
        schedule) and the model it was scheduled with (``None`` when it does not predict
        seconds), with an encoder term the price of an encoder FLOP it was scheduled at. With
        ``copies``: ``sums`` and ``groups`` per rank (``CostCalibrator.rank_sums``)."""
        sums, width = np.asarray(sums, dtype=np.int64), self.calibrator.num_sums
        if groups is not None:
            groups = np.asarray(groups, dtype=np.int64)
            ranks = self.dp_size * self.copies
            if sums.ndim != 3 or sums.shape[1:] != (ranks, width) or groups.shape != sums.shape[:2]:
                raise ConfigError(
                    f"per-rank sums must have shape [M, {ranks}, {width}] and groups [M, {ranks}], got "
                    f"{sums.shape} and {groups.shape}"
                )
            with self._lock:
                self._slots[step] = _Slot(step, sums, model, groups, self.copies)
            return
        if sums.ndim != 3 or sums.shape[1:] != (self.dp_size, width):
            raise ConfigError(
                f"sums must have shape [M, {self.dp_size}, {width}] (CostCalibrator.schedule_sums(schedule): "
                f"{self.calibrator.sum_names}), got {sums.shape}"
            )
        with self._lock:
            self._slots[step] = _Slot(step, sums, model, encoder_price=encoder_price)

    def add_schedule(self, step: int, schedule: Any, model: Any, encoder_price: float | None = None) -> None:
        """:meth:`add_step` with the calibrator's ``schedule_sums`` (or ``rank_sums``) of
        ``schedule``."""
        if self.per_rank:
            sums, groups = self.calibrator.rank_sums(schedule)
            self.add_step(step, sums, model, groups)
        else:
            sums = self.calibrator.schedule_sums(schedule, encoder_price)
            self.add_step(step, sums, model, encoder_price=encoder_price)

    def pending(self) -> list[int]:
        with self._lock:
            return sorted(self._slots)

    def outgoing(self, upto: int | None = None) -> np.ndarray:
        """This rank's words for every pending step, oldest first (``sum_t M_t`` int64).

        Args:
            upto: Send times of steps ``<= upto`` only (later ones as missing, even when
                already recorded): under prefetch this makes what travels independent of the
                training thread's timing.
        """
        with self._lock:
            parts = []
            for t in sorted(self._slots):
                slot = self._slots[t]
                m = slot.sums.shape[0]
                local = self._local.get(t)
                if local is None or (upto is not None and t > upto):
                    words = np.full(m, MISSING, dtype=np.int64)
                else:
                    words = encode_seconds(local)
                if slot.copies > 1:  # [M, copies]: this rank's column, ABSENT in the others
                    wide = np.full((m, slot.copies), ABSENT, dtype=np.int64)
                    wide[:, self.copy_rank] = words
                    words = wide.reshape(-1)
                parts.append(words)
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def width(self) -> int:
        with self._lock:
            return sum(slot.sums.shape[0] * slot.copies for slot in self._slots.values())

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
                m = slot.sums.shape[0] * slot.copies
                words = table[:, offset : offset + m]  # [dp, M_t * copies]
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
        """Feed the calibrator with one step's combined words ``[dp, M * copies]``."""
        m, k = slot.sums.shape[0], slot.copies
        words = words.reshape(self.dp_size, m, k).transpose(1, 0, 2).reshape(m, self.dp_size * k)  # [M, dp*copies]
        seconds = decode_seconds(words.reshape(-1)).reshape(words.shape)
        present = (words != MISSING) & (words != ABSENT)  # INVALID ones are observed, skipped, counted
        if slot.groups is None:
            rows = [tuple(int(v) for v in row) for row in slot.sums[present].tolist()]
            self.calibrator._add(rows, seconds[present].tolist(), slot.step)
        else:
            self.calibrator._add(*_group_points(slot.groups, slot.sums, seconds, present), slot.step)
        # A time no clock measures (outside [MIN_SECONDS, MAX_SECONDS]: skipped and counted by
        # the calibrator) is no measurement either: its step time would overflow.
        seconds[~((seconds >= MIN_SECONDS) & (seconds <= MAX_SECONDS))] = np.nan
        predicted = None
        if slot.model is not None:
            predicted_times = self.calibrator.predict_sums(slot.model, slot.sums, slot.encoder_price)
            if k > 1:
                predicted_times = predicted_times.reshape(m, self.dp_size, k).max(axis=2)
            predicted = step_objective(predicted_times, self.sync)
        if k > 1:  # a replica's microbatch takes as long as its slowest rank (NaN stays NaN)
            seconds = seconds.reshape(m, self.dp_size, k).max(axis=2)
        complete = bool(np.isfinite(seconds).all())
        measured = step_objective(seconds, self.sync) if complete else None
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

    def record(self, step: int, seconds: Sequence[float] | np.ndarray, num_microbatches: int) -> None:
        """This rank's times of ``step``, one per microbatch (:func:`check_times`), once.

        A refused call keeps nothing and is also sent as this rank's error with the next
        gather, so every rank fails the next step with its message.

        Raises:
            SeqpackTypeError: A time that is no real number (a string, a bool).
            ConfigError: Not ``num_microbatches`` times, or times of ``step`` already
                recorded (the first call's are kept: a step is reported once).
        """
        try:
            values = check_times(seconds, num_microbatches, step=step, dp_rank=self.dp_rank)
            with self._lock:
                if step in self._local:
                    raise ConfigError(
                        f"record_times was called twice for step {step} on DP rank {self.dp_rank}: report each step's "
                        "times once (the first call's are kept)"
                    )
        except SeqpackError as exc:
            with self._lock:
                self.error = self.error or str(exc)
            raise
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

    def snapshot(self) -> dict[str, Any]:
        """The producer side of :meth:`state_dict` (calibrator, pending steps, last
        measurement), without this rank's recorded times."""
        with self._lock:
            slots = [
                {
                    "step": slot.step,
                    "sums": slot.sums.tolist(),
                    **({} if slot.groups is None else {"groups": slot.groups.tolist()}),
                    "model": _model_to_list(slot.model),
                    **({} if slot.encoder_price is None else {"encoder_price": slot.encoder_price}),
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
                "model": _model_to_list(last.model),
            },
        }

    def state_dict(self, snapshot: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The calibrator's state, the pending steps with this rank's times of them and the
        last measurement: a resumed iterator sends and observes exactly what this one would have.

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
        width = self.calibrator.num_sums
        try:
            slots, local = {}, {}
            for item in state.get("pending", []):
                step = int(item["step"])
                model = _model_from(item.get("model"))
                if (item.get("groups") is not None) != self.per_rank:
                    layout = "per rank" if item.get("groups") is not None else "per replica"
                    raise ValueError(f"pending step {step} is laid out {layout}, this ledger's steps are not")
                if self.per_rank:
                    ranks = self.dp_size * self.copies
                    groups = np.asarray(item["groups"], dtype=np.int64).reshape(-1, ranks)
                    sums = np.asarray(item["sums"], dtype=np.int64).reshape(-1, ranks, width)
                    slots[step] = _Slot(step, sums, model, groups, self.copies)
                else:
                    sums = np.asarray(item["sums"], dtype=np.int64).reshape(-1, self.dp_size, width)
                    price = item.get("encoder_price")
                    slots[step] = _Slot(step, sums, model, encoder_price=None if price is None else float(price))
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


def _group_points(
    groups: np.ndarray, sums: np.ndarray, seconds: np.ndarray, present: np.ndarray
) -> tuple[list[tuple[int, ...]], list[float]]:
    """One observation per round and group from per-rank ``[M, ranks]`` tables: the group's
    sums and its slowest rank's time (NaN when one of its ranks sent no valid time); a group
    none of whose ranks reported is left out. The same order on every rank."""
    rows: list[tuple[int, ...]] = []
    times: list[float] = []
    for r in range(groups.shape[0]):
        ids = groups[r]
        for g in np.unique(ids).tolist():
            cols = np.flatnonzero(ids == g)
            if not present[r, cols].any():
                continue
            t = seconds[r, cols]
            valid = bool(present[r, cols].all() and np.isfinite(t).all())
            rows.append(tuple(int(v) for v in sums[r, cols[0]].tolist()))
            times.append(float(t.max()) if valid else math.nan)
    return rows, times


def _model_to_list(model: CostModel | None) -> list[Any] | None:
    """A model as plain values for a resume state (every field in order; ``None`` stays)."""
    return None if model is None else list(dataclasses.astuple(model))


def _model_from(values: Any) -> CostModel | None:
    """Inverse of :func:`_model_to_list`."""
    if values is None:
        return None
    fields = dataclasses.fields(CostModel)
    if len(values) != len(fields):
        raise ValueError(f"a saved cost model has {len(fields)} values, got {len(values)}")
    return CostModel(*values)
