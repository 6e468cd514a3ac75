"""The ``"balanced"`` scheduler: validates its options and runs the plan, locality and
round order (package docstring).
"""

from __future__ import annotations

import numpy as np

from seqpack.cost import CostModel, GroupCost, default_cost_model
from seqpack.errors import ConfigError
from seqpack.options import Objective, Order
from seqpack.schedulers.balanced.layout import _rounds, objective_for, relabel_replicas, round_position
from seqpack.schedulers.balanced.locality import TOLERANCE, plan_local
from seqpack.schedulers.balanced.plan import plan_balanced
from seqpack.schedulers.base import GridScheduler
from seqpack.schedulers.request import check_microbatches
from seqpack.thd import padded_lengths
from seqpack.validation import (
    INT64_MAX,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_optional_int,
    check_positive_int,
)


class BalancedScheduler(GridScheduler):
    """FLOPs-aware scheduler balancing replica totals and per-round maxima (module docs).

    Args:
        order: ``"heavy_first"`` (default), ``"pipeline"`` (light microbatches at both
            ends, heavy ones in the middle) or ``"as_planned"`` (the planner's round order).
        min_microbatches: At least this many microbatches (e.g. pipeline stages).
        microbatch_multiple: Microbatch count is a multiple of this.
        num_microbatches: Force exactly this many microbatches.
        max_repair_moves: Cap on the repair pass (default ``8 * dp + 64``; 0 disables it).
        objective: ``"both"`` (default): balance replica totals and per-round maxima;
            where they conflict, keep both equally close to their lower bounds.
            ``"rounds"`` (FSDP): never make the rounds slower. ``"replicas"`` (DDP,
            ZeRO-1, pipeline parallel: rounds do not sync): balance replica totals only.
        locality: Keep sequences on the DP rank that read them where that predicts at
            most ``locality_tolerance`` more step time, at the same microbatch count
            (:mod:`seqpack.schedulers.balanced.locality`; default on). ``False``: plan for balance
            alone, then only rename replicas.
        locality_tolerance: Relative step-time increase a local plan may cost (default
            0.001, i.e. 0.1%).
    """

    name = "balanced"

    def __init__(
        self,
        *,
        order: str = "heavy_first",
        min_microbatches: int = 1,
        microbatch_multiple: int = 1,
        num_microbatches: int | None = None,
        max_repair_moves: int | None = None,
        objective: str = "both",
        locality: bool = True,
        locality_tolerance: float = TOLERANCE,
    ) -> None:
        order = check_choice("order", order, Order)
        objective = check_choice("objective", objective, Objective)
        check_int("min_microbatches", min_microbatches, minimum=0)
        check_positive_int("microbatch_multiple", microbatch_multiple)
        check_optional_int("num_microbatches", num_microbatches, minimum=0)
        check_optional_int("max_repair_moves", max_repair_moves, minimum=0, maximum=INT64_MAX)
        self.order = order
        self.min_microbatches = int(min_microbatches)
        self.microbatch_multiple = int(microbatch_multiple)
        self.num_microbatches = None if num_microbatches is None else int(num_microbatches)
        self.max_repair_moves = None if max_repair_moves is None else int(max_repair_moves)
        self.objective = objective
        self.locality = check_bool("locality", locality)
        self.locality_tolerance = check_number("locality_tolerance", locality_tolerance, minimum=0.0)

    def resolve_cost(self, cost: CostModel | GroupCost | None) -> CostModel | GroupCost:
        """The cost model this scheduler balances: ``cost``, or the default model's FLOPs."""
        return default_cost_model() if cost is None else cost

    uses_sync = True

    def _plan(  # takes sync (uses_sync)
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        dp_size: int,
        capacity: int,
        pad_multiple: int,
        cost: CostModel | None,
        origin: np.ndarray,
        sync: str | None = None,
    ) -> tuple[list[list[np.ndarray]], np.ndarray]:
        model = default_cost_model() if cost is None else cost  # a GroupCost was made this one by the base
        if ids.size or self.num_microbatches:
            check_microbatches(
                dp_size,
                min_microbatches=self.min_microbatches,
                microbatch_multiple=self.microbatch_multiple,
                num_microbatches=self.num_microbatches,
            )
        padded = padded_lengths(lengths, pad_multiple)
        costs = model.cost(padded)
        with np.errstate(over="ignore"):
            step_cost = float(costs.sum()) + model.constant * max(dp_size, 1)
        if not np.isfinite(step_cost):
            raise ConfigError(f"the step's total cost under {model!r} is past float64: scale the coefficients down")
        plan = plan_balanced(
            padded,
            costs,
            dp_size=dp_size,
            capacity=capacity,
            constant=model.constant,
            min_microbatches=self.min_microbatches,
            microbatch_multiple=self.microbatch_multiple,
            num_microbatches=self.num_microbatches,
            max_repair_moves=self.max_repair_moves,
            objective=self.objective,
            origin=origin,
            sync=sync,
        )
        replica = relabel_replicas(plan.replica_of, origin, padded, dp_size)
        # Locality is judged by the step time the plan was made for: the sync's when given.
        objective = objective_for(self.objective, sync)
        if self.locality and dp_size > 1:
            local = plan_local(
                padded,
                costs,
                origin,
                plan,
                dp_size=dp_size,
                capacity=capacity,
                constant=model.constant,
                objective=objective,
                max_repair_moves=self.max_repair_moves,
                tolerance=self.locality_tolerance,
                reference_ranks=replica,
            )
            if local is not None:
                plan, replica = local
        m_count = plan.num_microbatches
        position = round_position(plan.load, self.order)
        return _rounds(ids, position[plan.round_of] * dp_size + replica, m_count, dp_size), np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"BalancedScheduler(order={self.order!r}, objective={self.objective!r}, "
            f"min_microbatches={self.min_microbatches}, microbatch_multiple={self.microbatch_multiple}, "
            f"num_microbatches={self.num_microbatches}, max_repair_moves={self.max_repair_moves}, "
            f"locality={self.locality}, locality_tolerance={self.locality_tolerance})"
        )
