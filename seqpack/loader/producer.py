"""StepProducer: one step of the wrapper on this rank, from reading samples to the
:class:`~seqpack.loader.step.Ready` that ``next()`` hands over.

Every rank calls :meth:`StepProducer.produce` once per step; its stages, in order, each
collective where it has a collective:

1. on ranks that read data, the phases (read, gather, schedule, agree, exchange, pack);
2. the copies of a replica agree on the outcome and compare schedule fingerprints;
3. under ``data_owner="tp0"``, the TP broadcast and the pipeline's agreement and broadcast;
4. stats, the device copy and the resume bookkeeping (:meth:`StepProducer._ready`);
5. every rank agrees on the outcome (:meth:`StepProducer._settle`).

A phase that fails on one rank becomes an error naming the rank and the phase, which the next
agreement carries to every rank. Calibration is data (:mod:`seqpack.loader.calibration`): a
``StepInput`` taken before the stages, the combined time words absorbed after them.
:meth:`StepProducer.produce` never raises.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import Any

from seqpack.calibrate import Measurement
from seqpack.collective import (
    Status,
    StepEnd,
    StepError,
    StepMessage,
    StepOk,
    agree,
    agree_axes,
    broadcast_pp,
    broadcast_tp,
)
from seqpack.collective.groups import this_rank
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SampleError, ScheduleError, StepFailed
from seqpack.loader import phases
from seqpack.loader.calibration import CalibrationState, StepInput, fill_stats, step_prediction
from seqpack.loader.config import PackingConfig
from seqpack.loader.cp_mode import CpMode
from seqpack.loader.labels import misaligned_step_message
from seqpack.loader.resume import ResumeState, Stateful
from seqpack.loader.step import DeviceCopy, Progress, Ready, Step, StepTrace, tensors_of
from seqpack.options import AXES, Axis, DataOwner
from seqpack.schedulers import Schedule, Scheduler
from seqpack.schedulers.minibatches import minibatch_loss_tokens
from seqpack.stats import StepStats
from seqpack.thd import SAMPLES_NOT_BATCHES, PackedBatch
from seqpack.topology import Topology

__all__ = ["StepProducer"]


@dataclasses.dataclass(frozen=True)
class _Planned:
    """A step as this rank planned it, before the exchange."""

    plan: Schedule
    bounds: list[int]  # microbatch offsets of the mini-batches
    fingerprint: int  # what the ranks compare (schedule, and the calibrated model)
    pool: list[phases.Sample]
    read: phases.ReadResult
    gathered: phases.Gathered


class StepProducer:
    """Prepares this rank's steps one at a time (see the module docstring). ``comm``: the
    topology whose groups the per-step collectives run on (the wrapper's own under prefetch);
    ``config``: resolved; ``stats_cost``: the cost model stats are measured in."""

    def __init__(
        self,
        data_iterator: Iterable[Mapping[str, Any]] | None,
        topology: Topology,
        comm: Topology,
        config: PackingConfig,
        scheduler: Scheduler,
        stats_cost: CostModel,
        *,
        reads: bool,
        copy: DeviceCopy,
        cp_mode: CpMode,
        calibration: CalibrationState,
    ) -> None:
        self.topology, self.comm, self.config = topology, comm, config
        self.cp_mode = cp_mode
        self.scheduler, self.stats_cost = scheduler, stats_cost
        self.reads = reads
        self.copy = copy
        self.source = data_iterator
        self.reader = None if data_iterator is None else phases.Reader(data_iterator, config.label_format, config.mrope)
        self.steps = 0  # steps prepared
        self.pool: list[phases.Sample] = []  # samples read and held back for the next step
        self.data_ended = False
        self.local_cause: BaseException | None = None  # this rank's own exception behind a step error
        self.shared_cause: BaseException | None = None  # the exception behind an error every rank decided alike
        self.calibration = calibration

    @property
    def started(self) -> bool:
        """A step has been prepared, or the data iterator read."""
        return self.steps > 0 or (self.reader is not None and self.reader.started)

    def produce(self) -> Ready:
        """Prepare the next step (the work of one ``next()`` without the hand-over), on the
        prefetch thread or inside ``next()``; never raises."""
        index = self.steps
        try:
            taken = self.calibration.take(index)  # the model to plan with, the time words to send
            trace = StepTrace(taken.blank)
            msg: StepMessage | None = None
            if self.reads:
                msg = self._agree_copies(self._reader_step(taken, trace), taken, trace)
            if self.config.data_owner == DataOwner.TP0:
                with trace.phase("broadcast"):
                    try:
                        msg = self._broadcast(msg, taken, trace)
                    except Exception as exc:  # after the broadcasts' collectives (the steps between are guarded)
                        msg = self._failed("broadcast", exc)
                trace.timings["broadcast"] -= trace.timings.get("wait", 0.0)
            assert msg is not None
            try:
                last = self.calibration.absorb(msg, taken, trace.times)  # the combined times, between steps
                trace.timings["total"] = time.perf_counter() - trace.start
                ready = self._ready(msg, trace, taken, last)
            except Exception as exc:  # delivery failed here: the closing agreement tells every rank
                self.steps = index
                ready = self._ready(self._failed("delivery", exc), trace, taken, None)
            return self._settle(ready)
        except BaseException as exc:  # raised by the next() of this step (Ctrl-C included), which fails the iterator
            return Ready(index, error=exc)

    def _settle(self, ready: Ready) -> Ready:
        """Every rank leaves the step with one outcome: a failure after the last agreement (a
        broadcast's receiver, delivery) reaches all. One small all-reduce per axis above 1."""
        msg = ready.message if isinstance(ready.message, StepError) else None
        status, message, origin = _outcome(msg)
        agreed = agree_axes(self.comm, AXES, status, message, None, what="steps", origin=origin)
        if agreed.status != Status.ERROR or (message, origin) == (agreed.message, agreed.rank):
            return ready
        if msg is None:
            self.steps = ready.index  # the step is not handed over
        mine = agreed.rank is not None and agreed.rank == this_rank()
        failed = StepError(ready.index, agreed.message or "", agreed.rank)
        return Ready(ready.index, message=failed, cause=self.local_cause if mine else None)

    def _reader_step(self, taken: StepInput, trace: StepTrace) -> StepMessage:
        """Read, gather, schedule, exchange and pack this rank's share of the step; every rank
        that reads agrees before the exchange, so none enters it without its peers."""
        planned = self._plan(taken, trace)
        msg = None if isinstance(planned, _Planned) else planned
        fingerprint = planned.fingerprint if isinstance(planned, _Planned) and self.config.check_schedule else None
        status, message, origin = _outcome(msg)
        axis = "dp" if self.cp_mode.lane else "plane"
        agreed = agree(status, message, self.cp_mode.exchange_group, fingerprint=fingerprint, axis=axis, origin=origin)
        if isinstance(planned, _Planned) and agreed.status == Status.OK:
            return self._place(planned, trace)
        return _with_status(msg or StepEnd(self.steps), agreed.status, agreed.message, agreed.rank)

    def _plan(self, taken: StepInput, trace: StepTrace) -> _Planned | StepEnd | StepError:
        """Read, gather (with ``taken``'s time words) and schedule (with its model): the
        step's plan, or how the step ends on this rank."""
        t, step, config = self.comm, self.steps, self.config
        self.local_cause = self.shared_cause = None
        error = columns = None
        read = phases.ReadResult([], exhausted=self.data_ended)
        with trace.phase("read"):
            assert self.reader is not None
            try:
                if not self.data_ended:
                    read = self.reader.read(config.samples_per_rank, pooled=len(self.pool))
                pool = self.pool + read.samples
                mask = phases.key_mask(pool)
                columns = phases.sample_columns(pool, self.scheduler, config, t)
            except BaseException as exc:  # the user's iterator or data, Ctrl-C too: every rank hears of it
                pool, mask = [], 0
                error = self._bad_input(exc, step)
        error = error or taken.error  # a bad record_times fails the step everywhere
        with trace.phase("gather"):
            try:
                gathered = phases.gather(pool, read, mask, t, error, taken.words, columns)
            except StepFailed as exc:
                return StepError(step, str(exc), exc.rank)
            except SampleError as exc:  # DP ranks disagree on keys: no single culprit
                return StepError(step, f"{exc} at step {step}")
            except Exception as exc:  # after the gather's collective: the next agreement carries it
                return self._failed("gather", exc)
        misaligned = misaligned_step_message(
            step, gathered.label_checked, gathered.label_misaligned, config.label_format
        )
        if misaligned is not None:  # every rank decides it from the same sums: no single culprit
            self.shared_cause = SampleError(misaligned)
            return StepError(step, misaligned)
        total = gathered.num_sequences
        if gathered.timings is not None:  # combined with the copies' in the agreements that follow
            trace.times = gathered.timings.reshape(-1)
        self.data_ended = self.data_ended or gathered.exhausted
        if gathered.exhausted and (config.drop_last or total == 0):
            self.pool = []
            return StepEnd(step, dropped_at_end=total, empty_samples=gathered.empty_samples)
        with trace.phase("schedule"):
            try:
                plan, bounds = phases.schedule(
                    self.scheduler, config, t, gathered, cost=taken.model, encoder_price=taken.encoder_price
                )
                fingerprint = taken.fingerprint(plan)
            except ScheduleError as exc:
                return self._error(step, f"step {step}: {exc}", exc)
            except Exception as exc:
                return self._failed("schedule", exc)
        if self.data_ended and not plan.assigned.size:
            self.pool = []  # only deferred samples are left and the scheduler keeps deferring them
            return StepEnd(step, dropped_at_end=total, empty_samples=gathered.empty_samples)
        self.pool = phases.deferred_samples(pool, plan, gathered, t)
        return _Planned(plan, bounds, fingerprint, pool, read, gathered)

    def _place(self, planned: _Planned, trace: StepTrace) -> StepMessage:
        """Exchange and pack: this rank's microbatches of the step (its CP shards), or the
        step's error when the exchange or packing failed here."""
        step, plan, gathered = self.steps, planned.plan, planned.gathered
        with trace.phase("exchange"):
            try:
                exchanged = self.cp_mode.exchange(planned.pool, plan, gathered)
            except Exception as exc:
                return self._failed("exchange", exc)
            if exchanged is not None:
                trace.traffic.update(
                    sent=exchanged.bytes_sent,
                    received=exchanged.bytes_received,
                    kept=exchanged.bytes_kept,
                    payload=exchanged.bytes_received + exchanged.bytes_kept,
                )
        with trace.phase("pack"):
            try:
                batches = self.cp_mode.pack(plan, exchanged, gathered)
                loss_tokens = int(gathered.loss_tokens[plan.assigned].sum())  # of the whole global step
                minibatches: dict[str, Any] = {}
                bounds = planned.bounds
                if len(bounds) > 2:  # mini-batches: their bounds and counts travel with the step
                    counts = minibatch_loss_tokens(plan, bounds, gathered.loss_tokens)
                    minibatches = dict(minibatch_bounds=tuple(bounds), minibatch_loss_tokens=tuple(counts))
            except Exception as exc:
                return self._failed("packing", exc)
        return StepOk(
            step,
            plan,
            batches,
            gathered.empty_samples,
            phases.carries_position_ids(gathered.key_mask),
            num_loss_tokens=loss_tokens,
            group_starts=self.cp_mode.group_starts(plan),
            empty_at=tuple(planned.read.empty_at),
            **minibatches,
        )

    def _who(self) -> str:
        return f"DP rank {self.topology.dp_rank} (global rank {this_rank()}, {self.topology.describe()})"

    def _bad_input(self, exc: BaseException, step: int) -> str:
        self.local_cause = exc
        what = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
        if isinstance(exc, RuntimeError) and "stack expects each tensor to be equal size" in what:
            what += f" ({SAMPLES_NOT_BATCHES}: a DataLoader's collate stacked samples of different lengths)"
        return f"bad input on {self._who()} at step {step}: {what}"

    def _error(self, step: int, message: str, cause: BaseException) -> StepError:
        self.local_cause = cause
        return StepError(step, message, this_rank())

    def _failed(self, phase: str, exc: BaseException) -> StepError:
        """This rank's failure in ``phase``, named, for the agreements that follow."""
        step = self.steps
        return self._error(step, f"step {step}: {phase} failed on {self._who()}: {type(exc).__name__}: {exc}", exc)

    def _agree_copies(self, msg: StepMessage, taken: StepInput, trace: StepTrace) -> StepMessage:
        """The copies of one replica (CP ranks; under "all" also TP and PP) agree on the
        outcome; the schedule fingerprint and the step's time words ride on that all-reduce."""
        axes = (Axis.CP,) if self.config.data_owner == DataOwner.TP0 else (Axis.CP, Axis.TP, Axis.PP)
        fingerprint = taken.fingerprint(msg.schedule) if isinstance(msg, StepOk) else None
        status, message, origin = _outcome(msg)
        agreed = agree_axes(
            self.comm, axes, status, message, fingerprint, what="schedules", origin=origin, payload=trace.times
        )
        trace.times = agreed.payload
        return _with_status(msg, agreed.status, agreed.message, agreed.rank)

    def _broadcast(self, msg: StepMessage | None, taken: StepInput, trace: StepTrace) -> StepMessage:
        """data_owner="tp0": TP rank 0 sends to the other TP ranks; the pipeline agrees and
        the first stage sends its layout to the middle ones."""
        t = self.comm
        if t.tp_size > 1 and (t.is_first_stage or t.is_last_stage):
            try:  # a receiver that fails here still takes part in the pipeline's agreement
                msg = broadcast_tp(msg if t.tp_rank == 0 else None, t.group("tp"), timings=trace.timings)
                if t.tp_rank > 0 and isinstance(msg, StepOk) and msg.group_starts is not None:
                    msg = dataclasses.replace(msg, microbatches=self.cp_mode.attach(msg.microbatches, msg.group_starts))
            except Exception as exc:
                msg = self._failed("broadcast", exc)
        if t.pp_size > 1:
            msg = self._pipeline(msg, taken, trace)
        assert msg is not None
        return msg

    def _pipeline(self, msg: StepMessage | None, taken: StepInput, trace: StepTrace) -> StepMessage:
        """Agree with the other stages, then send the first stage's layout to the middle ones."""
        t, step = self.comm, self.steps
        fingerprint = taken.fingerprint(msg.schedule) if isinstance(msg, StepOk) else None
        status, message, origin = _outcome(msg)
        agreed = agree(
            status,
            message,
            t.group("pp"),
            fingerprint=fingerprint,
            axis="pp",
            what="schedules (first and last stage)",
            origin=origin,
            payload=trace.times,
        )
        trace.times = agreed.payload
        if agreed.status == Status.ERROR:
            return StepError(step, agreed.message or "", agreed.rank)
        if t.pp_size > 2:
            out = msg
            if t.is_first_stage and msg is not None and agreed.status != msg.status:  # the last stage ended first
                out = StepEnd(step)
            got = broadcast_pp(
                out if t.is_first_stage else None, t.group("pp"), decode=t.is_middle_stage, timings=trace.timings
            )
            if t.is_middle_stage:
                assert got is not None
                if isinstance(got, StepOk) and got.group_starts is not None:
                    return dataclasses.replace(
                        got, microbatches=self.cp_mode.attach(got.microbatches, got.group_starts)
                    )
                if isinstance(got, StepOk) and got.microbatches and got.microbatches[0].cp_rank != t.cp_rank:
                    sender = got.microbatches[0].cp_rank
                    raise ConfigError(
                        f"the pp group pairs CP rank {sender} of the first stage with CP rank {t.cp_rank}"
                    )
                return got
        if msg is None or agreed.status != msg.status:
            return StepEnd(step) if agreed.status == Status.END else StepError(step, agreed.message or "")
        return msg

    def _ready(self, msg: StepMessage, trace: StepTrace, taken: StepInput, last: Measurement | None) -> Ready:
        """The step's agreed outcome as next() will hand it over: stats (``taken``: what the
        step was planned with; ``last``: the last measured step), device copy, resume bookkeeping."""
        if isinstance(msg, StepError):
            # The failing rank's own exception; an error every reading rank decided alike
            # from the gathered sums carries the exception each of them made of it.
            cause = self.local_cause if msg.rank is not None and msg.rank == this_rank() else None
            shared = self.shared_cause
            if shared is not None and str(shared) == msg.message:
                cause = shared
            return Ready(msg.step, message=msg, cause=cause)
        if isinstance(msg, StepEnd):
            return Ready(msg.step, message=msg, progress=self.progress())
        plan = msg.schedule
        # A calibrated dynamic-CP cost is the unit the step was planned in; static stats
        # stay in the config's cost.
        config = self.config
        cost = taken.model if taken.model is not None and not plan.is_static else self.stats_cost
        shapes = config.static_shapes
        model, predicted = step_prediction(plan, taken, self.stats_cost, sync=config.sync, static_shapes=shapes)
        stats = StepStats.from_schedule(
            plan, cost, empty_samples=msg.empty_samples, sync=config.sync, static_shapes=shapes, predicted=predicted
        )
        fill_stats(stats, taken, last, model)
        if config.flops_fn is not None:
            stats.flops = float(config.flops_fn(stats.seqlen_sum, stats.seqlen_sq_sum))
        self.steps += 1
        batches, copied = self.copy.place(self._with_groups(plan, msg.microbatches), trace)
        step = Step(
            num_microbatches=plan.num_microbatches,
            microbatches=batches,
            stats=stats,
            step=msg.step,
            num_loss_tokens=msg.num_loss_tokens,
            minibatch_bounds=list(msg.minibatch_bounds or (0, plan.num_microbatches)),
            minibatch_loss_tokens=_minibatch_counts(msg),
            schedule=plan,
            schedule_fingerprint=plan.fingerprint(),
            timings=trace.timings,
            exchange_bytes=trace.traffic,
            _recorder=self.calibration.recorder,
            _topology=self.topology,
            _cp_groups=self.cp_mode.groups,
            _empty_at=msg.empty_at,
            _static_shapes=self.config.static_shapes,
        )
        nbytes = sum(t.numel() * t.element_size() for batch in batches for t in tensors_of(batch))
        return Ready(msg.step, step=step, progress=self.progress(), copied=copied, nbytes=nbytes)

    def _with_groups(self, plan: Schedule, batches: list[PackedBatch]) -> list[PackedBatch]:
        """Every CP-sharded batch with the model's process group of its block in its round,
        where it carries none yet (a static plan's, received over TP or PP)."""
        groups = self.cp_mode.groups
        starts = plan.group_start[plan.rank_group()[:, groups.plane_rank]].tolist()
        return [
            batch
            if batch.cp_group is not None or batch.cp_size == 1
            else dataclasses.replace(batch, cp_group=groups.blocks.get((start, batch.cp_size)))
            for batch, start in zip(batches, starts, strict=True)
        ]

    def progress(self) -> Progress:
        reader = self.reader
        return Progress(
            steps=self.steps,
            consumed=(reader.consumed + reader.skip) if reader is not None else 0,
            deferred=list(self.pool),
            iterator=self.source.state_dict() if isinstance(self.source, Stateful) else None,
            scheduler=self.scheduler.state_dict() if isinstance(self.scheduler, Stateful) else None,
            data_ended=self.data_ended,
            calibration=self.calibration.snapshot(),
        )

    def restore(self, saved: ResumeState) -> None:
        """Continue from ``saved`` (a fresh producer: nothing read yet)."""
        self.steps = saved.steps
        self.pool = saved.deferred_samples
        self.data_ended = saved.data_ended
        if self.reader is not None:
            if saved.iterator is not None and isinstance(self.source, Stateful):
                self.source.load_state_dict(saved.iterator)
                self.reader.skip = 0
            else:
                self.reader.skip = saved.consumed
            self.reader.consumed = saved.consumed - self.reader.skip
        if saved.scheduler is not None and isinstance(self.scheduler, Stateful):
            self.scheduler.load_state_dict(saved.scheduler)


def _minibatch_counts(msg: StepOk) -> list[int] | None:
    """Supervised tokens of each mini-batch of ``msg`` (one: the step's), ``None`` uncounted."""
    if msg.minibatch_loss_tokens is not None:
        return list(msg.minibatch_loss_tokens)
    return None if msg.num_loss_tokens is None else [msg.num_loss_tokens]


def _outcome(msg: StepMessage | None) -> tuple[Status, str | None, int | None]:
    """What a rank brings to an agreement: ``msg``'s status (none yet: OK), and an error's
    message and failing rank."""
    if isinstance(msg, StepError):
        return Status.ERROR, msg.message, msg.rank
    return (Status.OK if msg is None else msg.status), None, None


def _with_status(msg: StepMessage, status: Status, error: str | None, rank: int | None) -> StepMessage:
    if status == Status.ERROR:
        if isinstance(msg, StepError) and (msg.message, msg.rank) == (error or "", rank):
            return msg
        # Also when this rank failed too: every rank raises the agreed error, not its own.
        return StepError(msg.step, error or "", rank)
    if status == msg.status:
        return msg
    return StepEnd(msg.step, dropped_at_end=msg.dropped_at_end if isinstance(msg, StepEnd) else 0)
