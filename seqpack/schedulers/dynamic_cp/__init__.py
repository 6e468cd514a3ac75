"""Dynamic context parallelism: per microbatch round, the DP x CP ranks form CP groups.

A plan is a :class:`seqpack.schedulers.Schedule` whose ``group_sizes`` is ``"pow2"`` or
``"any"`` (docs/dynamic_cp.md). Modules: ``planner`` (:func:`plan_dynamic_cp`), ``scheduler``
(the registered ``"dynamic_cp"``; not imported here: it imports ``seqpack.schedulers.base``),
``pieces`` (the shards a step's exchange moves); private: ``_rounds`` (the planner's
candidates; their kernels in ``_kernels.cp_planner``).
"""

from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import allowed_group_sizes

__all__ = ["allowed_group_sizes", "plan_dynamic_cp"]
