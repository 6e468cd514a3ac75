"""What one wrapper step hands over: :class:`Step`, and :class:`StepTrace`, the timings and
exchange bytes (and, under calibration, the model) gathered while the step is prepared."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError
from seqpack.schedulers import Schedule
from seqpack.stats import StepStats
from seqpack.thd import PackedBatch

__all__ = ["Step", "StepTrace"]


@dataclasses.dataclass
class Step:
    """One training step's data for this rank.

    Attributes:
        num_microbatches: Microbatches every rank runs this step (equal on all ranks).
        microbatches: This rank's CP shard of each microbatch; metadata-only on middle
            pipeline stages.
        stats: Tokens, padding, balance and FLOPs of the whole global batch.
        step: Step index (0-based).
        schedule: The step's schedule (identical on every rank).
        schedule_fingerprint: ``schedule.fingerprint()``.
        timings: Seconds spent in ``read``, ``gather``, ``schedule``, ``exchange``,
            ``pack`` (pack + CP shard), ``broadcast`` (TP + PP, without ``wait``), ``wait``
            (a broadcast receiver waiting for its source) and ``total`` on this rank (in the
            background under prefetch); ``copy`` (pinning and starting the device copy, when
            asked for); ``blocked``: how long the ``next()`` that returned this step waited
            for it on the calling thread (with prefetch ~0 when the step was ready).
        exchange_bytes: ``sent``, ``received``, ``kept`` (stayed local) and ``payload``
            (tokens of this replica's samples) bytes of this rank's exchange.
    """

    num_microbatches: int
    microbatches: list[PackedBatch]
    stats: StepStats
    step: int = 0
    schedule: Schedule | None = None
    schedule_fingerprint: int = 0
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    exchange_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    _recorder: Callable[[int, Sequence[float] | np.ndarray, int], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def record_times(self, seconds_per_microbatch: Sequence[float] | np.ndarray) -> None:
        """Report how long each of this rank's microbatches of this step took (seconds, in
        microbatch order), for ``wrap_data_iterator(..., calibrate=True)``.

        The times travel with a later step's length gather; every rank's calibrator fits
        the same model from them (:mod:`seqpack.calibrate`). Times that are NaN, infinite
        or <= 0 are skipped and counted. :class:`seqpack.timing.MicrobatchTimer` calls this.

        Raises:
            ConfigError: The iterator does not calibrate, or not one time per microbatch.
                On ranks whose times the calibrator uses (ranks that read data), a wrong
                count also fails the next step on every rank with that message.
        """
        if self._recorder is None:
            raise ConfigError(
                "record_times needs calibration: pass calibrate=True to wrap_data_iterator (this step's iterator "
                "does not calibrate)"
            )
        self._recorder(self.step, seconds_per_microbatch, self.num_microbatches)


class StepTrace:
    """Seconds per phase and exchange bytes of one step on this rank."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.traffic: dict[str, int] = {}
        # Calibration (seqpack.calibrate): the model this step is scheduled with, the
        # fingerprint of schedule and model, and the microbatch-time words being combined.
        self.model: CostModel | None = None
        self.fitted = False  # the model is fitted to measured times
        self.fingerprint: int | None = None
        self.times: np.ndarray | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        tick = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - tick
