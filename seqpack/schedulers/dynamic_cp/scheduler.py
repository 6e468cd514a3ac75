"""``"dynamic_cp"``: dynamic context parallelism as a registered scheduler.

``get_scheduler("dynamic_cp", group_sizes=..., group_cost=...)`` returns a
:class:`DynamicCpScheduler`; its :meth:`~DynamicCpScheduler.schedule` takes the arguments of
every scheduler and returns a :class:`~seqpack.schedulers.dynamic_cp.DynamicCpSchedule`
(:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`, with ``origin``) instead of a
:class:`~seqpack.schedulers.Schedule`: per microbatch round, the ``dp x cp`` ranks form CP
groups. ``PackingConfig(scheduler="dynamic_cp")`` is ``PackingConfig(dynamic_cp=True)``
(the scheduler's options fill ``cp_group_sizes`` and ``group_cost``; docs/dynamic_cp.md).

Not imported by the package's ``__init__`` (``seqpack.schedulers.base`` imports the
package's ``cost`` and ``plan``; this module imports ``base``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import Sync
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.dynamic_cp.cost import GroupCost
from seqpack.schedulers.dynamic_cp.padding import GroupSizes
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.request import as_origin
from seqpack.validation import check_choice

__all__ = ["DynamicCpScheduler"]


class DynamicCpScheduler(Scheduler):
    """Plans a step with dynamic CP (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`).

    Args:
        group_sizes: ``"pow2"`` or ``"any"``: the CP group sizes a plan may use; ``None``
            (default): ``"pow2"``, or under ``PackingConfig`` its ``cp_group_sizes``.
        group_cost: The :class:`~seqpack.schedulers.dynamic_cp.GroupCost` the plan minimises
            when :meth:`schedule` is given none; ``None``: under ``PackingConfig`` its
            ``group_cost``.
    """

    name = "dynamic_cp"
    uses_sync = True

    def __init__(self, group_sizes: str | GroupSizes | None = None, group_cost: GroupCost | None = None) -> None:
        self.group_sizes = None if group_sizes is None else check_choice("group_sizes", group_sizes, GroupSizes)
        if group_cost is not None and not isinstance(group_cost, GroupCost):
            raise SeqpackTypeError(
                f"group_cost of scheduler 'dynamic_cp' must be a seqpack.schedulers.dynamic_cp.GroupCost, got "
                f"{type(group_cost).__name__}"
            )
        self.group_cost = group_cost

    def schedule(  # type: ignore[override]  # a dynamic-CP plan, not a Schedule (module docstring)
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: GroupCost | CostModel | None = None,
        on_oversize: str = "error",
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str | None = None,
    ) -> DynamicCpSchedule:
        """The step's dynamic-CP plan over the ``dp_size * cp_size`` ranks.

        Args:
            lengths, dp_size, cp_size, max_tokens_per_rank, pad_multiple, on_oversize: As
                :func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp` (``max_tokens_per_rank``
                per rank; one sequence may hold up to ``dp * cp`` ranks' worth).
            cost: The group cost for this call (a calibrated one); a plain CostModel means
                no CP communication cost. ``None``: the scheduler's ``group_cost``.
            origin: DP rank each sample sits on before the exchange (default: contiguous
                equal blocks); carried by the plan (``Step.to_origin``).
            sync: ``"lockstep"`` (default) or ``"replica"``: the step time minimised.

        Raises:
            ConfigError: No cost (neither ``cost`` nor ``group_cost``), or bad arguments.
            ScheduleError: An oversize sequence under ``on_oversize="error"``.
        """
        chosen = cost if cost is not None else self.group_cost
        if chosen is None:
            raise ConfigError(
                "scheduler 'dynamic_cp' needs a group cost: pass group_cost=GroupCost(...) to it or cost= to "
                "schedule(); without a CP ring term every CP group would look free"
            )
        plan = plan_dynamic_cp(
            lengths,
            dp_size=dp_size,
            cp_size=cp_size,
            max_tokens_per_rank=max_tokens_per_rank,
            pad_multiple=pad_multiple,
            cost=chosen,
            sync=Sync.LOCKSTEP if sync is None else sync,
            group_sizes=self.group_sizes or GroupSizes.POW2,
            on_oversize=on_oversize,
        )
        return dataclasses.replace(plan, origin=as_origin(origin, plan.num_sequences, plan.dp_size))

    def resolve_cost(self, cost: CostModel | None) -> CostModel | None:
        """``cost``, else the compute part of ``group_cost`` (what stats are measured in)."""
        if cost is None and self.group_cost is not None:
            return self.group_cost.compute
        return cost

    def _plan(self, ids: np.ndarray, lengths: np.ndarray, **_: object) -> tuple[list[list[np.ndarray]], np.ndarray]:
        raise NotImplementedError("DynamicCpScheduler plans in schedule() (a DynamicCpSchedule)")

    def __repr__(self) -> str:
        sizes = None if self.group_sizes is None else str(self.group_sizes)
        return f"DynamicCpScheduler(group_sizes={sizes!r}, group_cost={self.group_cost!r})"
