"""Groups under dynamic CP (samples carrying a ``group_id``, docs/rl.md).

**One DP replica** under dynamic CP means the replica's own block of the plane: the ``cp``
ranks ``d * cp .. d * cp + cp - 1`` of replica ``d`` (the CP group static CP would use).
Every sequence of a group runs on that one block, so whatever a loss needs from the whole
group (DPO pairs, group-normalised advantages) lies on one replica as without dynamic CP.

The step is planned in two parts run one after the other
(:func:`~seqpack.schedulers.dynamic_cp.join.join_plans`):

1. the grouped sequences, by :func:`~seqpack.schedulers.groups.schedule_groups` with
   ``"balanced"`` as static CP (every replica's microbatch one group of its ``cp`` ranks;
   a sequence may hold at most ``cp`` ranks' worth: a longer one is an error naming it);
2. the others, by the dynamic-CP scheduler (any group size, all ``dp x cp`` ranks).

Groups therefore gain nothing from dynamic CP; the sequences without a group do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ScheduleError
from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.schedulers.dynamic_cp.cost import GroupCost
from seqpack.schedulers.dynamic_cp.join import join_plans
from seqpack.schedulers.dynamic_cp.padding import allowed_group_sizes, cp_pad_multiple, group_padded_lengths
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.groups import schedule_groups
from seqpack.schedulers.request import as_lengths, as_origin
from seqpack.schedulers.schedule import Schedule

__all__ = ["plan_with_groups"]


def _as_replica_groups(static: Schedule, pad_multiple: int, group_sizes: str) -> DynamicCpSchedule:
    """A static-CP schedule as a dynamic plan: round ``m`` is one group of ``cp`` ranks per
    replica (``start = d * cp``) packing ``assignment[m][d]``."""
    cp, dp = static.cp_size, static.dp_size
    rounds = static.num_microbatches
    ids = [static.assignment[m][d] for m in range(rounds) for d in range(dp)]
    return DynamicCpSchedule(
        num_rounds=rounds,
        group_round=np.repeat(np.arange(rounds, dtype=np.int64), dp),
        group_start=np.tile(np.arange(dp, dtype=np.int64) * cp, rounds),
        group_size=np.full(rounds * dp, cp, dtype=np.int64),
        group_counts=np.array([a.shape[0] for a in ids], dtype=np.int64),
        assigned=np.concatenate([np.zeros(0, np.int64), *ids]).astype(np.int64),
        lengths=static.lengths,
        original_lengths=static.original_lengths,
        dp_size=dp,
        cp_size=cp,
        max_tokens_per_rank=static.max_tokens_per_rank,
        pad_multiple=pad_multiple,
        group_sizes=group_sizes,  # type: ignore[arg-type]
        deferred=static.deferred,
        dropped=static.dropped,
        truncated=static.truncated,
        origin=static.origin,
    )


def _check_grouped(lengths: np.ndarray, ids: np.ndarray, cp: int, dp: int, capacity: int, pad: int, mode: str) -> None:
    """Every grouped sequence fits its replica's ``cp`` ranks, and ``cp`` is a size the plan
    may use (else an error naming it)."""
    if cp not in allowed_group_sizes(dp * cp, mode).tolist():
        raise ConfigError(f"group_id under dynamic CP needs cp_size={cp} a power of 2 or cp_group_sizes='any'")
    padded = group_padded_lengths(lengths[ids], cp, pad)
    over = np.flatnonzero(padded > cp * capacity)
    if over.size:
        i = int(ids[over[0]])
        raise ScheduleError(
            f"sample {i} carries a group_id and has {int(lengths[i])} tokens, more than its replica's {cp} rank(s) "
            f"hold ({cp} x max_tokens_per_rank={capacity}, padded to a multiple of {cp_pad_multiple(cp, pad)}): "
            "under dynamic CP a group stays on one replica's own CP ranks"
        )


def plan_with_groups(
    scheduler: DynamicCpScheduler,
    lengths: np.ndarray,
    group_ids: np.ndarray,
    grouped: np.ndarray,
    *,
    dp_size: int,
    cp_size: int = 1,
    max_tokens_per_rank: int,
    pad_multiple: int = 1,
    cost: GroupCost | CostModel | None = None,
    origin: np.ndarray | None = None,
    **options: Any,
) -> DynamicCpSchedule:
    """One dynamic-CP plan keeping every group on one replica's own ranks (module docstring).

    Raises:
        ScheduleError: A grouped sequence longer than ``cp_size`` ranks hold.
        ConfigError: ``cp_size`` not a power of 2 under ``group_sizes="pow2"``.
    """
    original = as_lengths(lengths)
    origin_arr = as_origin(origin, original.shape[0], dp_size)
    grouped = np.asarray(grouped, dtype=bool)
    mine, free = np.flatnonzero(grouped), np.flatnonzero(~grouped)
    mode = str(scheduler.group_sizes or "pow2")
    _check_grouped(original, mine, cp_size, dp_size, max_tokens_per_rank, pad_multiple, mode)
    limits: dict[str, Any] = dict(dp_size=dp_size, cp_size=cp_size, max_tokens_per_rank=max_tokens_per_rank)
    chosen = cost if cost is not None else scheduler.group_cost
    compute = chosen.compute if isinstance(chosen, GroupCost) else chosen
    static = schedule_groups(
        BalancedScheduler(),
        original[mine],
        np.asarray(group_ids, dtype=np.int64)[mine],
        np.ones(mine.shape[0], dtype=bool),
        pad_multiple=cp_pad_multiple(cp_size, pad_multiple),
        cost=compute,
        origin=origin_arr[mine],
        sync=options.get("sync"),
        **limits,
    )
    parts, ids = [_as_replica_groups(static, pad_multiple, mode)], [mine]
    if free.size:
        parts.append(
            scheduler.schedule(
                original[free], pad_multiple=pad_multiple, cost=cost, origin=origin_arr[free], **limits, **options
            )
        )
        ids.append(free)
    return join_plans(parts, ids, original)
