"""Dynamic context parallelism: per microbatch round, the DP x CP ranks form CP groups.

Long sequences spread over as many ranks as they need (and more when that shortens the
step); short ones stay on one rank and pay no CP communication. A plan is a
:class:`seqpack.schedulers.Schedule` whose ``group_sizes`` is ``"pow2"`` or ``"any"``, run by
everything that runs static plans (docs/dynamic_cp.md). Modules: ``planner``
(:func:`plan_dynamic_cp`), ``scheduler`` (the registered ``"dynamic_cp"``; it imports
``seqpack.schedulers.base``, so this ``__init__`` does not import it), ``pieces`` (the shards a
step's exchange moves); private: ``_candidate`` (a plan while it is built, and its exact
score), ``_rounds`` (the lockstep builder and static CP), ``_replica`` (the replica-sync
builder), their kernels in ``seqpack.schedulers._kernels.cp_planner``.
"""

from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import allowed_group_sizes

__all__ = ["allowed_group_sizes", "plan_dynamic_cp"]
