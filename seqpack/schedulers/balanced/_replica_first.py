"""The numba kernel of :func:`seqpack.schedulers.balanced.replicas.replica_first` (private;
loaded on first use so that ``import seqpack`` does not import numba)."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels.heaps import _total_down, _total_up
from seqpack.schedulers._kernels.jit import njit


@njit(cache=True)
def lpt(
    order: np.ndarray,
    sizes: np.ndarray,
    costs: np.ndarray,
    dp: int,
    num_rounds: int,
    capacity: int,
    max_work: int,
) -> tuple[bool, np.ndarray, np.ndarray]:
    """Longest processing time over replicas, each holding ``num_rounds`` bins of ``capacity``.

    Sequences in ``order`` (costliest first) go to the replica with the lowest total cost
    among those with a bin it fits (ties: lower index), into that replica's fullest such
    bin (best fit; ties: lower round). Returns ``(ok, round_of, replica_of)``; ``ok`` is
    False when a sequence fits no bin or after about ``max_work`` heap steps.

    Bounds: ``total``, ``widest``, the heap and ``aside`` have one entry per replica (a
    replica is set aside at most once per sequence, so ``n_aside <= dp``); ``room`` is
    ``dp x num_rounds``, and a replica chosen because its widest room fits the sequence has
    a round that does (``best >= 0``). ``order`` must index ``sizes`` and ``costs``.
    """
    n = order.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    room = np.full((dp, num_rounds), capacity, dtype=np.int64)
    widest = np.full(dp, capacity, dtype=np.int64)  # largest room of each replica's bins
    heap = np.arange(dp, dtype=np.int64)  # a min-heap of replicas by total (ties: lower index)
    pos = np.arange(dp, dtype=np.int64)  # kept up to date by the heap helpers, not read here
    aside = np.empty(dp, dtype=np.int64)
    round_of = np.full(sizes.shape[0], -1, dtype=np.int64)
    replica_of = np.full(sizes.shape[0], -1, dtype=np.int64)
    work = 0
    for k in range(n):
        i = order[k]
        size = sizes[i]
        n_aside = 0
        size_heap = dp
        d = -1
        while size_heap > 0:
            top = heap[0]
            work += 1
            if widest[top] >= size:
                d = top
                break
            # Does not fit this replica: set it aside (pop) and look at the next lightest.
            aside[n_aside] = top
            n_aside += 1
            size_heap -= 1
            heap[0] = heap[size_heap]
            heap[size_heap] = top
            _total_down(heap, pos, size_heap, 0, total, 1.0)
        if d < 0 or work > max_work:
            return False, round_of, replica_of
        best = -1
        for m in range(num_rounds):
            r = room[d, m]
            if r >= size and (best < 0 or r < room[d, best]):
                best = m
        room[d, best] -= size
        widest[d] = 0
        for m in range(num_rounds):
            if room[d, m] > widest[d]:
                widest[d] = room[d, m]
        work += num_rounds
        round_of[i] = best
        replica_of[i] = d
        total[d] += costs[i]
        _total_down(heap, pos, size_heap, 0, total, 1.0)
        # Put the set-aside replicas back (their totals did not change).
        for j in range(n_aside):
            heap[size_heap] = aside[j]
            size_heap += 1
            _total_up(heap, pos, size_heap - 1, total, 1.0)
    return True, round_of, replica_of
