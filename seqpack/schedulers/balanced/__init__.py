"""``"balanced"``: FLOPs-aware packing that balances DP replicas and microbatch rounds.

Minimises the predicted step time of the ``sync``
(:func:`~seqpack.schedulers.objective.step_objective`: ``"lockstep"`` ``sum_m max_d
cost[m, d]``, ``"replica"`` ``max_d sum_m cost[m, d]``) within the token capacity, from the
fewest microbatches any packing needs, by a composition of stages
(:data:`~seqpack.schedulers.balanced.stages.DEFAULT`): round targets, bins, rounds, exact
search, replica-first (repaired) where it pays, locality. docs/schedulers.md describes each
stage and what it buys. Deterministic: ties break by index, on every rank alike.

Modules: ``rounds`` (the plan's data, the count search, replica renaming, round order),
``bins``, ``exact``, ``replicas`` (replica-first and the repair), ``locality``, ``stages``, ``plan`` (the
stages at a count, and the count search), ``scheduler`` (:class:`BalancedScheduler`).
"""

from __future__ import annotations

from seqpack.schedulers.balanced.plan import plan_balanced
from seqpack.schedulers.balanced.rounds import relabel_replicas, round_position, round_targets
from seqpack.schedulers.balanced.scheduler import BalancedScheduler

__all__ = [
    "BalancedScheduler",
    "plan_balanced",
    "relabel_replicas",
    "round_position",
    "round_targets",
]
