"""Online calibration inside the wrapper: what one :class:`~seqpack.loader.PackingIterator`
does with the microbatch times the training loop reports.

:class:`StepCalibration` owns the :class:`~seqpack.calibrate.TimingLedger` on the ranks that
keep the model (those that read data, and under ``data_owner="tp0"`` the middle pipeline
stages of TP rank 0, which take part in the pipeline's agreement) and gives the wrapper's
step production what it needs: the time words to send with a step's length gather, the
model to schedule with, the fingerprint that covers schedule and model, the words for the
copies' agreements, the absorption of the combined times, and the stats. Every method is a
no-op (or returns ``None``) without ``calibrate``. How the times travel and the lag:
docs/cost_models.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqpack.calibrate import ABSENT, CostCalibrator, Measurement, TimingLedger
from seqpack.calibrate.ledger import check_times
from seqpack.collective import StepError, StepMessage, StepOk
from seqpack.cost import CostModel
from seqpack.loader.config import PackingConfig
from seqpack.loader.step import StepTrace
from seqpack.options import fingerprint_text
from seqpack.schedulers import Schedule, predicted_step_time
from seqpack.stats import StepStats
from seqpack.topology import Topology

__all__ = ["StepCalibration"]


class StepCalibration:
    """The wrapper's side of online calibration (see the module docstring)."""

    def __init__(
        self,
        config: PackingConfig,
        topology: Topology,
        prior: CostModel,
        reads: bool,
        *,
        lag: int | None = None,
    ) -> None:
        """``prior``: the model a new calibrator starts from (the step's resolved cost).
        ``lag``: the largest ``prefetch`` of any rank (default: this rank's): every rank
        sends the times of the same steps, so ranks may differ in prefetch."""
        self.enabled = config.calibrate is not False
        self.reads = reads
        self.topology = topology
        self.prefetch = config.prefetch if lag is None else lag
        self.sync = config.sync
        self.static_shapes = config.static_shapes
        self.ledger: TimingLedger | None = None
        if not self.enabled or not (reads or topology.tp_rank == 0):
            return
        if isinstance(config.calibrate, CostCalibrator):
            calibrator = config.calibrate.copy()
        elif config.dynamic_cp:  # fit the group cost, ring included
            if prior.reference_size is None:  # its compute terms are the cost on the static CP group
                prior = dataclasses.replace(prior, reference_size=topology.cp_size)
            calibrator = CostCalibrator(prior)
        else:  # a static plan's cost: the one balanced on the static group
            calibrator = CostCalibrator(prior.at(topology.cp_size))
        # Steps prepared ahead (prefetch k) are scheduled k steps before the training loop
        # reports the times they wait for: wait that much longer for them.
        # Under dynamic CP each CP rank's times travel in their own column, so the fit sees
        # every group once with its own time (not each replica's slowest rank's).
        copies = topology.cp_size if calibrator.fits_groups else None
        self.ledger = TimingLedger(
            calibrator,
            dp_size=topology.dp_size,
            dp_rank=topology.dp_rank,
            window=2 + self.prefetch,
            sync=config.sync,
            copies=copies,
            copy_rank=topology.cp_rank if copies is not None else 0,
        )

    @property
    def calibrator(self) -> CostCalibrator | None:
        if self.ledger is None:
            return None
        return self.ledger.calibrator

    @property
    def last(self) -> Measurement | None:
        return self.ledger.last if self.ledger is not None else None

    def record(self, step: int, seconds: Sequence[float] | np.ndarray, num_microbatches: int) -> None:
        """``Step.record_times`` (on the training thread)."""
        if self.ledger is not None and self.reads:
            self.ledger.record(step, seconds, num_microbatches)
            return
        # This rank's times are not used; they are still checked (types and count).
        check_times(seconds, num_microbatches, step=step, dp_rank=self.topology.dp_rank)

    def outgoing(self, step: int) -> tuple[np.ndarray | None, str | None]:
        """The time words to send with step ``step``'s length gather, and a bad
        ``record_times`` of this rank to fail the step with (on every rank).

        Only times of steps up to ``step - 1 - prefetch`` go: what the training loop has
        surely recorded (it records a step before asking for the next), whatever the timing
        of the threads, so a calibrated run is reproducible.
        """
        if self.ledger is None:
            return None, None
        return self.ledger.outgoing(upto=step - 1 - self.prefetch), self.ledger.take_error()

    def choose_model(self, trace: StepTrace) -> None:
        """Put the model this step is scheduled with into ``trace``."""
        if self.ledger is not None:
            calibrator = self.ledger.calibrator
            trace.model, trace.fitted = calibrator.model, calibrator.fitted

    def fingerprint(self, plan: Schedule, trace: StepTrace) -> int:
        """What ranks compare: the schedule, and under calibration the model that made it
        (ranks must also agree on the model they fitted)."""
        model = trace.model
        if model is not None:
            words: tuple[object, ...]
            words = tuple(v.hex() if isinstance(v, float) else v for v in dataclasses.astuple(model))
            trace.fingerprint = fingerprint_text(repr((plan.fingerprint(), *words)))
        return trace.fingerprint if trace.fingerprint is not None else plan.fingerprint()

    @staticmethod
    def message_fingerprint(msg: StepOk, trace: StepTrace | None) -> int:
        return trace.fingerprint if trace is not None and trace.fingerprint is not None else msg.fingerprint

    def payload(self, trace: StepTrace | None) -> np.ndarray | None:
        """This rank's time words for an agreement: the DP-gathered table on ranks that
        read, ``ABSENT`` (never counted by the MAX) on the others (same length: every
        ledger has the same steps)."""
        if self.ledger is None or trace is None:
            return None
        if trace.times is not None:
            return trace.times.reshape(-1)
        return np.full(self.topology.dp_size * self.ledger.width(), ABSENT, dtype=np.int64)

    def absorb(self, msg: StepMessage, trace: StepTrace) -> None:
        """After the agreements every rank holds the same combined times: feed them to the
        calibrator, then register this step's layout for its own times. At the end of data
        the last times are still taken (``PackingIterator.last_measurement``)."""
        ledger = self.ledger
        if ledger is None or isinstance(msg, StepError) or trace.times is None:
            return
        calibrator = ledger.calibrator
        if trace.model is None:  # a middle stage: the model its peers scheduled with is this one
            trace.model, trace.fitted = calibrator.model, calibrator.fitted
        in_seconds = trace.fitted or calibrator.prior_in_seconds
        ledger.incoming(msg.step, trace.times.reshape(self.topology.dp_size, -1))
        if isinstance(msg, StepOk):
            ledger.add_schedule(msg.step, msg.schedule, trace.model if in_seconds else None)

    def fill_stats(self, stats: StepStats, plan: Schedule, trace: StepTrace, stats_cost: CostModel) -> None:
        """The model in use, its prediction for this step, and its error on the last
        measured one."""
        stats.calibrated = trace.fitted
        model = trace.model if trace.model is not None else stats_cost
        stats.cost_model = model
        stats.predicted_step_time = predicted_step_time(plan, model, sync=self.sync, static_shapes=self.static_shapes)
        last = self.last
        if last is not None:
            stats.measured_step, stats.measured_step_time = last.step, last.measured
            stats.prediction_error = None if last.error is None else float(last.error)

    def snapshot(self) -> Any:
        return self.ledger.snapshot() if self.ledger is not None else None

    def state_dict(self, snapshot: Any) -> dict[str, Any] | None:
        return self.ledger.state_dict(snapshot) if self.ledger is not None else None

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is not None and self.ledger is not None:
            self.ledger.load_state_dict(state)
