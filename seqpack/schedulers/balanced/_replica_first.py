"""The numba kernel of :func:`seqpack.schedulers.balanced.replicas.replica_first` (private;
loaded on first use so that ``import seqpack`` does not import numba)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _sift_down(heap: np.ndarray, total: np.ndarray, size: int, i: int) -> None:
    """Restore the min-heap of replicas by total (ties: lower index) below position ``i``."""
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        right = left + 1
        if right < size:
            a, b = heap[right], heap[left]
            if total[a] < total[b] or (total[a] == total[b] and a < b):
                child = right
        c, p = heap[child], heap[i]
        if total[c] < total[p] or (total[c] == total[p] and c < p):
            heap[i], heap[child] = c, p
            i = child
        else:
            return


@njit(cache=True)
def _sift_up(heap: np.ndarray, total: np.ndarray, i: int) -> None:
    """Restore the min-heap of replicas by total above position ``i``."""
    while i > 0:
        parent = (i - 1) // 2
        c, p = heap[i], heap[parent]
        if total[c] < total[p] or (total[c] == total[p] and c < p):
            heap[i], heap[parent] = c, p
            i = parent
        else:
            return


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
    """
    n = order.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    room = np.full((dp, num_rounds), capacity, dtype=np.int64)
    widest = np.full(dp, capacity, dtype=np.int64)  # largest room of each replica's bins
    heap = np.arange(dp, dtype=np.int64)
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
            _sift_down(heap, total, size_heap, 0)
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
        _sift_down(heap, total, size_heap, 0)
        # Put the set-aside replicas back (their totals did not change).
        for j in range(n_aside):
            heap[size_heap] = aside[j]
            size_heap += 1
            _sift_up(heap, total, size_heap - 1)
    return True, round_of, replica_of
