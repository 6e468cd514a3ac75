"""wrap_data_iterator: the per-step composition of seqpack's pieces, resumable.

Every ``next()`` is collective over the whole topology (call it on every rank): one step of
:class:`~seqpack.loader.producer.StepProducer`. Who reads data: with ``data_owner="tp0"`` TP
rank 0 of the first and the last pipeline stage, on every DP and CP rank; with ``"all"``
every rank. Others pass ``data_iterator=None``.

Errors: a failure on any rank in any phase of a step becomes
:class:`~seqpack.errors.StepFailed` with the same message on every rank, naming the rank and
the phase (the original exception is its ``__cause__`` on the rank that failed). The
iterator is then failed: later ``next()`` calls raise and ``state_dict()`` refuses.

Prefetch: with ``prefetch=k > 0`` a daemon thread prepares up to ``k`` steps ahead, on
process groups created for the wrapper alone, so its collectives never interleave with the
model's; ``state_dict()`` describes the steps handed over, never the prepared ones.
"""

from __future__ import annotations

import datetime
import logging
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from seqpack.calibrate import CostCalibrator, Measurement
from seqpack.collective import (
    Status,
    StepEnd,
    StepError,
    agree_axes,
)
from seqpack.collective.cp_groups import CpGroups
from seqpack.collective.groups import new_axis_groups, this_rank
from seqpack.cost import CostModel
from seqpack.errors import (
    ConfigError,
    ResumeError,
    SeqpackError,
    SeqpackTypeError,
    StepFailed,
    from_typed_message,
    typed_message,
)
from seqpack.loader.calibration import CalibrationState
from seqpack.loader.config import PackingConfig, resolved_cost
from seqpack.loader.construction import (
    check_covers_job,
    check_ownership,
    compared_settings,
    construction_words,
    warn_if_alone,
)
from seqpack.loader.cp_mode import cp_mode
from seqpack.loader.prefetch import Background, Prefetcher, check_seconds, check_timeout
from seqpack.loader.producer import StepProducer
from seqpack.loader.resume import ResumeState, Stateful
from seqpack.loader.step import DeviceCopy, Progress, Ready, Step, check_device
from seqpack.options import AXES, DataOwner
from seqpack.schedulers import Scheduler
from seqpack.topology import Topology

__all__ = ["PackingIterator", "wrap_data_iterator"]

logger = logging.getLogger(__name__)


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

    :attr:`cp_groups` holds this rank's CP process groups (the model's group of every block a
    plan can use, and the whole plane's); every CP-sharded batch carries its block's.
    """

    cp_groups: CpGroups | None = None

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
        warn_if_alone(topology)
        self._reads = config.data_owner == DataOwner.ALL or (t.tp_rank == 0 and (t.is_first_stage or t.is_last_stage))
        self._comm = topology  # whose groups the per-step collectives run on
        comm, timeout, max_prefetch = self._check_and_agree(data_iterator, config, device, pin_memory,
                                                             wrapper_groups, group_timeout)  # fmt: skip
        owned: list[Any] = []
        if comm is not None:
            self._comm = comm
        elif max_prefetch > 0:
            # Collective (every rank, same order), like the agreement before it.
            groups = new_axis_groups(topology, backend="gloo", timeout=timeout)
            owned = [group for group in groups.values() if group is not None]
            if owned:
                self._comm = topology.with_groups(groups)
        # Collective too (every rank: the config, dynamic_cp included, was agreed above);
        # static CP creates a group only for a plane of DP and CP both above 1.
        mode = cp_mode(self.config, topology, self._comm, self._scheduler, timeout=timeout)
        self.cp_groups = mode.groups
        owned += self.cp_groups.owned()
        self._bg = Background(owned, alone=all(topology.size(axis) == 1 for axis in AXES), cp_groups=self.cp_groups)
        self._finalizer = weakref.finalize(self, self._bg.release, 0.0)
        self._finalizer.atexit = False  # the thread is a daemon: nothing to wait for at exit
        self._closed = False
        self._delivered: Progress | None = None  # as of the last step handed over
        scheduler = self._scheduler
        stats_cost = resolved_cost(self.config, scheduler)
        # Every rank sends the times of the same steps: they wait for the deepest prefetch.
        self._calibration = CalibrationState(self.config, topology, stats_cost, self._reads, lag=max_prefetch)
        self._producer = StepProducer(
            data_iterator,
            topology,
            self._comm,
            self.config,
            scheduler,
            stats_cost,
            reads=self._reads,
            copy=DeviceCopy(self._device, self._pin_memory, background=self.config.prefetch > 0),
            cp_mode=mode,
            calibration=self._calibration,
        )
        self._finished = False
        self._failure: StepFailed | None = None
        self.dropped_at_end = 0
        self.empty_at_end = 0  # zero-length samples read in the step that found the end of data

    def _check_and_agree(
        self,
        data_iterator: Iterable[Mapping[str, Any]] | None,
        config: PackingConfig,
        device: Any,
        pin_memory: bool,
        wrapper_groups: Topology | Mapping[str, Any] | None,
        group_timeout: float | datetime.timedelta | None,
    ) -> tuple[Topology | None, datetime.timedelta | None, int]:
        """Check this rank's arguments, then agree on them with every rank (one error for
        all, the fields that differ named). Returns the wrapper groups' topology (when given),
        the groups' timeout, and the largest prefetch of any rank (ranks may differ in it)."""
        topology = self.topology
        error: SeqpackError | None = None
        fingerprint, details = None, None
        comm, timeout = None, None
        try:
            self.config = config.resolve(topology)
            # Built once: the construction check, the CP groups, the steps and resume use it.
            self._scheduler = self.config.build_scheduler()
            self._summary = self.config.summary(self._scheduler)
            self._config_fingerprint = self.config.fingerprint(self._scheduler)
            check_ownership(self.topology, self.config, self._reads, data_iterator)
            self._device, self._pin_memory = check_device(device, pin_memory)
            timeout = check_timeout(group_timeout)
            if wrapper_groups is not None:
                comm = topology.with_groups(wrapper_groups)
            check_covers_job(topology, self.config, wrapper_groups is not None)
            fingerprint, details = compared_settings(topology, self.config, self._scheduler)
        except SeqpackError as exc:
            error = exc
        # Every rank takes part even when its own arguments were bad, so that all ranks raise
        # the same error instead of some waiting in the first step's collectives.
        agreed = agree_axes(
            self._comm,
            AXES,
            Status.ERROR if error else Status.OK,
            typed_message(error) if error else None,
            fingerprint,
            what="wrapper arguments",
            payload=construction_words(config.prefetch, wrapper_groups is not None),
            details=details,
        )
        if agreed.status == Status.ERROR:
            raise from_typed_message(agreed.message or "") from error
        words = agreed.payload if agreed.payload is not None else np.zeros(3, dtype=np.int64)
        if words[1] and words[2]:
            raise ConfigError(
                "wrapper_groups was passed on some ranks and not on others: pass it on every rank or on none (the "
                "wrapper's collectives must run on the same groups everywhere)"
            )
        return comm, timeout, int(words[0])

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler the config names."""
        return self._producer.scheduler

    @property
    def stats_cost(self) -> CostModel:
        """The cost model every step's stats are measured in (:func:`resolved_cost`)."""
        return self._producer.stats_cost

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
            ready = self._producer.produce()
        else:
            bg = self._bg
            if bg.prefetcher is None:
                self._delivered = self._producer.progress()  # nothing handed over yet: the state as loaded
                name = f"seqpack-prefetch-rank{this_rank()}"
                config = self.config
                bg.prefetcher = Prefetcher(
                    self._producer.produce, config.prefetch, name, config.prefetch_bytes, first=self._producer.steps
                )
            ready = bg.prefetcher.take()
        return self._deliver(ready, time.perf_counter() - tick)

    def __enter__(self) -> PackingIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the background producer and free the wrapper's own process groups.

        Returns within about ``timeout`` seconds, also when a peer has died or hangs (a
        thread still stuck in a collective is left behind as a daemon). ``next()`` then
        raises; ``state_dict()`` still describes the steps handed over. Idempotent.
        """
        self._closed = True
        self._release(check_seconds("timeout", timeout))

    def _release(self, timeout: float = 10.0) -> None:
        if not self._bg.release(timeout):
            why = (
                "it ends once the step it prepares is read (the data iterator is slow or blocked?)"
                if self._bg.alone
                else "a peer died or hangs in the wrapper's collectives?"
            )
            message = "seqpack's prefetch thread did not stop within %.1f s (%s); left behind as a daemon thread"
            logger.warning(message, timeout, why)
        self._finalizer.detach()

    def _deliver(self, ready: Ready, blocked: float) -> Step:
        """Hand a prepared step over on the calling thread, or raise how the step ended."""
        if ready.error is not None:
            exc = ready.error
            reason = f"step {ready.index} failed on rank {this_rank()}: " + f"{type(exc).__name__}: {exc}".rstrip(": ")
            self._failure = StepFailed(reason, step=ready.index, rank=this_rank())
            self._release()
            raise exc
        msg = ready.message
        if isinstance(msg, StepError):
            self._failure = StepFailed(msg.message, step=msg.step, rank=msg.rank)
            self._release()
            if ready.cause is not None and not isinstance(ready.cause, Exception):
                raise ready.cause  # Ctrl-C (or SystemExit) in this rank's data iterator stays what it is
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
        # Under prefetch the reader may be steps ahead: report the last step handed over.
        progress = self._delivered if self._delivered is not None else self._producer.progress()
        return ResumeState(
            topology=self.topology.signature(),
            config=dict(self._summary),
            config_fingerprint=self._config_fingerprint,
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
        """Resume from :meth:`state_dict` into this fresh iterator over the same data (the
        data iterator through its own ``load_state_dict`` when both have one, else
        fast-forwarded by the consumed count).

        Raises:
            ResumeError: Missing keys, another state version, a different topology or
                configuration, negative counts, or an iterator that has already produced
                steps.
        """
        saved = ResumeState.from_dict(state)
        saved.check_fits(self.topology.signature(), self._summary, self._config_fingerprint)
        if self._producer.started or self._bg.prefetcher is not None:
            raise ResumeError("load_state_dict needs a fresh iterator (this one has already read data)")
        self._finished = saved.finished
        self.dropped_at_end = saved.dropped_at_end
        self.empty_at_end = saved.empty_at_end
        self._producer.restore(saved)
        self._calibration.load_state_dict(saved.calibration)


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
            topology's. Default: the topology's own with ``prefetch=0``, else new gloo groups.
        group_timeout: Seconds (or a ``timedelta``) a collective on the groups the wrapper
            creates waits for its peers before failing (default: torch's, 30 minutes).
        **overrides: :class:`~seqpack.loader.config.PackingConfig` fields, applied on top of
            ``config``.

    Returns:
        A :class:`PackingIterator`.

    Raises:
        ConfigError: On every rank, for bad arguments on any rank, an iterator given to a
            rank that must not read or missing on one that must.
    """
    try:
        config = _config_of(config, overrides)
    except SeqpackError as exc:
        if isinstance(topology, Topology):
            # The other ranks are waiting in the constructor's agreement: take part, so that
            # every rank raises this error instead of some hanging.
            agreed = agree_axes(
                topology, AXES, Status.ERROR, typed_message(exc), None, what="wrapper arguments",
                payload=construction_words(0, False),
            )  # fmt: skip
            raise from_typed_message(agreed.message or typed_message(exc)) from exc
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


def _config_of(config: PackingConfig | None, overrides: Mapping[str, Any]) -> PackingConfig:
    """``config`` with ``overrides`` applied, or a new one built from them."""
    if config is not None:
        return config.replace(**overrides) if overrides else config
    unknown = sorted(set(overrides) - set(PackingConfig.field_names()))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown}; valid: {', '.join(PackingConfig.field_names())}")
    missing = [k for k in ("samples_per_rank", "max_tokens_per_rank") if k not in overrides]
    if missing:
        raise ConfigError(f"wrap_data_iterator needs {' and '.join(missing)} (or a PackingConfig)")
    return PackingConfig(**overrides)
