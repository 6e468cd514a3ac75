"""``"empty"``: no rebalancing. Every sample stays on the DP rank that read it and is packed
in dataloader order, next-fit, up to capacity. The baseline that shows what balancing buys."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.base import GridScheduler
from seqpack.schedulers.request import Request
from seqpack.schedulers.schedule import Grid
from seqpack.thd import padded_lengths


class EmptyScheduler(GridScheduler):
    """Packs each replica's own samples in order; replicas with fewer microbatches get empty
    ones (the wrapper fills them with padding so every rank runs the same step)."""

    name = "empty"
    keeps_origin = True

    def _plan(self, request: Request) -> tuple[Grid, np.ndarray]:
        origin, dp_size, capacity = request.origin, request.dp_size, request.capacity
        # Samples grouped by the rank holding them, in dataloader order within each rank.
        by_rank = np.argsort(origin, kind="stable")
        rank = origin[by_rank]
        starts = np.flatnonzero(np.diff(rank, prepend=-1))  # each holding rank's first sample
        # One next-fit walk over all ranks (work in the samples, not dp): an item of `capacity`
        # tokens before each rank's samples fills a group of its own (padded lengths are >= 1),
        # so every rank's first sample opens a group; the items are taken out again.
        walk = np.insert(padded_lengths(request.lengths[by_rank], request.pad_multiple), starts[1:], capacity)
        group_of = np.delete(_kernels.next_fit(walk, capacity)[0], starts[1:] + np.arange(starts.shape[0] - 1))
        microbatch = group_of - np.repeat(group_of[starts], np.diff(starts, append=rank.shape[0]))
        cell = microbatch * dp_size + rank
        num_rounds = int(microbatch.max()) + 1 if microbatch.size else 0
        order = np.argsort(cell, kind="stable")
        counts = np.bincount(cell, minlength=num_rounds * dp_size)
        return Grid(by_rank[order], counts, dp_size), np.zeros(0, dtype=np.int64)
