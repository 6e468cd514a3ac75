"""``"dynamic_cp"``: dynamic context parallelism as a registered scheduler.

``get_scheduler("dynamic_cp", group_sizes=..., group_cost=...)`` returns a
:class:`DynamicCpScheduler`; its :meth:`~DynamicCpScheduler.schedule` takes the arguments of
every scheduler and returns a :class:`~seqpack.schedulers.Schedule` whose groups change per
microbatch round (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`, with ``origin``).
``PackingConfig(scheduler="dynamic_cp")`` is ``PackingConfig(dynamic_cp=True)`` (the
scheduler's options fill ``cp_group_sizes`` and ``group_cost``; docs/dynamic_cp.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from seqpack.cost import CostModel, GroupCost
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import GroupSizes, Sync
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.dynamic_cp.planner import plan_dynamic_cp
from seqpack.schedulers.group_sizes import longest_sequence
from seqpack.schedulers.request import as_origin
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.static_limits import refuse_dynamic
from seqpack.thd.static_shapes import StaticShapes
from seqpack.validation import check_choice

__all__ = ["DynamicCpScheduler"]


class DynamicCpScheduler(Scheduler):
    """Plans a step with dynamic CP (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`).

    Args:
        group_sizes: ``"pow2"`` or ``"any"``: the CP group sizes a plan may use; ``None``
            (default): ``"pow2"``, or under ``PackingConfig`` its ``cp_group_sizes``.
        group_cost: The :class:`~seqpack.cost.GroupCost` the plan minimises when
            :meth:`schedule` is given none; ``None``: under ``PackingConfig`` its
            ``group_cost``.
    """

    name = "dynamic_cp"
    uses_sync = True

    def __init__(self, group_sizes: str | GroupSizes | None = None, group_cost: GroupCost | None = None) -> None:
        mode = None if group_sizes is None else check_choice("group_sizes", group_sizes, GroupSizes)
        if mode == GroupSizes.STATIC:
            raise ConfigError(
                "scheduler 'dynamic_cp' takes group_sizes='pow2' or 'any'; static groups are the other schedulers'"
            )
        self.requested_group_sizes = mode
        if group_cost is not None and not isinstance(group_cost, GroupCost):
            raise SeqpackTypeError(
                "group_cost of scheduler 'dynamic_cp' must be a seqpack.cost.GroupCost, "
                f"got {type(group_cost).__name__}"
            )
        self.group_cost = group_cost

    @property
    def group_sizes(self) -> GroupSizes:
        return self.requested_group_sizes or GroupSizes.POW2

    def schedule(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: CostModel | GroupCost | None = None,
        on_oversize: str = "error",
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str = Sync.LOCKSTEP,
        bytes_per_token: float | None = None,
        static_shapes: StaticShapes | None = None,
    ) -> Schedule:
        """The step's dynamic-CP plan over the ``dp_size * cp_size`` ranks.

        Args:
            lengths, dp_size, cp_size, max_tokens_per_rank, pad_multiple, on_oversize: As
                :func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp` (``max_tokens_per_rank``
                per rank; one sequence may hold up to ``dp * cp`` ranks' worth).
            cost: The group cost for this call (a calibrated one); a plain CostModel is a
                microbatch's cost on a static group of ``cp_size`` ranks, with no CP ring
                term. ``None``: the scheduler's ``group_cost``.
            origin: DP rank each sample sits on before the exchange (default: contiguous
                equal blocks); carried by the plan (``Step.to_origin``).
            sync: ``"lockstep"`` (default) or ``"replica"``: the step time minimised.
            bytes_per_token: Not used (the planner does not trade plan time for locality).
            static_shapes: Refused: a group's pack size depends on the group's size, so
                no token bucket fits every rank (use a static-CP scheduler).

        Raises:
            ConfigError: No cost (neither ``cost`` nor ``group_cost``), ``static_shapes``
                given, or bad arguments.
            ScheduleError: An oversize sequence under ``on_oversize="error"``.
        """
        refuse_dynamic(static_shapes, "scheduler 'dynamic_cp'")
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
            sync=sync,
            group_sizes=self.group_sizes,
            on_oversize=on_oversize,
        )
        return dataclasses.replace(plan, origin=as_origin(origin, plan.num_sequences, plan.dp_size))

    def longest_sequence(self, dp_size: int, cp_size: int, max_tokens_per_rank: int, pad_multiple: int) -> int:
        """The longest sequence one group of the ``dp_size * cp_size`` ranks holds."""
        return longest_sequence(dp_size * cp_size, self.group_sizes, max_tokens_per_rank, pad_multiple)

    def resolve_cost(self, cost: CostModel | GroupCost | None) -> CostModel | GroupCost | None:
        """``cost``, else ``group_cost`` (what stats are measured in)."""
        if cost is None and self.group_cost is not None:
            return self.group_cost
        return cost

    def __repr__(self) -> str:
        sizes = None if self.requested_group_sizes is None else str(self.requested_group_sizes)
        return f"DynamicCpScheduler(group_sizes={sizes!r}, group_cost={self.group_cost!r})"
