"""``"balanced"``: FLOPs-aware packing that minimises the predicted step time under the
``sync`` by a composition of stages (:data:`~seqpack.schedulers.balanced.stages.DEFAULT`;
docs/schedulers.md describes each). Deterministic: ties break by index, on every rank alike.
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
