"""Mini-batches under dynamic CP (``PackingConfig(dynamic_cp=True, minibatches=k)``).

As without dynamic CP (:mod:`seqpack.schedulers.minibatches`): every DP rank's samples, in
the order read, are cut into ``k`` contiguous chunks; chunk ``j`` of every rank is mini-batch
``j``. Each mini-batch is planned alone over all ``dp x cp`` ranks (its own CP groups, rounds
and fillers; no sample or group crosses), and the plans are joined one after the other:
rounds ``starts[j]:starts[j + 1]`` are mini-batch ``j``'s, run before its optimizer step
(:func:`seqpack.schedulers.minibatches.minibatch_loss_tokens` counts each one's tokens).
Every rank runs one microbatch per round, so the bounds are the same in every rank's
microbatches.

Not imported by the package's ``__init__`` (it imports ``seqpack.schedulers.minibatches``,
which imports ``seqpack.schedulers.base``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqpack.errors import ConfigError
from seqpack.schedulers.dynamic_cp.groups import plan_with_groups
from seqpack.schedulers.dynamic_cp.join import join_plans
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.groups import group_units
from seqpack.schedulers.minibatches import minibatch_of
from seqpack.schedulers.request import as_lengths, as_origin
from seqpack.validation import check_positive_int

__all__ = ["plan_minibatches"]


def plan_minibatches(
    scheduler: DynamicCpScheduler,
    lengths: Sequence[int] | np.ndarray,
    *,
    minibatches: int,
    dp_size: int,
    origin: Sequence[int] | np.ndarray | None = None,
    group_ids: np.ndarray | None = None,
    grouped: np.ndarray | None = None,
    **options: Any,
) -> tuple[DynamicCpSchedule, list[int]]:
    """One dynamic-CP plan of ``minibatches`` mini-batches, each planned alone by
    ``scheduler`` (module docstring); ``options``: the rest of
    :meth:`DynamicCpScheduler.schedule`'s arguments. With ``grouped`` sequences (their
    ``group_ids``), a group belongs to the mini-batch of its first sequence and stays on one
    replica (:func:`~seqpack.schedulers.dynamic_cp.groups.plan_with_groups`).

    Returns:
        ``(plan, starts)``: ``starts`` (``minibatches + 1`` round offsets) bounds each
        mini-batch's rounds.

    Raises:
        ConfigError: A mini-batch without samples (fewer samples on a rank than mini-batches).
    """
    original = as_lengths(lengths)
    origin_arr = as_origin(origin, original.shape[0], check_positive_int("dp_size", dp_size))
    flags = np.zeros(original.shape[0], bool) if grouped is None else np.asarray(grouped, bool)
    gids = np.zeros(original.shape[0], np.int64) if group_ids is None else np.asarray(group_ids, np.int64)
    which = minibatch_of(origin_arr, minibatches, group_units(gids, flags) if flags.any() else None)
    parts, ids = [], []
    for j in range(minibatches):
        mine = np.flatnonzero(which == j)
        if not mine.size:
            raise ConfigError(f"mini-batch {j} of {minibatches} holds no sample: read more samples per step")
        if flags[mine].any():
            part = plan_with_groups(
                scheduler, original[mine], gids[mine], flags[mine], dp_size=dp_size, origin=origin_arr[mine], **options
            )
        else:
            part = scheduler.schedule(original[mine], dp_size=dp_size, origin=origin_arr[mine], **options)
        parts.append(part)
        ids.append(mine)
    starts = np.cumsum([0, *(p.num_rounds for p in parts)]).tolist()
    return join_plans(parts, ids, original), [int(s) for s in starts]
