"""Step accounting: tokens, padding, balance and FLOPs of one schedule.

Counts are exact Python ints (``seqlen_sq_sum`` passes float32's exact range). Costs are
float64, evaluated on padded lengths: pads run through the dense layers like real tokens.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.cost import check_cost_model
from seqpack.errors import SeqpackTypeError
from seqpack.options import SAMPLE_BYTES_PER_TOKEN, Sync
from seqpack.schedulers.dynamic_cp.pieces import plan_pieces
from seqpack.schedulers.objective import (
    exact_sum,
    microbatch_costs,
    round_lower_bound,
    sequence_costs,
)
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.step_time import bucket_padding, predicted_step_time, rank_times
from seqpack.thd.static_shapes import StaticShapes
from seqpack.validation import check_choice, check_int, check_number

if TYPE_CHECKING:
    from seqpack.cost import CostModel

__all__ = ["SAMPLE_BYTES_PER_TOKEN", "StepStats", "moved_tokens"]


@dataclasses.dataclass(eq=False)
class StepStats:
    """What one step trains on and how evenly it is spread.

    Attributes:
        num_sequences: Sequences trained this step (assigned, after drops).
        num_microbatches: Microbatches per replica.
        min_microbatches: Token lower bound ``ceil(padded tokens / (dp * capacity))``.
        real_tokens, padded_tokens: Tokens without and with padding (fillers included).
        seqlen_sum, seqlen_sq_sum: Exact sums of real lengths and squared real lengths.
        replica_cost: float64 ``[units]``: total cost per DP replica (what DDP / ZeRO-1 / pipeline
            steps wait for).
        imbalance: ``max(replica_cost) / mean(replica_cost)``.
        round_imbalance: ``sum_m max_d cost[m, d] / sum_m mean_d cost[m, d]`` (what an FSDP
            step waits for: every microbatch round ends with its slowest replica).
        lower_bound: ``max(total_cost / dp, largest single sequence cost)``.
        bound_ratio: ``max(replica_cost) / lower_bound`` (1.0 is optimal).
        round_lower_bound: The smallest ``round_imbalance`` any schedule can reach with this
            capacity (:func:`round_lower_bound`); above 1 when one sequence outweighs a full
            microbatch of shorter ones.
        pad_fraction: ``1 - real_tokens / padded_tokens``.
        bucket_tokens: Under ``static_shapes``, the tokens every microbatch's token bucket
            adds beyond its padded tokens (fillers' included), summed; 0 without.
        bucket_fraction: ``bucket_tokens / (padded_tokens + bucket_tokens)``: the share of
            the step's tokens (as the packs hold them) that only fill buckets.
        dropped_sequences, dropped_tokens: Removed by ``on_oversize="drop"``.
        truncated_sequences, truncated_tokens: Tokens cut by ``on_oversize="truncate"`` from
            the sequences trained this step (a deferred one counts when it is trained).
        deferred_sequences: Held back for the next step.
        empty_samples: Zero-length sequences (samples, or sequences of pre-packed ones) read
            this step on all DP ranks: never scheduled (not in ``num_sequences``);
            ``Step.to_origin`` gives each an empty value in its place.
        flops: Model training FLOPs of the step, when a model is known.
        moved_sequences, moved_tokens: Sequences with a shard that the exchange moves off the
            rank that cuts it (the CP rank of the DP replica that read it,
            ``Schedule.origin``), and the tokens of those shards as packed (padding to the
            sequence's multiple included): the all-to-all's payload.
        moved_fraction: ``moved_tokens / real_tokens``.
        max_rank_moved_tokens: Tokens of the busiest plane rank in the exchange (the larger
            of what it sends and what it receives): what the all-to-all waits for.
        moved_bytes, max_rank_moved_bytes: The same in bytes at ``bytes_per_token`` (default
            :data:`SAMPLE_BYTES_PER_TOKEN`, a plain SFT sample).
        cost_model: The cost model the step was scheduled with (under ``calibrate``, the
            calibrator's model in use; otherwise the one the stats are measured in).
        calibrated: ``cost_model`` is fitted to measured microbatch times (seconds).
        predicted_step_time: What ``cost_model`` predicts this step takes
            (:func:`seqpack.schedulers.predicted_step_time` under the configured sync), in
            its units.
        measured_step, measured_step_time, prediction_error: The last step whose
            microbatch times every rank holds (under ``calibrate``): its measured step time
            and ``predicted / measured - 1`` of the model it was scheduled with (``None``
            until a fitted model scheduled a fully timed step).
    """

    num_sequences: int = 0
    num_microbatches: int = 0
    min_microbatches: int = 0
    dp_size: int = 1
    cp_size: int = 1
    real_tokens: int = 0
    padded_tokens: int = 0
    seqlen_sum: int = 0
    seqlen_sq_sum: int = 0
    replica_cost: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    imbalance: float = 1.0
    round_imbalance: float = 1.0
    lower_bound: float = 0.0
    bound_ratio: float = 1.0
    round_lower_bound: float = 1.0
    pad_fraction: float = 0.0
    bucket_tokens: int = 0
    bucket_fraction: float = 0.0
    dropped_sequences: int = 0
    dropped_tokens: int = 0
    truncated_sequences: int = 0
    truncated_tokens: int = 0
    deferred_sequences: int = 0
    empty_samples: int = 0
    flops: float | None = None
    moved_sequences: int = 0
    moved_tokens: int = 0
    moved_fraction: float = 0.0
    max_rank_moved_tokens: int = 0
    moved_bytes: float = 0.0
    max_rank_moved_bytes: float = 0.0
    cost_model: CostModel | None = None
    calibrated: bool = False
    predicted_step_time: float | None = None
    measured_step: int | None = None
    measured_step_time: float | None = None
    prediction_error: float | None = None

    @classmethod
    def from_schedule(
        cls,
        schedule: Schedule,
        cost: CostModel | None = None,
        *,
        flops: float | None = None,
        empty_samples: int = 0,
        bytes_per_token: float = SAMPLE_BYTES_PER_TOKEN,
        sync: str = "lockstep",
        static_shapes: StaticShapes | None = None,
        predicted: float | None = None,
    ) -> StepStats:
        """Account a schedule, static or dynamic CP, in ``cost``'s units (padded tokens without one).

        Costs are balanced over the unit whose finish the step waits for: a static plan's DP
        replica (the cost at its CP group's size, :meth:`~seqpack.cost.CostModel.at`), a dynamic plan's
        plane rank (:func:`~seqpack.schedulers.step_time.rank_times`, CP ring included);
        ``replica_cost`` holds one total per unit, and ``imbalance``, ``round_imbalance`` and
        ``bound_ratio`` are over units (``round_lower_bound`` is 1 for a dynamic plan). A
        padding-only filler of ``pad_multiple`` tokens counts for every empty static
        microbatch and idle dynamic rank. Moved tokens: :func:`moved_tokens`, in bytes at
        ``bytes_per_token``. With ``static_shapes`` the buckets' linear cost is in
        ``replica_cost`` and ``predicted_step_time``; ``padded_tokens`` and ``pad_fraction``
        stay the packs' own. With a cost, the plan's ``sample_cost`` (e.g. the vision
        encoder's) adds to its sequences' microbatches, bounds and predictions included.
        ``predicted``: the step time the caller already predicted for this plan (with the
        model it was planned with), kept as ``predicted_step_time`` instead of a prediction
        from ``cost``.
        """
        plan, mode = _check_schedule("schedule", schedule), check_choice("sync", sync, Sync)
        flops = None if flops is None else check_number("flops", flops)
        empty_samples = check_int("empty_samples", empty_samples, minimum=0)
        bytes_per_token = check_number("bytes_per_token", bytes_per_token, minimum=0)
        lengths, assigned, orig = plan.lengths, plan.assigned, plan.original_lengths
        real = lengths[assigned]
        padded = plan.padded_assigned()
        padded_sum = exact_sum(padded)
        model, costs, fillers, (per_id, sent, received), (lower, round_bound) = _units(plan, cost, padded)
        bucket, costs = _with_buckets(plan, static_shapes, model, costs)
        units = plan.dp_size if plan.is_static else plan.num_ranks
        per_unit = costs.sum(axis=0) if costs.size else np.zeros(units)
        mean = float(per_unit.sum()) / units if units else 0.0
        round_mean = float(costs.mean(axis=1).sum()) if costs.size else 0.0
        round_max = float(costs.max(axis=1).sum()) if costs.size else 0.0
        padded_tokens = padded_sum + fillers * plan.pad_multiple
        # Truncated ids trained this step: a deferred one is counted when it is trained.
        truncated = plan.truncated[np.isin(plan.truncated, assigned)]
        real_sum = exact_sum(real)
        if predicted is None and cost is not None:
            predicted = predicted_step_time(plan, cost, sync=mode, static_shapes=static_shapes)
        return cls(
            num_sequences=int(assigned.shape[0]),
            num_microbatches=plan.num_microbatches,
            min_microbatches=-(-padded_sum // (plan.num_ranks * plan.max_tokens_per_rank)) if padded.size else 0,
            dp_size=plan.dp_size,
            cp_size=plan.cp_size,
            real_tokens=real_sum,
            padded_tokens=padded_tokens,
            seqlen_sum=real_sum,
            seqlen_sq_sum=exact_sum(real, squares=True),
            replica_cost=per_unit,
            imbalance=float(per_unit.max() / mean) if mean > 0 else 1.0,
            round_imbalance=round_max / round_mean if round_mean > 0 else 1.0,
            lower_bound=lower,
            bound_ratio=float(per_unit.max() / lower) if lower > 0 else 1.0,
            round_lower_bound=round_bound,
            pad_fraction=1.0 - real_sum / padded_tokens if padded_tokens else 0.0,
            bucket_tokens=bucket,
            bucket_fraction=bucket / (padded_tokens + bucket) if bucket else 0.0,
            dropped_sequences=int(plan.dropped.shape[0]),
            dropped_tokens=exact_sum(orig[plan.dropped]),
            truncated_sequences=int(truncated.shape[0]),
            truncated_tokens=exact_sum(orig[truncated] - lengths[truncated]),
            deferred_sequences=int(plan.deferred.shape[0]),
            empty_samples=int(empty_samples),
            flops=flops,
            **_moved(per_id, sent, received, real_sum, bytes_per_token),
            cost_model=model,
            predicted_step_time=predicted,
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain Python values (arrays as lists): comparable and JSON-ready."""
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in dataclasses.asdict(self).items()}

    def __eq__(self, other: object) -> bool:
        """Field by field, arrays by value (a generated ``__eq__`` would ask an array for its truth)."""
        if not isinstance(other, StepStats):
            return NotImplemented
        pairs = ((getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))
        return all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in pairs)


def _check_schedule(name: str, value: object) -> Schedule:
    if not isinstance(value, Schedule):
        raise SeqpackTypeError(
            f"{name} must be a seqpack.Schedule (what a scheduler's schedule() returns), got {type(value).__name__}"
        )
    return value


def _moved(
    per_id: np.ndarray, sent: np.ndarray, received: np.ndarray, real_sum: int, bytes_per_token: float
) -> dict[str, Any]:
    """:class:`StepStats`' moved-token fields from the tokens each id moves and each rank
    sends and receives."""
    moved = exact_sum(per_id)
    busiest = int(max(sent.max(initial=0), received.max(initial=0)))
    return dict(
        moved_sequences=int(np.count_nonzero(per_id)),
        moved_tokens=moved,
        moved_fraction=moved / real_sum if real_sum else 0.0,
        max_rank_moved_tokens=busiest,
        moved_bytes=float(moved * bytes_per_token),
        max_rank_moved_bytes=float(busiest * bytes_per_token),
    )


def _with_buckets(
    plan: Schedule, static_shapes: StaticShapes | None, model: CostModel | None, costs: np.ndarray
) -> tuple[int, np.ndarray]:
    """The tokens ``static_shapes``' buckets add to ``plan``'s microbatches, and ``costs``
    with them at the model's linear rate (tokens without one)."""
    if static_shapes is None:
        return 0, costs
    extra = bucket_padding(plan, static_shapes)  # refuses a dynamic plan
    if costs.size:
        rate = 1.0 if model is None else model.linear
        costs = costs.copy()
        np.add.at(costs, (plan.group_round, plan.leading_replica()), rate * extra.astype(np.float64))
    return exact_sum(extra), costs


def _units(
    plan: Schedule, cost: CostModel | None, padded: np.ndarray
) -> tuple[CostModel | None, np.ndarray, int, tuple[np.ndarray, np.ndarray, np.ndarray], tuple[float, float]]:
    """:meth:`StepStats.from_schedule`'s units: the compute model, the cost ``[rounds, units]``
    of every unit (a static plan's DP replica, a dynamic plan's plane rank), the filler count,
    the moved tokens ``(per id, sent, received)`` and ``(lower bound, round lower bound)``."""
    model = check_cost_model("cost", cost)
    if plan.is_static:  # unit: the DP replica
        model = None if model is None else model.at(plan.cp_size)
        costs = microbatch_costs(plan, model)
        fillers = int(np.count_nonzero(plan.group_counts == 0))  # one filler per empty microbatch
    else:  # unit: the plane rank
        if model is None:
            raise SeqpackTypeError(
                "cost must be a seqpack.CostModel for a dynamic-CP schedule (its groups' costs include the CP "
                "ring), got None"
            )
        costs = rank_times(plan, model)
        fillers = int(plan.group_size[plan.group_counts == 0].sum())  # one filler per idle rank
    moved = moved_tokens(plan)
    units = plan.dp_size if plan.is_static else plan.num_ranks
    total = float(costs.sum(axis=0).sum()) if costs.size else 0.0  # summed as from_schedule sums units
    lower, round_bound = (total / units if units else 0.0), 1.0
    if plan.is_static:
        per_seq = sequence_costs(plan, model)  # with the plan's sample_cost under a model
        constant = 0.0 if model is None else model.constant
        lower = max(lower, float(per_seq.max()) + constant if per_seq.size else 0.0)
        round_bound = round_lower_bound(padded, per_seq, plan.dp_size, plan.capacity, total)
    return model, costs, fillers, moved, (lower, round_bound)


def moved_tokens(plan: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step's exchange (:mod:`seqpack.schedulers.dynamic_cp.pieces`; a static plan's
    shards stay in their CP lane): per id the tokens of its shards that cross the wire (0
    when none do), and per plane rank the tokens it sends and receives (int64 ``[R]`` each).

    Raises:
        SeqpackTypeError: ``plan`` is not a :class:`~seqpack.schedulers.schedule.Schedule`.
    """
    p = plan_pieces(_check_schedule("plan", plan))
    tokens = np.where(p.moving, p.tokens, 0)
    per_id = np.bincount(p.gid, weights=tokens, minlength=plan.num_sequences).astype(np.int64)
    sent = np.bincount(p.src, weights=tokens, minlength=plan.num_ranks).astype(np.int64)
    received = np.bincount(p.dst, weights=tokens, minlength=plan.num_ranks).astype(np.int64)
    return per_id, sent, received
