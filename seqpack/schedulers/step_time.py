"""What the microbatches of any :class:`~seqpack.schedulers.schedule.Schedule` cost and the step
time a cost model predicts for it: a group's time is its ``CostModel`` cost on its ranks."""

from __future__ import annotations

import numpy as np

from seqpack.cost import CostModel, spans_nodes
from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.options import Sync
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.shape_limits import group_buckets
from seqpack.thd.static_shapes import StaticShapes, as_static_shapes
from seqpack.validation import check_choice

__all__ = ["bucket_padding", "group_sums", "group_times", "predicted_step_time", "rank_times", "replica_sums"]


def group_times(plan: Schedule, cost: CostModel) -> np.ndarray:
    """float64 ``[G]``: each group's microbatch cost on its ranks (an idle group: as if it ran
    an empty pack, ``constant`` plus its ring's fixed steps), plus its sequences'
    ``plan.sample_cost`` as given (their cost on the group that runs them)."""
    padded = plan.padded_assigned()
    compute = np.bincount(plan.group_of, weights=cost.cost(padded), minlength=plan.num_groups)
    tokens = np.bincount(plan.group_of, weights=padded.astype(np.float64), minlength=plan.num_groups)
    spans = spans_nodes(plan.group_start, plan.group_size, cost.ranks_per_node)
    ring = cost.ring(plan.group_size, tokens, spans)
    times = cost.constant + compute * cost.compute_scale(plan.group_size, plan.cp_size) + ring
    if plan.sample_cost is None:
        return times
    return times + np.bincount(plan.group_of, weights=plan.sample_cost[plan.assigned], minlength=plan.num_groups)


def rank_times(plan: Schedule, cost: CostModel) -> np.ndarray:
    """float64 ``[num_microbatches, R]``: what every rank's microbatch of every round costs
    (its group's time; an idle rank runs a padding-only filler costing ``constant``)."""
    return _priced_times(plan, cost, None)[plan.rank_group()]


def bucket_padding(plan: Schedule, static_shapes: StaticShapes) -> np.ndarray:
    """int64 ``[G]``: the tokens each microbatch's bucket adds beyond its padded tokens (an
    empty one: beyond its ``pad_multiple`` filler), for a static ``plan`` made with ``static_shapes``.

    Raises:
        ScheduleError: A dynamic-CP plan, or a microbatch larger than the largest bucket.
        SeqpackTypeError: ``static_shapes`` of the wrong type.
    """
    shapes = as_static_shapes(static_shapes)
    assert shapes is not None
    if not plan.is_static:
        raise ScheduleError(
            "static_shapes holds for static-CP schedules only (a dynamic-CP group's tokens are split over its size)"
        )
    tokens = np.where(plan.group_counts > 0, plan.group_tokens(), plan.pad_multiple)
    return group_buckets(shapes, tokens, plan.capacity) - tokens


def _priced_times(plan: Schedule, family: CostModel, static_shapes: StaticShapes | None) -> np.ndarray:
    """float64 ``[G]``: every group's time, an idle one's ``constant``, plus with
    ``static_shapes`` the linear cost of its bucket padding (compute and CP ring)."""
    times = np.where(plan.group_counts > 0, group_times(plan, family), family.constant)
    if static_shapes is None:
        return times
    extra = bucket_padding(plan, static_shapes).astype(np.float64)
    spans = spans_nodes(plan.group_start, plan.group_size, family.ranks_per_node)
    per_token = family.linear * family.compute_scale(plan.group_size, plan.cp_size)
    return (
        times
        + extra * per_token
        + family.ring(plan.group_size, extra, spans)
        - family.ring(plan.group_size, np.zeros_like(extra), spans)
    )


def predicted_step_time(
    plan: Schedule, cost: CostModel, *, sync: str = "lockstep", static_shapes: StaticShapes | None = None
) -> float:
    """The step time ``cost`` predicts for ``plan`` (in ``cost``'s units), every sample's
    ``sample_cost`` added to its microbatch and an idle group costing ``constant``.

    Args:
        sync: ``"lockstep"``: ``sum_m max_g time[g]``. ``"replica"`` (no barrier between
            rounds): the last rank's finish time, a group starting once all its ranks have
            finished their previous round (static groups: the slowest replica's total).
        static_shapes: The packs' fixed shapes (static plans): every microbatch also pays
            the linear cost of the tokens its bucket adds (:func:`bucket_padding`).

    Raises:
        SeqpackTypeError: ``plan``, ``cost`` or ``static_shapes`` of the wrong type.
        ScheduleError: A plan built for other lengths; with ``static_shapes``, a dynamic-CP
            plan or a microbatch larger than the largest bucket.
        ConfigError: Unknown ``sync``.
    """
    if not isinstance(plan, Schedule):
        raise SeqpackTypeError(f"schedule must be a seqpack Schedule, got {type(plan).__name__}")
    ids, n = plan.assigned, plan.lengths.shape[0]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ScheduleError(
            f"schedule assigns sample ids up to {int(ids.max())} but holds {n} lengths: "
            "it was built for other lengths (check it with Schedule.validate)"
        )
    if not isinstance(cost, CostModel):
        raise SeqpackTypeError(f"cost must be a seqpack.CostModel, got {type(cost).__name__}")
    mode = check_choice("sync", sync, Sync)
    if plan.num_groups == 0:
        return 0.0
    times = _priced_times(plan, cost, static_shapes)
    if mode == Sync.LOCKSTEP:
        heights = np.full(plan.num_microbatches, -np.inf)
        np.maximum.at(heights, plan.group_round, times)
        return float(heights.sum())
    if plan.is_static:  # every rank of a replica finishes together: the slowest replica's total
        return float(np.bincount(plan.leading_replica(), weights=times, minlength=plan.dp_size).max())
    finish = np.zeros(plan.num_ranks, dtype=np.float64)
    for m in range(plan.num_microbatches):
        groups = plan.round_groups(m)
        ready = np.maximum.reduceat(finish, plan.group_start[groups.start : groups.stop])
        finish = np.repeat(ready + times[groups.start : groups.stop], plan.group_size[groups.start : groups.stop])
    return float(finish.max())


def group_sums(plan: Schedule, ranks_per_node: int) -> np.ndarray:
    """int64 ``[G, 4]``: every group's ``(size, S, SS, spans)`` over padded lengths (an idle
    group: a ``pad_multiple`` filler alone, size 1)."""
    padded, s = plan.padded_assigned(), plan.group_tokens()
    ss = np.zeros(plan.num_groups, dtype=np.int64)
    np.add.at(ss, plan.group_of, padded * padded)
    spans = spans_nodes(plan.group_start, plan.group_size, ranks_per_node).astype(np.int64)
    pad, busy = plan.pad_multiple, plan.group_counts > 0
    idle = (1, pad, pad * pad, 0)  # a pad_multiple filler alone
    return np.stack([np.where(busy, v, i) for v, i in zip((plan.group_size, s, ss, spans), idle, strict=True)], axis=1)


def replica_sums(plan: Schedule, cost: CostModel) -> np.ndarray:
    """int64 ``[num_microbatches, dp_size, 4]``: per round and DP replica, the :func:`group_sums`
    row of the group among its CP ranks' that ``cost`` predicts slowest (what the replica's
    measured time, its slowest CP rank's, times)."""
    rows = group_sums(plan, cost.ranks_per_node)
    times = cost.predict_group_sums(rows, plan.cp_size)
    per_rank = plan.rank_group().reshape(plan.num_microbatches, plan.dp_size, plan.cp_size)
    slowest = np.take_along_axis(per_rank, np.argmax(times[per_rank], axis=2)[..., None], axis=2)[..., 0]
    return rows[slowest]
