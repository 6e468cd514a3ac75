"""Online calibration: fit the scheduler's cost model to measured microbatch times.

The training loop reports each step's microbatch times (``Step.record_times``, or a
:class:`MicrobatchTimer` around each microbatch); the wrapper's :class:`TimingLedger` sends
them with a later step's length gather so that every rank holds the same times, and feeds
them to a :class:`CostCalibrator`, whose fitted model schedules the next steps. How the times
travel and the lag: docs/cost_models.md.

Modules:

* :mod:`~seqpack.calibrate.points`: what a timed microbatch is reduced to (its exact integer
  sums, :func:`microbatch_sums`) and the checks of times and counts.
* :mod:`~seqpack.calibrate.fits`: the two fits, of a static plan's cost terms and of a CP
  group's cost (dynamic CP, its ring terms included).
* :mod:`~seqpack.calibrate.calibrator`: :class:`CostCalibrator`, the one calibrator (the
  window of points, the time filter, warm-up steps, the cached fit, counters, resume state,
  copy; prior until enough timings).
* :mod:`~seqpack.calibrate.ledger`: :class:`TimingLedger` (from ``record`` to ``observe``, with
  resume state), :class:`Measurement`.
* :mod:`~seqpack.calibrate.words`: the int64 words a time travels as (:func:`encode_seconds`,
  :data:`MISSING`, :data:`INVALID`, :data:`ABSENT`).
* :mod:`~seqpack.calibrate.timer`: :class:`MicrobatchTimer` (CUDA events or
  ``perf_counter``, no host sync on the hot path).

Layering: ``words``, ``timer`` and ``points`` import no other calibrate module; ``fits``
imports ``points`` and :mod:`seqpack.cost`; ``calibrator`` imports those and the plan of
:mod:`seqpack.schedulers`; ``ledger`` imports ``points``, ``calibrator`` and the
plan's objective. Nothing here imports the collectives or the loader.
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
