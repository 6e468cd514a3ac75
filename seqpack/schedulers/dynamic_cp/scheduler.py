"""``"dynamic_cp"``: dynamic context parallelism as a registered scheduler
(``get_scheduler("dynamic_cp", group_sizes=...)``; docs/dynamic_cp.md)."""

from __future__ import annotations

import dataclasses
import functools

from seqpack.cost import DEFAULT_MODEL, CostModel, model_preset
from seqpack.options import GroupSizes
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import allowed_group_sizes, dynamic_group_sizes, group_holds
from seqpack.schedulers.request import Request
from seqpack.schedulers.schedule import Schedule

__all__ = ["DynamicCpScheduler"]


class DynamicCpScheduler(Scheduler):
    """Plans a step with dynamic CP (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`)
    under the request's cost, else :meth:`resolve_cost`'s prior.

    Args:
        group_sizes: The CP group sizes a plan may use: ``"pow2"`` (default; aligned powers
            of two and all ``dp * cp``) or ``"any"`` (every contiguous block).
    """

    name = "dynamic_cp"

    def __init__(self, group_sizes: str | GroupSizes = GroupSizes.POW2) -> None:
        self.group_sizes = dynamic_group_sizes(group_sizes, "scheduler 'dynamic_cp'")

    def plan(self, request: Request) -> Schedule:
        """:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp` under :meth:`resolve_cost`."""
        resolved = dataclasses.replace(request, cost=self.resolve_cost(request.cost))
        return plan_dynamic_cp(resolved, group_sizes=self.group_sizes)

    def longest_sequence(self, dp_size: int, cp_size: int, max_tokens_per_rank: int, pad_multiple: int) -> int:
        """The longest sequence one group of the ``dp_size * cp_size`` ranks holds."""
        sizes = allowed_group_sizes(dp_size * cp_size, self.group_sizes)
        return int(group_holds(sizes, max_tokens_per_rank, pad_multiple).max())

    def resolve_cost(self, cost: CostModel | None) -> CostModel:
        """``cost``, else the prior of docs/dynamic_cp.md (the default model's
        :meth:`~seqpack.cost.CostModel.from_model`)."""
        return _default_cost() if cost is None else cost

    def __repr__(self) -> str:
        return f"DynamicCpScheduler(group_sizes={str(self.group_sizes)!r})"


@functools.cache
def _default_cost() -> CostModel:
    return CostModel.from_model(model_preset(DEFAULT_MODEL))
