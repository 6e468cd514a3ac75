"""``"balanced"``: FLOPs-aware packing that balances DP replicas and microbatch rounds.

Minimises the predicted step time under the ``sync``
(:func:`~seqpack.schedulers.objective.step_objective`) within the token capacity, from the
fewest microbatches any packing needs, by a composition of stages
(:data:`~seqpack.schedulers.balanced.stages.DEFAULT`; docs/schedulers.md describes each and
what it buys). Deterministic: ties break by index, on every rank alike. Modules: ``rounds``
(the plan's data and grid helpers), ``stages`` (their composition, the bin rules and
:func:`plan_balanced`), ``exact``, ``replicas``, ``locality``, ``scheduler``.
"""

from __future__ import annotations

from seqpack.schedulers.balanced.rounds import relabel_replicas, round_position, round_targets
from seqpack.schedulers.balanced.scheduler import BalancedScheduler
from seqpack.schedulers.balanced.stages import plan_balanced

__all__ = [
    "BalancedScheduler",
    "plan_balanced",
    "relabel_replicas",
    "round_position",
    "round_targets",
]
