"""Online calibration inside the wrapper, as data: what a step takes in and what it gives back.

:class:`CalibrationState` holds the :class:`~seqpack.calibrate.TimingLedger` on the ranks that
keep the model. Between steps, and only there, the producer takes a :class:`StepInput` (the
model to plan with, the time words that ride the gather, a refused ``record_times``) and
gives back the combined time words every rank holds (:meth:`CalibrationState.absorb`).
Without ``calibrate`` a step's input is empty and nothing is absorbed. How the times travel
and the lag: docs/cost_models.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqpack.calibrate import ABSENT, CostCalibrator, Measurement, TimingLedger
from seqpack.calibrate.ledger import check_times
from seqpack.collective import StepError, StepMessage, StepOk
from seqpack.cost import CostModel
from seqpack.loader.config import PackingConfig
from seqpack.loader.sample_cost import encoder_price
from seqpack.options import DataOwner, Sync, fingerprint_text
from seqpack.schedulers import Schedule, predicted_step_time
from seqpack.stats import StepStats
from seqpack.thd import StaticShapes
from seqpack.topology import Topology

__all__ = ["CalibrationState", "StepInput", "fill_stats", "step_prediction"]


@dataclasses.dataclass(frozen=True)
class StepInput:
    """What one step takes from the calibration state (all ``None`` without a ledger).

    Attributes:
        model: The model to plan with (``None``: the config's cost).
        fitted: ``model`` is fitted to measured times (else it is the prior).
        words: This rank's time words for the length gather (ranks that read).
        blank: ``ABSENT`` words ``[dp * width]``: this rank's share of the agreements' MAX
            while it holds no gathered words (never counted by the MAX).
        error: A refused ``record_times`` of this rank: the step fails with it everywhere.
        encoder_price: The calibrator's price of one vision-encoder FLOP, fitted with
            ``model`` (``None``: the cost's price of a language-model FLOP).
    """

    model: CostModel | None = None
    fitted: bool = False
    words: np.ndarray | None = None
    blank: np.ndarray | None = None
    error: str | None = None
    encoder_price: float | None = None

    def fingerprint(self, plan: Schedule) -> int:
        """What ranks compare: the schedule, and with a model the model that made it (ranks
        must also agree on the model they fitted, and its encoder price)."""
        if self.model is None:
            return plan.fingerprint()
        return fingerprint_text(repr((plan.fingerprint(), *self._model_words)))

    @functools.cached_property
    def _model_words(self) -> tuple[object, ...]:
        """The model and encoder price as exact text (built once a step, compared 2-3 times)."""
        assert self.model is not None  # fingerprint reads this only with a model
        words = tuple(v.hex() if isinstance(v, float) else v for v in dataclasses.astuple(self.model))
        return words if self.encoder_price is None else (*words, self.encoder_price.hex())


class CalibrationState:
    """The wrapper's calibration state: the ledger and its calibrator (module docstring)."""

    def __init__(self, config: PackingConfig, topology: Topology, prior: CostModel, reads: bool, *, lag: int) -> None:
        """``prior``: the model a new calibrator starts from (the step's resolved cost).
        ``lag``: the largest ``prefetch`` of any rank."""
        self.reads = reads
        self.topology = topology
        self.prefetch = lag
        self.ledger: TimingLedger | None = None
        # What Step.record_times calls (None: the iterator does not calibrate).
        self.recorder = None if config.calibrate is False else self.record
        if config.calibrate is False or not (reads or topology.tp_rank == 0):
            return
        if isinstance(config.calibrate, CostCalibrator):
            calibrator = config.calibrate.copy()
        elif config.dynamic_cp:  # fit the group cost, ring included
            if prior.reference_size is None:  # its compute terms are the cost on the static CP group
                prior = dataclasses.replace(prior, reference_size=topology.cp_size)
            calibrator = CostCalibrator(prior)
        else:  # a static plan's cost: the one balanced on the static group, the encoder's too
            static = prior.at(topology.cp_size)
            calibrator = CostCalibrator(static, encoder_price=_encoder_price(config, topology, static))
        # Under dynamic CP each CP rank's times travel in their own column, so the fit sees
        # every group once with its own time.
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
        return self.ledger.calibrator if self.ledger is not None else None

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

    def take(self, step: int) -> StepInput:
        """What step ``step`` takes in. Only times of steps up to ``step - 1 - prefetch`` go:
        what the training loop has surely recorded whatever the threads' timing, so a
        calibrated run is reproducible."""
        ledger = self.ledger
        if ledger is None:
            return StepInput()
        words = error = None
        if self.reads:
            words, error = ledger.outgoing(upto=step - 1 - self.prefetch), ledger.take_error()
        blank = np.full(self.topology.dp_size * ledger.width(), ABSENT, dtype=np.int64)
        calibrator = ledger.calibrator
        return StepInput(calibrator.model, calibrator.fitted, words, blank, error, calibrator.encoder_price)

    def absorb(self, msg: StepMessage, taken: StepInput, times: np.ndarray | None) -> Measurement | None:
        """Feed the calibrator the combined time words ``times`` (not a failed step's), then
        register the step's layout for its own times. Returns the last measured step
        (``None`` before one)."""
        ledger = self.ledger
        if ledger is None:
            return None
        if times is not None and not isinstance(msg, StepError):
            calibrator = ledger.calibrator
            in_seconds = taken.fitted or calibrator.prior_in_seconds
            ledger.incoming(msg.step, times.reshape(self.topology.dp_size, -1))
            if isinstance(msg, StepOk):
                model = taken.model if in_seconds else None
                ledger.add_schedule(msg.step, msg.schedule, model, encoder_price=taken.encoder_price)
        return ledger.last

    def snapshot(self) -> Any:
        return self.ledger.snapshot() if self.ledger is not None else None

    def state_dict(self, snapshot: Any) -> dict[str, Any] | None:
        return self.ledger.state_dict(snapshot) if self.ledger is not None else None

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is not None and self.ledger is not None:
            self.ledger.load_state_dict(state)


def _encoder_price(config: PackingConfig, topology: Topology, prior: CostModel) -> float | None:
    """The prior's price of a vision-encoder FLOP where the calibrator fits the encoder (a
    vision model, and no middle pipeline stage that receives plans without ``sample_cost``)."""
    model = config.model
    if model is None or model.vision is None or model.linear_flops <= 0:
        return None
    if topology.pp_size > 1 and config.data_owner != DataOwner.ALL:
        return None
    price = encoder_price(prior, model)
    return price if math.isfinite(price) and price > 0 else None


def step_prediction(
    plan: Schedule, taken: StepInput, stats_cost: CostModel, *, sync: Sync, static_shapes: StaticShapes | None
) -> tuple[CostModel, float]:
    """The model the step was planned with (``stats_cost`` without one) and the step time it
    predicts for ``plan`` (what ``StepStats.from_schedule(predicted=)`` records)."""
    model = taken.model if taken.model is not None else stats_cost
    return model, predicted_step_time(plan, model, sync=sync, static_shapes=static_shapes)


def fill_stats(stats: StepStats, taken: StepInput, last: Measurement | None, model: CostModel) -> None:
    """The model the step was planned with (:func:`step_prediction`), whether it is fitted,
    and ``last``: the last measured step and the error of its prediction."""
    stats.calibrated = taken.fitted
    stats.cost_model = model
    if last is not None:
        stats.measured_step, stats.measured_step_time = last.step, last.measured
        stats.prediction_error = None if last.error is None else float(last.error)
