"""Online calibration: fit the scheduler's cost model to measured microbatch times.

The training loop reports each step's microbatch times (``Step.record_times``, or a
:class:`MicrobatchTimer`); the wrapper's :class:`TimingLedger` sends them with a later step's
length gather so that every rank holds the same times, and feeds them to the
:class:`CostCalibrator`, whose fitted model schedules the next steps (docs/cost_models.md,
"Online calibration"). Layering, lowest first: ``words``, ``timer``, ``points``, ``fits``,
``calibrator``, ``ledger``; nothing here imports the collectives or the loader.
"""

from __future__ import annotations

from seqpack.calibrate.calibrator import CostCalibrator
from seqpack.calibrate.ledger import Measurement, TimingLedger
from seqpack.calibrate.points import microbatch_sums
from seqpack.calibrate.timer import MicrobatchTimer
from seqpack.calibrate.words import ABSENT, INVALID, MISSING, decode_seconds, encode_seconds

__all__ = [
    "ABSENT",
    "INVALID",
    "MISSING",
    "CostCalibrator",
    "Measurement",
    "MicrobatchTimer",
    "TimingLedger",
    "decode_seconds",
    "encode_seconds",
    "microbatch_sums",
]
