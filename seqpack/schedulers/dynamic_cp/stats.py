"""Step accounting of a dynamic-CP plan: a :class:`~seqpack.stats.StepStats` whose per-replica
fields are per rank of the ``dp x cp`` plane (every rank is a replica of its own under
dynamic CP: the groups change every round)."""

from __future__ import annotations

import numpy as np

from seqpack.cost import GroupCost
from seqpack.options import Sync
from seqpack.schedulers.dynamic_cp.pieces import plan_pieces
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.step_time import group_times, predicted_step_time
from seqpack.stats import SAMPLE_BYTES_PER_TOKEN, StepStats, exact_sum
from seqpack.validation import check_choice

__all__ = ["moved_pieces", "plan_stats", "rank_times"]


def rank_times(plan: Schedule, cost: GroupCost) -> np.ndarray:
    """float64 ``[num_microbatches, R]``: what every rank's microbatch of every round costs (its
    group's time; an idle rank runs a padding-only filler costing ``constant``)."""
    times = np.where(plan.group_counts > 0, group_times(plan, cost), cost.compute.constant)
    return times[plan.rank_group()] if plan.num_groups else np.zeros((0, plan.num_ranks))


def moved_pieces(plan: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step's exchange (:mod:`.pieces`): per id the shard tokens that cross the wire (0
    when none do), and per plane rank the tokens it sends and receives (int64 ``[R]`` each)."""
    p = plan_pieces(plan)
    tokens = np.where(p.moving, p.tokens, 0)
    per_id = np.bincount(p.gid, weights=tokens, minlength=plan.num_sequences).astype(np.int64)
    sent = np.bincount(p.src, weights=tokens, minlength=plan.num_ranks).astype(np.int64)
    received = np.bincount(p.dst, weights=tokens, minlength=plan.num_ranks).astype(np.int64)
    return per_id, sent, received


def plan_stats(
    plan: Schedule,
    cost: GroupCost,
    *,
    sync: str = "lockstep",
    empty_samples: int = 0,
    bytes_per_token: float = SAMPLE_BYTES_PER_TOKEN,
) -> StepStats:
    """Account a dynamic-CP plan in ``cost``'s units.

    ``replica_cost`` holds every plane rank's total; ``imbalance`` and ``bound_ratio`` are
    over ranks; ``round_imbalance`` is ``sum_m max_r / sum_m mean_r``; ``lower_bound`` is the
    mean rank's total; ``padded_tokens`` count a filler of ``pad_multiple`` for every idle rank
    of a round; moved tokens are the shard tokens that cross the wire
    (:func:`moved_pieces`); ``predicted_step_time`` is
    :func:`~seqpack.schedulers.dynamic_cp.predicted_step_time` under ``sync``.
    """
    mode = check_choice("sync", sync, Sync)
    assigned = plan.assigned
    real = plan.lengths[assigned]
    padded_sum = exact_sum(plan.group_tokens())
    idle = int(plan.group_size[plan.group_counts == 0].sum())
    padded_tokens = padded_sum + idle * plan.pad_multiple
    times = rank_times(plan, cost)
    per_rank = times.sum(axis=0) if times.size else np.zeros(plan.num_ranks)
    mean = float(per_rank.mean()) if per_rank.size else 0.0
    round_mean = float(times.mean(axis=1).sum()) if times.size else 0.0
    round_max = float(times.max(axis=1).sum()) if times.size else 0.0
    orig = plan.original_lengths
    trained = np.zeros(orig.shape[0], dtype=bool)
    trained[assigned] = True
    truncated = plan.truncated[trained[plan.truncated]]
    real_sum = exact_sum(real)
    per_id, sent, received = moved_pieces(plan)
    moved = exact_sum(per_id)
    busiest = int(max(sent.max(initial=0), received.max(initial=0)))
    capacity = plan.num_ranks * plan.max_tokens_per_rank
    stats = StepStats(
        num_sequences=int(assigned.shape[0]),
        num_microbatches=plan.num_microbatches,
        min_microbatches=-(-padded_sum // capacity) if assigned.size else 0,
        dp_size=plan.dp_size,
        cp_size=plan.cp_size,
        real_tokens=real_sum,
        padded_tokens=padded_tokens,
        seqlen_sum=real_sum,
        seqlen_sq_sum=exact_sum(real, squares=True),
        replica_cost=[float(v) for v in per_rank],
        imbalance=float(per_rank.max() / mean) if mean > 0 else 1.0,
        round_imbalance=round_max / round_mean if round_mean > 0 else 1.0,
        lower_bound=mean,
        bound_ratio=float(per_rank.max() / mean) if mean > 0 else 1.0,
        pad_fraction=1.0 - real_sum / padded_tokens if padded_tokens else 0.0,
        dropped_sequences=int(plan.dropped.shape[0]),
        dropped_tokens=exact_sum(orig[plan.dropped]),
        truncated_sequences=int(truncated.shape[0]),
        truncated_tokens=exact_sum(orig[truncated] - plan.lengths[truncated]),
        deferred_sequences=int(plan.deferred.shape[0]),
        empty_samples=int(empty_samples),
        moved_sequences=int(np.count_nonzero(per_id)),
        moved_tokens=moved,
        moved_fraction=moved / real_sum if real_sum else 0.0,
        max_rank_moved_tokens=busiest,
        moved_bytes=float(moved * bytes_per_token),
        max_rank_moved_bytes=float(busiest * bytes_per_token),
        cost_model=cost.compute,
        predicted_step_time=predicted_step_time(plan, cost, sync=mode),
    )
    return stats
