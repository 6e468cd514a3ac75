"""The ``"balanced"`` scheduler: validates its options and runs the plan, locality and
round order (docs/schedulers.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import Order
from seqpack.packing.packer import pack_lengths
from seqpack.schedulers.balanced.exact import bin_lower_bound
from seqpack.schedulers.balanced.locality import AUTO, TOLERANCE, Local, locality_pays, plan_local
from seqpack.schedulers.balanced.rounds import _rounds, round_position
from seqpack.schedulers.balanced.stages import DEFAULT, Stages, plan_balanced
from seqpack.schedulers.base import GridScheduler
from seqpack.schedulers.request import Request, check_microbatches
from seqpack.schedulers.schedule import Grid
from seqpack.schedulers.shape_limits import BucketPrice
from seqpack.thd import padded_lengths
from seqpack.validation import INT64_MAX, check_choice, check_int, check_number, check_optional_int, check_positive_int


class BalancedScheduler(GridScheduler):
    """FLOPs-aware scheduler balancing replica totals and per-round maxima (docs/schedulers.md).

    Args:
        order: ``"heavy_first"`` (default), ``"pipeline"`` (light microbatches at both
            ends, heavy ones in the middle) or ``"as_planned"`` (the planner's round order).
        min_microbatches: At least this many microbatches (e.g. pipeline stages).
        microbatch_multiple: Microbatch count is a multiple of this.
        num_microbatches: Force exactly this many microbatches.
        max_repair_moves: Cap on the swaps that repair a replica-first plan or locality's
            per-replica plan (``sync="replica"``; default ``8 * dp + 64``; 0 turns off
            replica-first and the repair).
        locality: Keep sequences on the DP rank that read them where that predicts at most
            ``locality_tolerance`` more step time: ``"auto"`` (default) where the request's
            ``bytes_per_token`` make it pay, ``True`` always, ``False`` never (replicas are
            still renamed).
        locality_tolerance: Relative step-time increase a local plan may cost (default 0.1%).
        stages: The plan's stages (:data:`~seqpack.schedulers.balanced.stages.DEFAULT`).
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
        locality: bool | str = AUTO,
        locality_tolerance: float = TOLERANCE,
        stages: Stages = DEFAULT,
    ) -> None:
        self.order = check_choice("order", order, Order)
        self.min_microbatches = check_int("min_microbatches", min_microbatches, minimum=0)
        self.microbatch_multiple = check_positive_int("microbatch_multiple", microbatch_multiple)
        self.num_microbatches = check_optional_int("num_microbatches", num_microbatches, minimum=0)
        self.max_repair_moves = check_optional_int("max_repair_moves", max_repair_moves, minimum=0, maximum=INT64_MAX)
        self.locality: bool | str = _check_locality(locality)
        self.locality_tolerance = check_number("locality_tolerance", locality_tolerance, minimum=0.0)
        if not isinstance(stages, Stages):
            raise SeqpackTypeError(f"stages must be a seqpack.schedulers.balanced.stages.Stages, got {stages!r}")
        self.stages = stages

    def resolve_cost(self, cost: CostModel | None) -> CostModel:
        """The cost model this scheduler balances: ``cost``, or the default model's FLOPs."""
        return default_cost_model() if cost is None else cost

    plans_buckets = True

    def uses_locality(self, *, sequences: int, tokens: int, dp_size: int, bytes_per_token: float | None) -> bool:
        """Whether a plan of ``sequences`` (``tokens`` padded tokens) into ``dp_size`` replicas
        runs locality: ``locality`` if a bool, else :func:`~seqpack.schedulers.balanced.locality.locality_pays`."""
        if dp_size <= 1:
            return False
        if self.locality != AUTO:
            return bool(self.locality)
        return locality_pays(bytes_per_token, sequences=sequences, tokens=tokens, dp_size=dp_size)

    def _plan(self, request: Request) -> tuple[Grid, np.ndarray]:
        n, origin = request.num_sequences, request.origin
        dp_size, capacity, sync, static_shapes = request.dp_size, request.capacity, request.sync, request.static_shapes
        model = self.resolve_cost(request.cost)  # the base took it at the static CP group
        min_microbatches = self.min_microbatches
        price = BucketPrice.of(static_shapes, capacity, model.linear)
        if static_shapes is not None:
            min_microbatches = max(min_microbatches, -(-n // (dp_size * static_shapes.max_real_sequences)))
        if n or self.num_microbatches:
            check_microbatches(
                dp_size,
                min_microbatches=self.min_microbatches,
                microbatch_multiple=self.microbatch_multiple,
                num_microbatches=self.num_microbatches,
            )
        padded = padded_lengths(request.lengths, request.pad_multiple)
        costs = model.cost(padded)
        stages = self.stages
        if request.sample_cost is not None:  # the longest need not be the costliest: fill costliest first
            costs = costs + request.sample_cost
            stages = dataclasses.replace(stages, fill_order=_costliest_first(costs, stages.fill_order))
        with np.errstate(over="ignore"):
            step_cost = float(costs.sum()) + model.constant * max(dp_size, 1)
        if not np.isfinite(step_cost):
            raise ConfigError(f"the step's total cost under {model!r} is past float64: scale the coefficients down")
        # One replica: the single-rank packer where it reaches the fewest microbatches.
        single_rank = dp_size == 1 and self.num_microbatches is None and static_shapes is None
        if single_rank and n and self.stages == DEFAULT:
            single = _single_rank(padded, costs, capacity, min_microbatches, self.microbatch_multiple)
            if single is not None:
                round_of, load = single
                position = round_position(load, self.order)
                return _rounds(position[round_of], load.shape[0], 1), np.zeros(0, dtype=np.int64)
        plan = plan_balanced(
            padded,
            costs,
            dp_size=dp_size,
            capacity=capacity,
            constant=model.constant,
            min_microbatches=min_microbatches,
            microbatch_multiple=self.microbatch_multiple,
            num_microbatches=self.num_microbatches,
            max_repair_moves=self.max_repair_moves,
            origin=origin,
            sync=sync,
            price=price,
            stages=stages,
        )
        replica = self.stages.relabel(plan.replica_of, origin, padded, dp_size)
        if self.uses_locality(
            sequences=n, tokens=int(padded.sum()), dp_size=dp_size, bytes_per_token=request.bytes_per_token
        ):
            step = Local(
                padded, costs, origin, plan, replica, dp_size, capacity, model.constant, sync,
                self.max_repair_moves, self.locality_tolerance, self.stages.relabel,
            )  # fmt: skip
            local = plan_local(step, self.stages.locality)
            plan, replica = (plan, replica) if local is None else local
        position = round_position(plan.load, self.order)
        cell = position[plan.round_of] * dp_size + replica
        return _rounds(cell, plan.num_microbatches, dp_size), np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"BalancedScheduler(order={self.order!r}, "
            f"min_microbatches={self.min_microbatches}, microbatch_multiple={self.microbatch_multiple}, "
            f"num_microbatches={self.num_microbatches}, max_repair_moves={self.max_repair_moves}, "
            f"locality={self.locality!r}, locality_tolerance={self.locality_tolerance}"
            + ("" if self.stages == DEFAULT else f", stages={self.stages!r}")
            + ")"
        )


def _single_rank(
    padded: np.ndarray, costs: np.ndarray, capacity: int, min_microbatches: int, microbatch_multiple: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(round_of, load[M, 1])`` of :func:`seqpack.packing.pack_lengths` when it packs into the
    fewest microbatches any plan can have and that count meets the limits; else None."""
    packing = pack_lengths(padded, capacity)
    count = packing.num_packs
    if count < min_microbatches or count % microbatch_multiple or count != bin_lower_bound(padded, capacity):
        return None
    load = np.bincount(packing.pack_of, weights=costs, minlength=count).reshape(count, 1)
    return packing.pack_of, load


def _costliest_first(
    costs: np.ndarray, fill_order: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """A fill order by ``costs``, costliest first, ties in ``fill_order``'s order."""

    def order(padded: np.ndarray, origin: np.ndarray | None) -> np.ndarray:
        base = fill_order(padded, origin)
        return base[np.argsort(-costs[base], kind="stable")]

    return order


def _check_locality(value: object) -> bool | str:
    """``locality`` as ``"auto"``, True or False (ConfigError / SeqpackTypeError otherwise)."""
    if isinstance(value, str):
        if value != AUTO:
            raise ConfigError(f"locality must be {AUTO!r}, True or False, got {value!r}")
        return AUTO
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise SeqpackTypeError(f"locality must be {AUTO!r}, True or False, got {value!r} ({type(value).__name__})")
