"""Online calibration: fit the scheduler's cost model to measured microbatch times.

The training loop reports each step's microbatch times (``Step.record_times``, or a
:class:`MicrobatchTimer` around each microbatch); the wrapper's :class:`TimingLedger` sends
them with a later step's length gather so that every rank holds the same times, and feeds
them to a :class:`CostCalibrator`, whose fitted model schedules the next steps. How the times
travel and the lag: docs/cost_models.md.

Modules:

* :mod:`~seqpack.calibrate.base`: :class:`Calibrator`, what every calibrator shares (the window
  of points, the time filter, warm-up steps, the cached fit, counters, resume state, copy);
  :class:`GroupCostCalibrator` is one too.
* :mod:`~seqpack.calibrate.calibrator`: :class:`CostCalibrator` (exact robust NNLS fit of a
  :class:`~seqpack.cost.CostModel`, prior until enough timings).
* :mod:`~seqpack.calibrate.group_cost`: :class:`GroupCostCalibrator` (the same fit of a
  dynamic-CP :class:`~seqpack.cost.GroupCost`, its CP ring terms included).
* :mod:`~seqpack.calibrate.ledger`: :class:`TimingLedger` (from ``record`` to ``observe``, with
  resume state), :class:`Measurement`, :func:`microbatch_sums`, :func:`step_time`.
* :mod:`~seqpack.calibrate.words`: the int64 words a time travels as (:func:`encode_seconds`,
  :data:`MISSING`, :data:`INVALID`, :data:`ABSENT`).
* :mod:`~seqpack.calibrate.timer`: :class:`MicrobatchTimer` (CUDA events or
  ``perf_counter``, no host sync on the hot path).

Layering: ``words``, ``timer`` and ``base`` import no other calibrate module; ``calibrator``
and ``group_cost`` import ``base``, :mod:`seqpack.cost` (and ``group_cost`` the plan of
:mod:`seqpack.schedulers`); ``ledger`` imports ``base``, ``calibrator`` and
:mod:`seqpack.stats`. Nothing here imports the collectives or the loader.
"""

from __future__ import annotations

from seqpack.calibrate.base import Calibrator
from seqpack.calibrate.calibrator import CostCalibrator
from seqpack.calibrate.group_cost import GroupCostCalibrator
from seqpack.calibrate.ledger import Measurement, TimingLedger, microbatch_sums, step_time
from seqpack.calibrate.timer import MicrobatchTimer
from seqpack.calibrate.words import ABSENT, INVALID, MISSING, decode_seconds, encode_seconds

__all__ = [
    "ABSENT",
    "INVALID",
    "MISSING",
    "Calibrator",
    "CostCalibrator",
    "GroupCostCalibrator",
    "Measurement",
    "MicrobatchTimer",
    "TimingLedger",
    "decode_seconds",
    "encode_seconds",
    "microbatch_sums",
    "step_time",
]
