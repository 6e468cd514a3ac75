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
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.minibatches import minibatch_of
from seqpack.schedulers.request import as_lengths, as_origin
from seqpack.validation import check_positive_int

__all__ = ["join_plans", "plan_minibatches"]


def join_plans(
    parts: Sequence[DynamicCpSchedule], ids: Sequence[np.ndarray], original: np.ndarray
) -> DynamicCpSchedule:
    """One plan running ``parts`` one after the other; ``ids[j]``: the global id of each of
    ``parts[j]``'s ids (``original``: every global id's length; ids in no part are dropped)."""
    first = parts[0]
    rounds = np.cumsum([0, *(p.num_rounds for p in parts)])
    effective = np.zeros_like(original)
    for p, where in zip(parts, ids, strict=True):
        effective[where] = p.lengths

    def joined(name: str) -> np.ndarray:
        return np.concatenate([where[getattr(p, name)] for p, where in zip(parts, ids, strict=True)]).astype(np.int64)

    origin = np.zeros(original.shape[0], dtype=np.int64)
    for p, where in zip(parts, ids, strict=True):
        assert p.origin is not None
        origin[where] = p.origin
    return DynamicCpSchedule(
        num_rounds=int(rounds[-1]),
        group_round=np.concatenate([p.group_round + r for p, r in zip(parts, rounds[:-1].tolist(), strict=True)]),
        group_start=np.concatenate([p.group_start for p in parts]),
        group_size=np.concatenate([p.group_size for p in parts]),
        group_counts=np.concatenate([p.group_counts for p in parts]),
        assigned=joined("assigned"),
        lengths=effective,
        original_lengths=original,
        dp_size=first.dp_size,
        cp_size=first.cp_size,
        max_tokens_per_rank=first.max_tokens_per_rank,
        pad_multiple=first.pad_multiple,
        group_sizes=first.group_sizes,
        deferred=np.sort(joined("deferred")),
        dropped=np.sort(joined("dropped")),
        truncated=np.sort(joined("truncated")),
        origin=origin,
    )


def plan_minibatches(
    scheduler: DynamicCpScheduler,
    lengths: Sequence[int] | np.ndarray,
    *,
    minibatches: int,
    dp_size: int,
    origin: Sequence[int] | np.ndarray | None = None,
    **options: Any,
) -> tuple[DynamicCpSchedule, list[int]]:
    """One dynamic-CP plan of ``minibatches`` mini-batches, each planned alone by
    ``scheduler`` (module docstring); ``options``: the rest of
    :meth:`DynamicCpScheduler.schedule`'s arguments.

    Returns:
        ``(plan, starts)``: ``starts`` (``minibatches + 1`` round offsets) bounds each
        mini-batch's rounds.

    Raises:
        ConfigError: A mini-batch without samples (fewer samples on a rank than mini-batches).
    """
    original = as_lengths(lengths)
    origin_arr = as_origin(origin, original.shape[0], check_positive_int("dp_size", dp_size))
    which = minibatch_of(origin_arr, minibatches)
    parts, ids = [], []
    for j in range(minibatches):
        mine = np.flatnonzero(which == j)
        if not mine.size:
            raise ConfigError(f"mini-batch {j} of {minibatches} holds no sample: read more samples per step")
        parts.append(scheduler.schedule(original[mine], dp_size=dp_size, origin=origin_arr[mine], **options))
        ids.append(mine)
    starts = np.cumsum([0, *(p.num_rounds for p in parts)]).tolist()
    return join_plans(parts, ids, original), [int(s) for s in starts]
