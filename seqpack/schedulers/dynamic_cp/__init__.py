"""Dynamic context parallelism: per microbatch round, the DP x CP ranks form CP groups.

Long sequences spread over as many ranks as they need (and more when that shortens the
step); short ones stay on one rank and pay no CP communication.

A plan is a :class:`seqpack.schedulers.Schedule` whose ``group_sizes`` is ``"pow2"`` or
``"any"``, and everything that runs static plans runs it: its groups, the padding of a group
(:func:`seqpack.thd.group_padded_lengths`), the allowed sizes
(:mod:`seqpack.schedulers.group_sizes`), the one cost type (:class:`seqpack.cost.CostModel`, its ring terms),
:func:`seqpack.schedulers.predicted_step_time`, mini-batches and sample groups. Modules:

- ``planner``: :func:`plan_dynamic_cp` (the search over heights and builders).
- ``scheduler``: :class:`~seqpack.schedulers.dynamic_cp.scheduler.DynamicCpScheduler`, the
  planner as the registered scheduler ``"dynamic_cp"`` (it imports
  ``seqpack.schedulers.base``, so this ``__init__`` does not import it).
- ``pieces``: the shards a step's exchange moves (one per sequence and rank of its group) and
  who cuts each. A plan's :class:`~seqpack.stats.StepStats`: :meth:`seqpack.stats.StepStats.from_schedule`;
  its calibrator: :class:`seqpack.calibrate.CostCalibrator` (of a group cost). Running a plan:
  ``seqpack.loader.cp_mode``.
- Private: ``_candidate`` (a plan while it is built, and its exact score), ``_rounds``
  (the lockstep builder and static CP), ``_replica`` (the replica-sync builder);
  their numba kernels are ``seqpack.schedulers._kernels.cp_planner``.

Only these entry points are exported.
"""

from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import allowed_group_sizes

__all__ = ["allowed_group_sizes", "plan_dynamic_cp"]
