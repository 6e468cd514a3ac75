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
    """Plans a step with dynamic CP (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`).

    Args:
        group_sizes: ``"pow2"`` (default: aligned powers of two and the whole ``dp * cp``,
            about ``dp * cp`` process groups per lane) or ``"any"`` (every contiguous block,
            about ``(dp * cp)**2 / 2`` process groups per lane): the CP group sizes a plan may use.

    A plan minimises the step time under the cost it is given (:class:`~seqpack.cost.CostModel`,
    its ring terms included); without one, :meth:`resolve_cost`'s prior.
    """

    name = "dynamic_cp"

    def __init__(self, group_sizes: str | GroupSizes = GroupSizes.POW2) -> None:
        self.group_sizes = dynamic_group_sizes(group_sizes, "scheduler 'dynamic_cp'")

    def plan(self, request: Request) -> Schedule:
        """:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp` of ``request`` under
        :meth:`resolve_cost` of ``request.cost`` (its errors)."""
        resolved = dataclasses.replace(request, cost=self.resolve_cost(request.cost))
        return plan_dynamic_cp(resolved, group_sizes=self.group_sizes)

    def longest_sequence(self, dp_size: int, cp_size: int, max_tokens_per_rank: int, pad_multiple: int) -> int:
        """The longest sequence one group of the ``dp_size * cp_size`` ranks holds."""
        sizes = allowed_group_sizes(dp_size * cp_size, self.group_sizes)
        return int(group_holds(sizes, max_tokens_per_rank, pad_multiple).max())

    def resolve_cost(self, cost: CostModel | None) -> CostModel:
        """``cost``, else the prior ``PackingConfig(dynamic_cp=True)`` alone plans with: the
        default model's FLOPs and Transformer Engine's ``p2p`` ring over the default
        interconnect (:meth:`~seqpack.cost.CostModel.from_model`; calibration refits it)."""
        return _default_cost() if cost is None else cost

    def __repr__(self) -> str:
        return f"DynamicCpScheduler(group_sizes={str(self.group_sizes)!r})"


@functools.cache
def _default_cost() -> CostModel:
    return CostModel.from_model(model_preset(DEFAULT_MODEL))
