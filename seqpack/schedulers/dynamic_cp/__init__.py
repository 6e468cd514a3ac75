"""Dynamic context parallelism: per microbatch round, the DP x CP ranks form CP groups.

Long sequences spread over as many ranks as they need (and more when that shortens the
step); short ones stay on one rank and pay no CP communication. Modules:

- ``padding``: the padding rule of a group (``2 * c * pad_multiple``), the allowed sizes.
- ``plan``: :class:`DynamicCpSchedule`, the plan of one step (groups per round, ids per
  group), with ``validate``, ``to_arrays``/``from_arrays`` and ``fingerprint``.
- ``cost``: :class:`GroupCost` (compute split over the group + Transformer Engine's p2p
  ring) and :func:`predicted_step_time`.
- ``planner``: :func:`plan_dynamic_cp` (the search over heights and builders).
- ``bound``: :func:`~seqpack.schedulers.dynamic_cp.bound.step_time_lower_bound`, a step time
  no plan can beat (what benchmarks measure plans against; its proof in the docstring).
- ``calibrator``: :class:`GroupCostCalibrator`, the group cost (CP ring included) fitted
  online to measured times (``PackingConfig(dynamic_cp=True, calibrate=True)``).
- ``scheduler``: :class:`~seqpack.schedulers.dynamic_cp.scheduler.DynamicCpScheduler`, the
  planner as the registered scheduler ``"dynamic_cp"``; ``minibatches``: each mini-batch
  planned alone and the plans joined (``PackingConfig(minibatches=k)``, ``join``); ``groups``:
  samples with a ``group_id`` kept on one replica's own CP ranks. They import
  ``seqpack.schedulers.base``, so this ``__init__`` does not import them.
- ``pieces``: the shards a step's exchange moves (one per sequence and rank of its group) and
  who cuts each; ``stats``: :func:`~seqpack.schedulers.dynamic_cp.stats.plan_stats`, a
  plan's :class:`~seqpack.stats.StepStats`. Running a plan: ``seqpack.loader.dynamic``.
- Private: ``_candidate`` (a plan while it is built, and its exact score), ``_rounds``
  (the lockstep builder and static CP), ``_replica`` (the replica-sync builder),
  ``_checks`` (the plan's invariants); their numba kernels are
  ``seqpack.schedulers._kernels.cp_planner``.

Only these entry points are exported.
"""

from seqpack.schedulers.dynamic_cp.calibrator import GroupCostCalibrator
from seqpack.schedulers.dynamic_cp.cost import FEATURES, GroupCost, predicted_step_time
from seqpack.schedulers.dynamic_cp.padding import GroupSizes, allowed_group_sizes, cp_pad_multiple
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp

__all__ = [
    "FEATURES",
    "DynamicCpSchedule",
    "GroupCost",
    "GroupCostCalibrator",
    "GroupSizes",
    "allowed_group_sizes",
    "cp_pad_multiple",
    "plan_dynamic_cp",
    "predicted_step_time",
]
