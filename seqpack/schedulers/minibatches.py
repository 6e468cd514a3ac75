"""Mini-batches: one global batch that is ``k`` optimizer steps (PPO / GRPO epochs over a
rollout batch, verl's ``keep_minibatch``), each balanced on its own, no sample crossing
(docs/rl.md, "Mini-batches")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.request import Request
from seqpack.schedulers.sample_groups import group_units, join_plans, schedule_groups
from seqpack.schedulers.schedule import Schedule
from seqpack.validation import check_positive_int

__all__ = ["minibatch_loss_tokens", "minibatch_of", "schedule_minibatches"]


def minibatch_of(origin: np.ndarray, minibatches: int, unit: np.ndarray | None = None) -> np.ndarray:
    """Mini-batch of every global id: each DP rank's ids (ascending) cut by ``numpy.array_split``
    into ``minibatches`` chunks; with ``unit`` (units numbered from 0:
    :func:`~seqpack.schedulers.sample_groups.group_units`) a unit goes with its first id."""
    k = check_positive_int("minibatches", minibatches)
    out = np.zeros(origin.shape[0], dtype=np.int64)
    for rank in np.unique(origin).tolist():
        ids = np.flatnonzero(origin == rank)
        for j, chunk in enumerate(np.array_split(ids, k)):
            out[chunk] = j
    if unit is not None:
        first = np.unique(unit, return_index=True)[1]  # each unit's first id
        out = out[first[unit]]
    return out


def schedule_minibatches(
    scheduler: Scheduler,
    request: Request,
    *,
    minibatches: int,
    group_ids: np.ndarray | None = None,
    grouped: np.ndarray | None = None,
    together: bool = False,
    equal_counts: bool = False,
) -> tuple[Schedule, list[int]]:
    """``(schedule, starts)``: one schedule of ``request`` in ``minibatches`` mini-batches, each
    planned alone (the grouping as :func:`~seqpack.schedulers.sample_groups.schedule_groups`),
    run one after the other: rounds ``starts[j]:starts[j + 1]`` are mini-batch ``j``'s.

    Raises:
        ConfigError: A mini-batch without samples (fewer samples on a rank than mini-batches).
    """
    n = request.num_sequences
    has_groups = grouped is not None and np.asarray(grouped).any()
    gids = np.zeros(n, np.int64) if group_ids is None else np.asarray(group_ids, np.int64)
    flags = np.zeros(n, bool) if grouped is None else np.asarray(grouped, bool)
    which = minibatch_of(request.origin, minibatches, group_units(gids, flags) if has_groups else None)
    ids = [np.flatnonzero(which == j) for j in range(minibatches)]
    parts = []
    for j, mine in enumerate(ids):
        if not mine.size:
            raise ConfigError(f"mini-batch {j} of {minibatches} holds no sample: read more samples per step")
        part = request.subset(mine)
        if has_groups or equal_counts:
            grouping = dict(together=together, equal_counts=equal_counts)
            parts.append(schedule_groups(scheduler, part, gids[mine], flags[mine], **grouping))
        else:
            parts.append(scheduler.plan(part))
    return join_plans(parts, ids, request.lengths), np.cumsum([0, *(p.num_microbatches for p in parts)]).tolist()


def minibatch_loss_tokens(plan: Schedule, starts: Sequence[int], loss_tokens: np.ndarray) -> list[int]:
    """Supervised tokens of each mini-batch (the groups of rounds ``starts[j]:starts[j +
    1]``), from the gathered counts: what a PPO loop divides that mini-batch's summed token
    losses by."""
    round_of = plan.group_round[plan.group_of]  # the round of every packed id
    which = np.searchsorted(np.asarray(starts[1:], dtype=np.int64), round_of, side="right")
    counts = np.bincount(which, weights=loss_tokens[plan.assigned], minlength=len(starts) - 1)
    return [int(c) for c in counts[: len(starts) - 1]]
