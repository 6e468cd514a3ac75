"""Dynamic context parallelism: per microbatch round, the DP x CP ranks form CP groups
(docs/dynamic_cp.md). ``planner`` plans (candidates in ``_rounds``, kernels in
``_kernels.cp_planner``); ``scheduler`` is the registered ``"dynamic_cp"`` (not imported here:
it imports ``seqpack.schedulers.base``); ``pieces``, the shards a step's exchange moves.
"""

from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import allowed_group_sizes

__all__ = ["allowed_group_sizes", "plan_dynamic_cp"]
