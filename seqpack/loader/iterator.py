"""wrap_data_iterator: the per-step composition of seqpack's pieces, resumable.

Every ``next()`` is collective over the whole topology (call it on every rank). Ranks that
read data run the phases of :mod:`seqpack.loader.phases` (read, gather lengths, schedule, exchange,
pack + CP shard); the CP copies of a replica (and, under ``data_owner="all"``, the TP and
PP copies) then agree on the outcome and compare schedule fingerprints; under
``data_owner="tp0"`` the step is broadcast over TP and to middle pipeline stages
(:mod:`seqpack.collective.broadcast`, in the int64 wire format).

Who reads data: with ``data_owner="tp0"`` TP rank 0 of the first and the last pipeline
stage, on every DP and CP rank (the CP ranks of one replica read identical samples, as
Megatron's samplers do); with ``"all"`` every rank reads identical data for its DP rank and
nothing is broadcast. Others pass ``data_iterator=None``.

Errors: a failure on any rank (a bad sample, the data iterator raising, an oversize
sequence, a scheduler bug) becomes :class:`~seqpack.errors.StepFailed` with the same message
on every rank; on the rank that failed the original exception is its ``__cause__``. The
iterator is then failed: every later ``next()`` raises again and ``state_dict()`` refuses,
so no sample read in the failed step is silently lost. Resume from a state saved before the
failure.

Prefetch: with ``prefetch=k > 0`` (the default is 1) a daemon thread on every rank prepares
up to ``k`` steps ahead (:meth:`PackingIterator._produce`, the work of one synchronous
``next()``), on process groups created for the wrapper alone
(:func:`seqpack.collective.groups.new_axis_groups`), so its collectives never interleave with the
model's. ``next()`` hands over the next prepared step; an error is raised by the ``next()``
of the step it belongs to; ``state_dict()`` describes the steps handed over, never the
prepared ones (the reader's bookkeeping is snapshotted with every prepared step).
``close()`` (or leaving a ``with`` block) stops the thread and frees the groups.
"""

from __future__ import annotations

import datetime
import logging
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful

from seqpack.calibrate import CostCalibrator, Measurement
from seqpack.collective import (
    Agreement,
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
from seqpack.collective.groups import new_axis_groups, this_rank
from seqpack.cost import default_cost_model
from seqpack.errors import (
    ConfigError,
    ResumeError,
    SampleError,
    ScheduleError,
    SeqpackError,
    SeqpackTypeError,
    StepFailed,
)
from seqpack.loader import phases
from seqpack.loader.calibration import StepCalibration
from seqpack.loader.config import PackingConfig
from seqpack.loader.prefetch import Background, DeviceCopy, Prefetcher, Progress, Ready, check_device, check_timeout
from seqpack.loader.resume import ResumeState
from seqpack.loader.step import Step, StepTrace
from seqpack.options import AXES, Axis, DataOwner, fingerprint_text
from seqpack.stats import StepStats
from seqpack.topology import Topology
from seqpack.validation import check_number

__all__ = ["DATA_OWNERS", "PackingIterator", "Step", "wrap_data_iterator"]

logger = logging.getLogger(__name__)

DATA_OWNERS = tuple(DataOwner)


class PackingIterator(Iterator[Step], Stateful):
    """Iterator of :class:`Step`; see :func:`wrap_data_iterator`.

    Resumable through ``state_dict()`` / ``load_state_dict()`` (per rank, the ``Stateful``
    protocol of ``torch.distributed.checkpoint``; the state is a :class:`ResumeState`). The
    wrapper uses no randomness; a loader's own RNG travels in its ``state_dict`` (saved
    under ``"iterator"``).

    Under prefetch, call :meth:`close` (or use the iterator as a context manager) when done
    with it before the end of the data: it stops the background thread and frees the
    wrapper's own process groups (an iterator that reaches its end or fails frees them
    itself).
    """

    # Keys of the state dict (ResumeState.KEYS), as class constants.
    STATE_VERSION = "version"
    STATE_TOPOLOGY = "topology"
    STATE_CONFIG = "config"
    STATE_STEPS = "steps"
    STATE_CONSUMED = "consumed"
    STATE_DEFERRED = "deferred_samples"
    STATE_ITERATOR = "iterator"
    STATE_SCHEDULER = "scheduler"
    STATE_FINISHED = "finished"
    STATE_DROPPED_AT_END = "dropped_at_end"
    STATE_CALIBRATION = "calibration"
    VERSION = ResumeState.VERSION

    def __init__(
        self,
        data_iterator: Iterable[Mapping[str, Any]] | None,
        topology: Topology,
        config: PackingConfig,
        *,
        device: Any = None,
        pin_memory: bool = False,
        wrapper_groups: Topology | Mapping[str, Any] | None = None,
        group_timeout: float | datetime.timedelta | None = None,
    ) -> None:
        if not isinstance(topology, Topology):
            raise SeqpackTypeError(f"topology must be a seqpack.Topology, got {type(topology).__name__}")
        if not isinstance(config, PackingConfig):
            raise SeqpackTypeError(f"config must be a seqpack.PackingConfig, got {type(config).__name__}")
        t = self.topology = topology
        self._edge_stage = t.is_first_stage or t.is_last_stage
        self._reads = config.data_owner == DataOwner.ALL or (t.tp_rank == 0 and self._edge_stage)
        self._source = data_iterator
        self._comm = topology  # whose groups the per-step collectives run on
        error: SeqpackError | None = None
        fingerprint = None
        comm, timeout = None, None
        try:
            self.config = config.resolve(topology)
            self._check_ownership(data_iterator)
            self._device, self._pin_memory = check_device(device, pin_memory)
            timeout = check_timeout(group_timeout)
            if wrapper_groups is not None:
                comm = topology.with_groups(wrapper_groups)
            sizes = {f"{a}_size": topology.size(a) for a in AXES}
            fingerprint = fingerprint_text(repr((self.config.fingerprint(), sorted(sizes.items()))))
        except SeqpackError as exc:
            error = exc
        if config.validate_ranks:
            # Every rank takes part even when its own arguments were bad, so that all ranks
            # raise the same error instead of some waiting in the first step's collectives.
            agreed = self._agree(
                AXES,
                Status.ERROR if error else Status.OK,
                str(error) if error else None,
                fingerprint,
                what="wrapper arguments",
            )
            if agreed.status == Status.ERROR:
                raise ConfigError(agreed.message or "") from error
        elif error is not None:
            raise error
        owned: list[Any] = []
        if comm is not None:
            self._comm = comm
        elif self.config.prefetch > 0:
            # Collective (every rank, same order), like the agreement above.
            groups = new_axis_groups(topology, backend="gloo", timeout=timeout)
            owned = [group for group in groups.values() if group is not None]
            if owned:
                self._comm = topology.with_groups(groups)
        self._bg = Background(owned)
        self._finalizer = weakref.finalize(self, self._bg.release, 0.0)
        self._finalizer.atexit = False  # the thread is a daemon: nothing to wait for at exit
        self._closed = False
        self._delivered: Progress | None = None  # as of the last step handed over
        self._copy = DeviceCopy(self._device, self._pin_memory, background=self.config.prefetch > 0)
        self.scheduler = self.config.build_scheduler()
        # Stats are measured in one cost for every scheduler: the one given, else the cost
        # the scheduler balances, else the default FLOPs model (so that "dp_balanced" and
        # "balanced" report imbalance in the same unit).
        self.stats_cost = self.scheduler.resolve_cost(self.config.cost) or default_cost_model()
        self._reader = phases.Reader(data_iterator) if data_iterator is not None else None
        self._steps = 0
        self._pool: list[phases.Sample] = []
        self._finished = False
        self._data_ended = False
        self._failure: StepFailed | None = None
        self._local_cause: BaseException | None = None
        self.dropped_at_end = 0
        self.empty_at_end = 0  # zero-length samples read in the step that found the end of data
        self._calibration = StepCalibration(self.config, self.topology, self.scheduler, self._reads)

    # -- configuration --------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Old attribute names (it.samples_per_rank, it.pad_multiple, ...) read the config.
        if name != "config" and "config" in self.__dict__ and name in PackingConfig.field_names():
            return getattr(self.config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _check_ownership(self, data_iterator: Any) -> None:
        who = f"rank {this_rank()} ({self.topology.describe()})"
        rule = (
            "data_owner='all': every rank reads"
            if self.config.data_owner == DataOwner.ALL
            else "data_owner='tp0': only TP rank 0 of the first and last pipeline stages reads"
        )
        if self._reads and data_iterator is None:
            raise ConfigError(f"{who} got data_iterator=None but must read data ({rule})")
        if data_iterator is not None:
            kind = type(data_iterator)
            iterable = hasattr(kind, "__iter__") or (hasattr(kind, "__getitem__") and hasattr(kind, "__len__"))
            if not iterable or getattr(data_iterator, "ndim", 1) == 0:  # a 0-d tensor has __iter__, no items
                raise SeqpackTypeError(f"{who}: data_iterator must be an iterable of samples, got {kind.__name__}")
        if not self._reads and data_iterator is not None:
            raise ConfigError(f"{who} got a data_iterator but must not read data ({rule}); pass data_iterator=None")

    @property
    def last_measurement(self) -> Measurement | None:
        """Under ``calibrate``: the last step whose microbatch times every rank holds (its
        measured and predicted step time); ``None`` before one, or without a calibrator."""
        return self._calibration.last

    @property
    def calibrator(self) -> CostCalibrator | None:
        """The online cost calibrator (``None`` without ``calibrate`` or on ranks that do not
        keep it: TP ranks > 0 under ``data_owner="tp0"``)."""
        return self._calibration.calibrator

    def _agree(
        self,
        axes: Iterable[Axis],
        status: int,
        message: str | None,
        fingerprint: int | None,
        *,
        what: str,
        origin: int | None = None,
    ) -> Agreement:
        return agree_axes(self._comm, axes, status, message, fingerprint, what=what, origin=origin)

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> PackingIterator:
        return self

    def __next__(self) -> Step:
        if self._failure is not None:
            failed = self._failure
            raise StepFailed(
                f"this iterator failed at step {failed.step} and cannot continue (resume from a state_dict() saved "
                f"before the failure): {failed.reason}",
                step=failed.step,
                rank=failed.rank,
            ) from failed
        if self._finished:
            raise StopIteration
        if self._closed:
            raise SeqpackError("next() on a closed PackingIterator")
        tick = time.perf_counter()
        if self.config.prefetch == 0:
            ready = self._produce()
        else:
            bg = self._bg
            if bg.prefetcher is None:
                self._delivered = self._progress()  # nothing handed over yet: the state as loaded
                name = f"seqpack-prefetch-rank{this_rank()}"
                bg.prefetcher = Prefetcher(self._produce, self.config.prefetch, name)
            ready = bg.prefetcher.take()
        return self._deliver(ready, time.perf_counter() - tick)

    def __enter__(self) -> PackingIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the background producer and free the wrapper's own process groups.

        Returns within about ``timeout`` seconds, also when a peer has died or hangs: the
        thread first finishes the steps it may still prepare (at most ``prefetch``; the
        other ranks' threads take part in them), and one still stuck in a collective after
        ``timeout`` is left behind (a daemon thread; its collective fails at the groups'
        timeout). ``next()`` then raises; ``state_dict()`` still describes the steps handed
        over. Idempotent.
        """
        self._closed = True
        self._release(check_number("timeout", timeout, minimum=0.0))

    def _release(self, timeout: float = 10.0) -> None:
        if not self._bg.release(timeout):
            logger.warning(
                "seqpack's prefetch thread did not stop within %.1f s (a peer died or hangs in the wrapper's "
                "collectives?); left behind as a daemon thread",
                timeout,
            )
        self._finalizer.detach()

    def _produce(self) -> Ready:
        """Prepare the next step: the work of one ``next()`` without the hand-over (read,
        gather, schedule, exchange, pack, agree, broadcast, stats, device copy). Runs on the
        background thread under prefetch, else inside ``next()``; never raises."""
        index = self._steps
        try:
            trace = StepTrace()
            msg: StepMessage | None = None
            if self._reads:
                msg = self._agree_copies(self._reader_step(trace), trace)
            if self.config.data_owner == DataOwner.TP0:
                with trace.phase("broadcast"):
                    msg = self._broadcast(msg, trace)
                trace.timings["broadcast"] -= trace.timings.get("wait", 0.0)
            assert msg is not None
            self._calibration.absorb(msg, trace)
            trace.timings["total"] = time.perf_counter() - trace.start
            return self._ready(msg, trace)
        except Exception as exc:  # raised by the next() of this step
            return Ready(index, error=exc)

    def _reader_step(self, trace: StepTrace) -> StepMessage:
        """Read, gather, schedule, exchange and pack this rank's share of the step."""
        t, step, config = self._comm, self._steps, self.config
        self._local_cause = None
        error = None
        read = phases.ReadResult([], exhausted=self._data_ended)
        with trace.phase("read"):
            assert self._reader is not None
            try:
                if not self._data_ended:
                    read = self._reader.read(config.samples_per_rank)
                pool = self._pool + read.samples
                mask = phases.key_mask(pool)
            except Exception as exc:  # the user's iterator or data: every rank must hear of it
                pool, mask = [], 0
                error = self._bad_input(exc, step)
        times, bad_times = self._calibration.outgoing(step)
        error = error or bad_times  # a bad record_times fails the step everywhere
        with trace.phase("gather"):
            try:
                gathered = phases.gather(pool, read, mask, t, error, times)
            except StepFailed as exc:
                return StepError(step, str(exc), exc.rank)
            except SampleError as exc:  # DP ranks disagree on keys: no single culprit
                return StepError(step, f"{exc} at step {step}")
        total = gathered.num_sequences
        trace.times = gathered.timings  # combined with the copies' in the agreements that follow
        self._data_ended = self._data_ended or gathered.exhausted
        if gathered.exhausted and (config.drop_last or total == 0):
            self._pool = []
            return StepEnd(step, dropped_at_end=total, empty_samples=gathered.empty_samples)
        with trace.phase("schedule"):
            self._calibration.choose_model(trace)
            try:
                plan = phases.schedule(self.scheduler, config, t, gathered, cost=trace.model)
            except ScheduleError as exc:
                return self._error(step, f"step {step}: {exc}", exc)
            fingerprint = self._calibration.fingerprint(plan, trace)
            if config.check_schedule and t.dp_size > 1:
                agreed = agree(Status.OK, None, t.group("dp"), fingerprint=fingerprint, axis="dp")
                if agreed.status == Status.ERROR:
                    return StepError(step, f"step {step}: {agreed.message}")
        if self._data_ended and not any(ids.size for row in plan.assignment for ids in row):
            self._pool = []  # only deferred samples are left and the scheduler keeps deferring them
            return StepEnd(step, dropped_at_end=total, empty_samples=gathered.empty_samples)
        self._pool = phases.deferred_samples(pool, plan, gathered, t)
        positions = phases.carries_position_ids(gathered.key_mask)
        exchanged = None
        with trace.phase("exchange"):
            if not t.is_middle_stage or positions:
                exchanged = phases.exchange(pool, plan, gathered, t)
                trace.traffic.update(
                    sent=exchanged.bytes_sent,
                    received=exchanged.bytes_received,
                    kept=exchanged.bytes_kept,
                    payload=exchanged.bytes_received + exchanged.bytes_kept,
                )
        with trace.phase("pack"):
            try:
                batches = phases.pack(plan, exchanged, t, config.pad_multiple or 1)
            except Exception as exc:  # local; CP/TP/PP peers hear of it in the status agreement
                return self._error(
                    step, f"step {step}: packing failed on {self._who()}: {type(exc).__name__}: {exc}", exc
                )
        return StepOk(step, plan, batches, gathered.empty_samples, positions)

    def _who(self) -> str:
        return f"DP rank {self.topology.dp_rank} (global rank {this_rank()}, {self.topology.describe()})"

    def _bad_input(self, exc: Exception, step: int) -> str:
        self._local_cause = exc
        what = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        return f"bad input on {self._who()} at step {step}: {what}"

    def _error(self, step: int, message: str, cause: BaseException) -> StepError:
        self._local_cause = cause
        return StepError(step, message, this_rank())

    def _agree_copies(self, msg: StepMessage, trace: StepTrace | None = None) -> StepMessage:
        """The copies of one replica (CP ranks; under "all" also TP and PP) agree on the
        outcome. The schedule fingerprint rides on the status all-reduce that happens
        anyway: copies that read different data are caught every step. Under calibration
        the microbatch times gathered over DP ride on it too (an int64 MAX), so that every
        copy holds every copy's times."""
        axes = (Axis.CP,) if self.config.data_owner == DataOwner.TP0 else (Axis.CP, Axis.TP, Axis.PP)
        fingerprint = StepCalibration.message_fingerprint(msg, trace) if isinstance(msg, StepOk) else None
        message = msg.message if isinstance(msg, StepError) else None
        origin = msg.rank if isinstance(msg, StepError) else None
        payload = self._calibration.payload(trace)
        agreed = agree_axes(
            self._comm, axes, msg.status, message, fingerprint, what="schedules", origin=origin, payload=payload
        )
        if trace is not None and payload is not None:
            trace.times = agreed.payload
        return _with_status(msg, agreed.status, agreed.message, agreed.rank)

    def _broadcast(self, msg: StepMessage | None, trace: StepTrace) -> StepMessage:
        """data_owner="tp0": TP rank 0 sends to the other TP ranks; the pipeline agrees and
        the first stage sends its layout to the middle ones."""
        t = self._comm
        if t.tp_size > 1 and self._edge_stage:
            msg = broadcast_tp(msg if t.tp_rank == 0 else None, t.group("tp"), timings=trace.timings)
        if t.pp_size > 1:
            msg = self._pipeline(msg, trace)
        assert msg is not None
        return msg

    def _pipeline(self, msg: StepMessage | None, trace: StepTrace) -> StepMessage:
        """Agree with the other stages, then send the first stage's layout to the middle ones."""
        t, step = self._comm, self._steps
        status = msg.status if msg is not None else Status.OK
        fingerprint = StepCalibration.message_fingerprint(msg, trace) if isinstance(msg, StepOk) else None
        message = msg.message if isinstance(msg, StepError) else None
        origin = msg.rank if isinstance(msg, StepError) else None
        payload = self._calibration.payload(trace)
        agreed = agree(
            status,
            message,
            t.group("pp"),
            fingerprint=fingerprint,
            axis="pp",
            what="schedules (first and last stage)",
            origin=origin,
            payload=payload,
        )
        if payload is not None:
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
                if isinstance(got, StepOk) and got.microbatches and got.microbatches[0].cp_rank != t.cp_rank:
                    sender = got.microbatches[0].cp_rank
                    raise ConfigError(
                        f"the pp group pairs CP rank {sender} of the first stage with CP rank {t.cp_rank}"
                    )
                return got
        if msg is None or agreed.status != msg.status:
            return StepEnd(step) if agreed.status == Status.END else StepError(step, agreed.message or "")
        return msg

    def _ready(self, msg: StepMessage, trace: StepTrace) -> Ready:
        """The step's agreed outcome as next() will hand it over, built on the producer's
        side: stats, device copy, and the resume bookkeeping as of this step."""
        if isinstance(msg, StepError):
            cause = self._local_cause if msg.rank is not None and msg.rank == this_rank() else None
            return Ready(msg.step, message=msg, cause=cause)
        if isinstance(msg, StepEnd):
            return Ready(msg.step, message=msg, progress=self._progress())
        plan = msg.schedule
        stats = StepStats.from_schedule(plan, self.stats_cost, empty_samples=msg.empty_samples)
        if self.config.flops_fn is not None:
            stats.flops = float(self.config.flops_fn(stats.seqlen_sum, stats.seqlen_sq_sum))
        self._calibration.fill_stats(stats, plan, trace, self.stats_cost)
        self._steps += 1
        batches, copied = self._copy.place(msg.microbatches, trace)
        step = Step(
            num_microbatches=plan.num_microbatches,
            microbatches=batches,
            stats=stats,
            step=msg.step,
            schedule=plan,
            schedule_fingerprint=plan.fingerprint(),
            timings=trace.timings,
            exchange_bytes=trace.traffic,
            _recorder=self._calibration.record if self._calibration.enabled else None,
        )
        return Ready(msg.step, step=step, progress=self._progress(), copied=copied)

    def _progress(self) -> Progress:
        reader = self._reader
        return Progress(
            steps=self._steps,
            consumed=(reader.consumed + reader.skip) if reader is not None else 0,
            deferred=list(self._pool),
            iterator=self._source.state_dict() if isinstance(self._source, Stateful) else None,
            scheduler=self.scheduler.state_dict() if isinstance(self.scheduler, Stateful) else None,
            data_ended=self._data_ended,
            calibration=self._calibration.snapshot(),
        )

    def _deliver(self, ready: Ready, blocked: float) -> Step:
        """Hand a prepared step over on the calling thread, or raise how the step ended."""
        if ready.error is not None:
            exc = ready.error
            reason = f"step {ready.index} failed on rank {this_rank()}: {type(exc).__name__}: {exc}"
            self._failure = StepFailed(reason, step=ready.index, rank=this_rank())
            self._release()
            raise exc
        msg = ready.message
        if isinstance(msg, StepError):
            self._failure = StepFailed(msg.message, step=msg.step, rank=msg.rank)
            self._release()
            raise self._failure from ready.cause
        if isinstance(msg, StepEnd):
            self._finished = True
            self.dropped_at_end = msg.dropped_at_end
            self.empty_at_end = msg.empty_samples
            self._delivered = ready.progress
            self._release()
            raise StopIteration
        step = ready.step
        assert step is not None
        if ready.copied is not None:  # the copy ran on the producer's stream
            DeviceCopy.hand_over(step, ready.copied)
        step.timings["blocked"] = blocked
        self._delivered = ready.progress
        return step

    # -- resume ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state (:class:`~seqpack.loader.resume.ResumeState` as a dict).

        Raises:
            ResumeError: The iterator failed (its last step's samples are in no state).
        """
        if self._failure is not None:
            raise ResumeError(
                f"cannot save the state of an iterator that failed at step {self._failure.step}: save states before "
                "the failure and resume from those"
            )
        # Under prefetch the reader may be steps ahead: report the bookkeeping as of the
        # last step handed over (live only before the background thread has started).
        progress = self._delivered if self._delivered is not None else self._progress()
        return ResumeState(
            topology=self.topology.signature(),
            config=self.config.summary(),
            config_fingerprint=self.config.fingerprint(),
            steps=progress.steps,
            consumed=progress.consumed,
            deferred_samples=[{k: v.clone() for k, v in s.items()} for s in progress.deferred],
            iterator=progress.iterator,
            scheduler=progress.scheduler,
            finished=self._finished,
            dropped_at_end=self.dropped_at_end,
            empty_at_end=self.empty_at_end,
            data_ended=progress.data_ended,
            calibration=self._calibration.state_dict(progress.calibration),
        ).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` into this fresh iterator over the same data.

        The data iterator is restored with its own ``load_state_dict`` when both it and the
        state have one; otherwise it is fast-forwarded by the consumed count on the next
        step.

        Raises:
            ResumeError: Missing keys, another state version, a different topology or
                configuration, negative counts, or an iterator that has already produced
                steps.
        """
        saved = ResumeState.from_dict(state)
        saved.check_fits(self.topology.signature(), self.config, type(self.scheduler).__name__)
        if (self._reader is not None and self._reader.started) or self._steps or self._bg.prefetcher is not None:
            raise ResumeError("load_state_dict needs a fresh iterator (this one has already read data)")
        self._steps = saved.steps
        self._pool = saved.deferred_samples
        self._finished = saved.finished
        self._data_ended = saved.data_ended
        self.dropped_at_end = saved.dropped_at_end
        self.empty_at_end = saved.empty_at_end
        if self._reader is not None:
            if saved.iterator is not None and isinstance(self._source, Stateful):
                self._source.load_state_dict(saved.iterator)
                self._reader.skip = 0
            else:
                self._reader.skip = saved.consumed
            self._reader.consumed = saved.consumed - self._reader.skip
        if saved.scheduler is not None and isinstance(self.scheduler, Stateful):
            self.scheduler.load_state_dict(saved.scheduler)
        self._calibration.load_state_dict(saved.calibration)


def _with_status(msg: StepMessage, status: Status, error: str | None, rank: int | None) -> StepMessage:
    if status == Status.ERROR:
        if isinstance(msg, StepError) and (msg.message, msg.rank) == (error or "", rank):
            return msg
        # Also when this rank failed too: every rank raises the agreed error, not its own.
        return StepError(msg.step, error or "", rank)
    if status == msg.status:
        return msg
    return StepEnd(msg.step, dropped_at_end=msg.dropped_at_end if isinstance(msg, StepEnd) else 0)


def wrap_data_iterator(
    data_iterator: Iterable[Mapping[str, Any]] | None,
    topology: Topology,
    config: PackingConfig | None = None,
    *,
    device: Any = None,
    pin_memory: bool = False,
    wrapper_groups: Topology | Mapping[str, Any] | None = None,
    group_timeout: float | datetime.timedelta | None = None,
    **overrides: Any,
) -> PackingIterator:
    """Wrap a data iterator so each ``next()`` yields one packed, scheduled, CP-sharded step.

    Collective: call it, and every ``next()``, on every rank of ``topology``.

    Args:
        data_iterator: Samples (mappings of 1-D tensors; ``input_ids`` required,
            ``labels``, ``loss_mask``, ``position_ids`` optional; pre-packed samples carrying
            ``cu_seqlens`` are split into their sequences). ``None`` on ranks that do not
            read (see ``data_owner``). An iterable with ``state_dict()`` /
            ``load_state_dict()`` (``StatefulDataLoader``) is resumed through them.
        topology: This rank's :class:`~seqpack.topology.Topology`.
        config: A :class:`~seqpack.loader.config.PackingConfig`; ``None`` builds one from
            ``overrides``.
        device: Copy every step's tensors to this device in the background (CUDA: on a
            side stream, ``next()`` orders the caller's stream after it); ``None`` or a CPU
            device: no copy.
        pin_memory: Put the step's CPU tensors in page-locked memory (faster, asynchronous
            host-to-device copies); ignored, with a warning, without CUDA.
        wrapper_groups: Process groups for the wrapper's per-step collectives (axis name to
            group, or a :class:`Topology`), over the same ranks in the same order as the
            topology's. Default: the topology's own groups with ``prefetch=0``; new gloo
            groups created for the wrapper alone (one per axis of size > 1) with
            ``prefetch > 0``.
        group_timeout: Seconds (or a ``timedelta``) a collective on the groups the wrapper
            creates waits for its peers before failing (default: torch's, 30 minutes).
        **overrides: :class:`~seqpack.loader.config.PackingConfig` fields (``samples_per_rank``,
            ``max_tokens_per_rank``, ``scheduler``, ``data_owner``, ``on_oversize``,
            ``drop_last``, ``pad_multiple``, ``cost``, ``prefetch``, ...), applied on top of
            ``config``.

    Returns:
        A :class:`PackingIterator`.

    Raises:
        ConfigError: On every rank, for bad arguments on any rank, an iterator given to a
            rank that must not read or missing on one that must.
    """
    try:
        if config is None:
            unknown = sorted(set(overrides) - set(PackingConfig.field_names()))
            if unknown:
                raise ConfigError(f"unknown option(s) {unknown}; valid: {', '.join(PackingConfig.field_names())}")
            missing = [k for k in ("samples_per_rank", "max_tokens_per_rank") if k not in overrides]
            if missing:
                raise ConfigError(f"wrap_data_iterator needs {' and '.join(missing)} (or a PackingConfig)")
            config = PackingConfig(**overrides)
        elif overrides:
            config = config.replace(**overrides)
    except SeqpackError as exc:
        validate = overrides.get("validate_ranks", True if config is None else config.validate_ranks)
        if validate is not False and isinstance(topology, Topology):
            # The other ranks are waiting in the constructor's agreement: take part, so that
            # every rank raises this error instead of some hanging.
            agreed = agree_axes(topology, AXES, Status.ERROR, str(exc), None, what="wrapper arguments")
            raise ConfigError(agreed.message or str(exc)) from exc
        raise
    return PackingIterator(
        data_iterator,
        topology,
        config,
        device=device,
        pin_memory=pin_memory,
        wrapper_groups=wrapper_groups,
        group_timeout=group_timeout,
    )
