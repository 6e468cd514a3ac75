"""``"empty"``: no rebalancing. Every sample stays on the DP rank that read it and is packed
in dataloader order, next-fit, up to capacity. The baseline that shows what balancing buys."""

from __future__ import annotations

import numpy as np

from seqpack.cost import CostModel
from seqpack.schedulers import _kernels
from seqpack.schedulers.base import GridScheduler
from seqpack.thd import padded_lengths


def next_fit(lengths: np.ndarray, capacity: int) -> list[np.ndarray]:
    """Positions of ``lengths`` cut into consecutive groups of at most ``capacity`` tokens
    (a group closes when the next length would overflow it)."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    group_of, n_groups = _kernels.next_fit(lengths, capacity)
    return (
        np.split(np.arange(lengths.shape[0], dtype=np.int64), np.flatnonzero(np.diff(group_of)) + 1) if n_groups else []
    )


class EmptyScheduler(GridScheduler):
    """Packs each replica's own samples in order; replicas with fewer microbatches get empty
    ones (the wrapper fills them with padding so every rank runs the same step)."""

    name = "empty"
    keeps_origin = True

    def _plan(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        dp_size: int,
        capacity: int,
        pad_multiple: int,
        cost: CostModel | None,
        origin: np.ndarray,
    ) -> tuple[list[list[np.ndarray]], np.ndarray]:
        padded = padded_lengths(lengths, pad_multiple)
        # Samples grouped by the rank holding them, in dataloader order within each rank.
        by_rank = np.argsort(origin, kind="stable")
        starts = np.searchsorted(origin[by_rank], np.arange(dp_size + 1))
        per_replica = []
        for d in range(dp_size):
            mine = by_rank[starts[d] : starts[d + 1]]
            per_replica.append([ids[mine[g]] for g in next_fit(padded[mine], capacity)])
        rounds_needed = max((len(groups) for groups in per_replica), default=0)
        empty = np.zeros(0, dtype=np.int64)
        rounds = [[groups[m] if m < len(groups) else empty for groups in per_replica] for m in range(rounds_needed)]
        return rounds, empty
