"""Plans run one after the other: :func:`join_plans` (mini-batches, and the two parts of a
dynamic-CP step with groups: :mod:`seqpack.schedulers.minibatches`,
:mod:`seqpack.schedulers.sample_groups`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.schedulers.schedule import Schedule

__all__ = ["join_plans"]


def join_plans(parts: Sequence[Schedule], ids: Sequence[np.ndarray], original: np.ndarray) -> Schedule:
    """One plan running ``parts`` one after the other; ``ids[j]``: the global id of each of
    ``parts[j]``'s ids (``original``: every global id's length; ids in no part are dropped).

    Raises:
        ScheduleError: Parts made for different limits or group rules.
    """
    first = parts[0]
    for p in parts[1:]:
        if p.limits.to_array()[1:].tolist() != first.limits.to_array()[1:].tolist():
            raise ScheduleError(f"cannot join plans of different limits: {first.limits} and {p.limits}")
    rounds = np.cumsum([0, *(p.num_microbatches for p in parts)])
    effective = np.zeros_like(original)
    origin = np.zeros(original.shape[0], dtype=np.int64)
    sample_cost = np.zeros(original.shape[0]) if any(p.sample_cost is not None for p in parts) else None
    for p, where in zip(parts, ids, strict=True):
        assert p.origin is not None
        effective[where] = p.lengths
        origin[where] = p.origin
        if sample_cost is not None and p.sample_cost is not None:
            sample_cost[where] = p.sample_cost

    def joined(name: str) -> np.ndarray:
        return np.concatenate([where[getattr(p, name)] for p, where in zip(parts, ids, strict=True)]).astype(np.int64)

    return dataclasses.replace(  # the limits are the first part's
        first,
        num_microbatches=int(rounds[-1]),
        group_round=np.concatenate([p.group_round + r for p, r in zip(parts, rounds[:-1].tolist(), strict=True)]),
        group_start=np.concatenate([p.group_start for p in parts]),
        group_size=np.concatenate([p.group_size for p in parts]),
        group_counts=np.concatenate([p.group_counts for p in parts]),
        assigned=joined("assigned"),
        lengths=effective,
        original_lengths=original,
        deferred=np.sort(joined("deferred")),
        dropped=np.sort(joined("dropped")),
        truncated=np.sort(joined("truncated")),
        origin=origin,
        sample_cost=sample_cost,
    )
