"""``"empty"``: no rebalancing. Every sample stays on the DP rank that read it and is packed
in dataloader order, next-fit, up to capacity. The baseline that shows what balancing buys."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers.base import Scheduler
from seqpack.thd import padded_lengths


def next_fit(lengths: np.ndarray, capacity: int) -> list[np.ndarray]:
    """Positions of ``lengths`` cut into consecutive groups of at most ``capacity`` tokens."""
    groups: list[np.ndarray] = []
    start, used = 0, 0
    for i, length in enumerate(lengths.tolist()):
        if used + length > capacity and i > start:
            groups.append(np.arange(start, i, dtype=np.int64))
            start, used = i, 0
        used += length
    if start < lengths.shape[0]:
        groups.append(np.arange(start, lengths.shape[0], dtype=np.int64))
    return groups


class EmptyScheduler(Scheduler):
    """Packs each replica's own samples in order; replicas with fewer microbatches get empty
    ones (the wrapper fills them with padding so every rank runs the same step)."""

    name = "empty"

    def _plan(self, ids, lengths, *, dp_size, capacity, pad_multiple, cost, origin):
        padded = padded_lengths(lengths, pad_multiple)
        per_replica = []
        for d in range(dp_size):
            mine = np.flatnonzero(origin == d)
            per_replica.append([ids[mine[g]] for g in next_fit(padded[mine], capacity)])
        rounds_needed = max((len(groups) for groups in per_replica), default=0)
        empty = np.zeros(0, dtype=np.int64)
        rounds = [
            [groups[m] if m < len(groups) else empty for groups in per_replica] for m in range(rounds_needed)
        ]
        return rounds, empty
