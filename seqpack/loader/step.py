"""What one wrapper step hands over: :class:`Step`; :class:`StepTrace`, the timings and
exchange bytes (and, under calibration, the time words) gathered while the step is prepared;
and the hand-over from the producer to ``next()``: :class:`Ready` (the step or how it ended),
:class:`Progress` (the resume bookkeeping as of the step) and :class:`DeviceCopy` (pins and
copies the step's tensors to the device where the step is prepared)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from seqpack._logging import warn_once
from seqpack.collective import StepMessage
from seqpack.collective.cp_groups import CpGroups
from seqpack.errors import ConfigError
from seqpack.loader.origin import origin_slots, to_origin
from seqpack.schedulers import Schedule
from seqpack.stats import StepStats
from seqpack.thd import PackedBatch, StaticShapes
from seqpack.thd.batch import map_tensors
from seqpack.topology import Topology
from seqpack.validation import check_bool

__all__ = ["DeviceCopy", "Progress", "Ready", "Step", "StepTrace", "check_device", "tensors_of"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Step:
    """One training step's data for this rank.

    Attributes:
        num_microbatches: Microbatches every rank runs this step (equal on all ranks).
        microbatches: This rank's CP shard of each microbatch; metadata-only on middle
            pipeline stages.
        stats: Tokens, padding, balance and FLOPs of the whole global batch.
        step: Step index (0-based).
        schedule: The step's :class:`~seqpack.schedulers.Schedule` (identical on every
            rank; under ``dynamic_cp`` its rounds' CP groups vary).
        schedule_fingerprint: ``schedule.fingerprint()``.
        timings: Seconds spent in ``read``, ``gather``, ``schedule``, ``exchange``,
            ``pack`` (pack + CP shard), ``broadcast`` (TP + PP, without ``wait``), ``wait``
            (a broadcast receiver waiting for its source) and ``total`` on this rank (in the
            background under prefetch); ``copy`` (pinning and starting the device copy, when
            asked for); ``blocked``: how long the ``next()`` that returned this step waited
            for it on the calling thread (with prefetch ~0 when the step was ready).
        exchange_bytes: ``sent``, ``received``, ``kept`` (stayed local) and ``payload``
            (tokens of this replica's samples) bytes of this rank's exchange.
        num_loss_tokens: Supervised tokens of the whole global step (every DP replica, every
            microbatch, all CP shards), the same on every rank: divide the summed token
            losses by it for the step's per-token loss (docs/wrapper.md, "Loss"). Each
            microbatch's own count is its ``num_loss_tokens``.
        minibatch_bounds: ``k + 1`` microbatch offsets of the step's mini-batches
            (``PackingConfig.minibatches``; ``[0, num_microbatches]`` for one), the same on
            every rank: microbatches ``bounds[j]:bounds[j + 1]`` are mini-batch ``j``'s.
        minibatch_loss_tokens: Supervised tokens of each mini-batch (every DP replica), the
            same on every rank: what each optimizer step's summed token losses are divided by.
    """

    num_microbatches: int
    microbatches: list[PackedBatch]
    stats: StepStats
    step: int = 0
    schedule: Schedule | None = None
    schedule_fingerprint: int = 0
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    exchange_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    num_loss_tokens: int | None = None
    minibatch_bounds: list[int] = dataclasses.field(default_factory=list)
    minibatch_loss_tokens: list[int] | None = None
    _recorder: Callable[[int, Sequence[float] | np.ndarray, int], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    _topology: Topology | None = dataclasses.field(default=None, repr=False, compare=False)
    _cp_groups: CpGroups | None = dataclasses.field(default=None, repr=False, compare=False)  # the iterator's CP groups
    # Pool index of each zero-length sequence this DP rank read this step (never scheduled).
    _empty_at: tuple[int, ...] = dataclasses.field(default=(), repr=False, compare=False)
    _static_shapes: StaticShapes | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def minibatches(self) -> list[list[PackedBatch]]:
        """This rank's microbatches of each mini-batch, in order (:attr:`minibatch_bounds`)."""
        bounds = self.minibatch_bounds or [0, len(self.microbatches)]
        return [self.microbatches[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    @property
    def origin_ids(self) -> np.ndarray:
        """Global ids (in :attr:`schedule`) of the sequences :meth:`to_origin` returns on this
        rank, in that order: the samples its DP rank read for this step, in the order read
        (pre-packed samples split into their sequences; samples held back from the previous
        step first, those held back for the next step left out), ``-1`` for each zero-length
        one (it has no global id: it is never scheduled, and counted in
        ``stats.empty_samples``)."""
        if self.schedule is None or self._topology is None:
            raise ConfigError("origin_ids needs a Step from wrap_data_iterator")
        return origin_slots(self.schedule, self._topology.dp_rank, self._empty_at)

    def to_origin(self, values: Sequence[torch.Tensor], *, per_sequence: bool = False) -> list[torch.Tensor]:
        """Values computed on this step's microbatches, back on the rank that read each sample.

        Collective over the model's process group of the DP x CP plane (never the wrapper's):
        every rank that received this step calls it, with values of one dtype and trailing
        shape. The ranks first agree on their values, so a mistake on one rank raises the same
        error on all.

        Args:
            values: One tensor per microbatch of this rank, aligned with its tokens on the
                first axis (this rank's CP shard under CP; pads included), e.g. per-token
                log-probs ``[T_local]`` or ``[T_local, k]``. With ``per_sequence``: aligned
                with the microbatch's sequences (``sample_ids``), one row each.

        Returns:
            One tensor per entry of :attr:`origin_ids` (with no pre-packed or deferred
            samples: one per sample this rank read, in read order), each holding that
            sequence's real tokens only (pads removed, CP shards put back together), or its
            one row with ``per_sequence``. A zero-length sample, and a sequence dropped for
            being too long, get an empty tensor (``[0, *trailing]``, the values' dtype and
            device; ``torch.empty(0)`` on a step without microbatches); a truncated
            sequence its trained tokens.

        Raises:
            ConfigError: Not one tensor per microbatch, rows that do not match the
                microbatch, tensors of different dtype, trailing shape or device, ranks
                that disagree on them or on ``per_sequence`` (naming the rank), or a call
                after the iterator ended or was closed where it created the plane group.
            SeqpackTypeError: ``values`` is not a list of tensors.
        """
        return to_origin(self, values, per_sequence=per_sequence)

    def record_times(self, seconds_per_microbatch: Sequence[float] | np.ndarray) -> None:
        """Report how long each of this rank's microbatches of this step took (seconds, in
        microbatch order), for ``wrap_data_iterator(..., calibrate=True)``.

        The times travel with a later step's length gather; every rank's calibrator fits
        the same model from them. Times that are NaN, infinite or <= 0 are skipped and
        counted. :class:`seqpack.calibrate.MicrobatchTimer` calls this.

        Raises:
            ConfigError: The iterator does not calibrate, or not one time per microbatch (on
                ranks that read data, that also fails the next step on every rank).
        """
        if self._recorder is None:
            raise ConfigError(
                "record_times needs calibration: pass calibrate=True to wrap_data_iterator (this step's iterator "
                "does not calibrate)"
            )
        self._recorder(self.step, seconds_per_microbatch, self.num_microbatches)


class StepTrace:
    """Seconds per phase and exchange bytes of one step on this rank."""

    def __init__(self, times: np.ndarray | None = None) -> None:
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.traffic: dict[str, int] = {}
        # The microbatch-time words the step carries (None without calibrate).
        self.times = times

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        tick = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - tick


@dataclasses.dataclass(frozen=True)
class Progress:
    """The producer's resume bookkeeping right after one step: what ``state_dict()``
    reports once that step has been handed over."""

    steps: int
    consumed: int
    deferred: list[dict[str, torch.Tensor]]
    iterator: Any
    scheduler: Any
    data_ended: bool
    calibration: Any = None  # TimingLedger.snapshot() under calibrate


@dataclasses.dataclass
class Ready:
    """One prepared step on its way to ``next()``: the :class:`Step`, or how the step ended
    (``message``: end of data or the agreed error, with this rank's own ``cause``), or an
    exception that escaped the preparation (``error``: a communication failure, a bug)."""

    index: int
    step: Step | None = None
    message: StepMessage | None = None
    cause: BaseException | None = None
    error: BaseException | None = None
    progress: Progress | None = None
    copied: Any = None  # CUDA event recorded after the device copy
    nbytes: int = 0  # tensor bytes of the step's microbatches (the prefetch memory budget)


def tensors_of(batch: PackedBatch) -> Iterator[torch.Tensor]:
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if isinstance(value, torch.Tensor):
            yield value


def check_device(device: Any, pin_memory: Any) -> tuple[torch.device | None, bool]:
    """The device steps are copied to (``None``: stay on the CPU) and whether to pin."""
    pin = check_bool("pin_memory", pin_memory)
    target = None
    if device is not None:
        try:
            target = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ConfigError(f"device must be a torch.device or a device string, got {device!r} ({exc})") from None
        if target.type == "cpu":
            target = None  # CPU runs skip the copy
        elif target.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"device={device!r} but CUDA is not available")
            if target.index is None:
                target = torch.device("cuda", torch.cuda.current_device())
    if pin and not torch.cuda.is_available():
        warn_once(logger, "pin_memory", "pin_memory=True ignored: CUDA is not available")
        pin = False
    return target, pin


class DeviceCopy:
    """Pins a step's tensors and copies them to ``device`` where they are prepared (on CUDA
    under prefetch on a side stream, with an event :meth:`hand_over` orders before the
    caller's work)."""

    def __init__(self, device: torch.device | None, pin_memory: bool, background: bool) -> None:
        self.device, self.pin_memory, self.background = device, pin_memory, background
        self._stream: Any = None

    def place(self, batches: list[PackedBatch], trace: StepTrace) -> tuple[list[PackedBatch], Any]:
        device = self.device
        if device is None and not self.pin_memory:
            return batches, None
        with trace.phase("copy"):
            if self.pin_memory:
                batches = [map_tensors(b, lambda t: t if t.is_pinned() else t.pin_memory()) for b in batches]
            if device is None:
                return batches, None
            if device.type != "cuda" or not self.background:
                return [batch.to(device, non_blocking=self.pin_memory) for batch in batches], None
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=device)
            with torch.cuda.stream(self._stream):
                moved = [batch.to(device, non_blocking=self.pin_memory) for batch in batches]
                event = torch.cuda.Event()
                event.record(self._stream)
            return moved, event

    @staticmethod
    def hand_over(step: Step, copied: Any) -> None:
        """On the calling thread: make its stream wait for the copy, and keep the caching
        allocator from reusing the memory while that stream's work runs."""
        stream = torch.cuda.current_stream(copied.device)
        stream.wait_event(copied)
        for batch in step.microbatches:
            for tensor in tensors_of(batch):
                tensor.record_stream(stream)
