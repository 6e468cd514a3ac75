"""The numba kernel of :func:`seqpack.schedulers.balanced.exact.pack_bins` (private; loaded on
first use so that ``import seqpack`` does not import numba)."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels.jit import njit


@njit(cache=True)
def _largest_at_most(sizes: np.ndarray, start: int, limit: int) -> int:
    """The largest of ``sizes[start:]`` (sorted longest first) that is at most ``limit``
    (``limit`` is at least the last, smallest, size)."""
    lo, hi = start, sizes.shape[0] - 1
    while lo < hi:  # first index whose size is <= limit
        mid = (lo + hi) // 2
        if sizes[mid] <= limit:
            hi = mid
        else:
            lo = mid + 1
    return sizes[lo]


@njit(cache=True)
def _best_pair_at_most(sizes: np.ndarray, start: int, limit: int) -> int:
    """The largest sum of one or two of ``sizes[start:]`` (sorted longest first) that is at
    most ``limit`` (``limit`` is at least the last, smallest, size)."""
    best = _largest_at_most(sizes, start, limit)
    lo, hi = start, sizes.shape[0] - 1
    while lo < hi:  # two pointers: sizes[lo] the larger, sizes[hi] the smaller of the pair
        pair = sizes[lo] + sizes[hi]
        if pair > limit:
            lo += 1
        else:
            if pair > best:
                best = pair
            hi -= 1
    return best


@njit(cache=True)
def dfs(sizes: np.ndarray, n_bins: int, capacity: int, max_work: int) -> tuple[int, np.ndarray]:
    """Depth-first search over placements of ``sizes`` (longest first) into bins.

    Item ``i`` tries the bins of each distinct free room ``>= sizes[i]`` in increasing room
    order (best fit first), one bin per room value (the lowest index): bins with equal room
    are interchangeable. ``tried[i]`` is the room last tried for item ``i``, so backtracking
    resumes with the next larger room. A placement is undone when the room no later item can
    use exceeds the slack: a bin's whole room when it is below the smallest item, and when
    it holds one (two) more items at most, below twice (three times) the smallest, the room
    the fullest one (one or two) later items that fit would leave.

    Bounds: ``room`` has one entry per bin, ``bin_of`` one per item and ``tried`` ``n + 1``
    (read at the current item ``i < n``). Requires ``n >= 1`` (the smallest size is
    ``sizes[n - 1]``; :func:`~seqpack.schedulers.balanced.exact.pack_bins` answers ``n == 0``
    itself). Backtracking to item ``i`` reads ``bin_of[i]``, set when ``i`` was placed.
    """
    n = sizes.shape[0]
    room = np.full(n_bins, capacity, dtype=np.int64)
    bin_of = np.full(n, -1, dtype=np.int64)
    tried = np.full(n + 1, -1, dtype=np.int64)
    total = 0
    for i in range(n):
        total += sizes[i]
    slack = n_bins * capacity - total
    smallest = sizes[n - 1]
    work = 0
    i = 0
    while True:
        if i == n:
            return 0, bin_of
        if work > max_work:
            return 2, bin_of
        size = sizes[i]
        best_room = capacity + 1
        best_bin = -1
        # Equal items are interchangeable: each goes to a bin no lower than the previous one's.
        first = bin_of[i - 1] if i > 0 and sizes[i - 1] == size else 0
        for b in range(first, n_bins):
            r = room[b]
            if r >= size and r > tried[i] and r < best_room:
                best_room = r
                best_bin = b
        work += n_bins
        if best_bin < 0:  # no more choices for item i: undo item i-1 and try its next bin
            tried[i] = -1
            i -= 1
            if i < 0:
                return 1, bin_of
            room[bin_of[i]] += sizes[i]
            bin_of[i] = -1
            continue
        tried[i] = best_room
        room[best_bin] -= size
        bin_of[i] = best_bin
        if i + 1 < n:
            waste = 0
            for b in range(n_bins):
                r = room[b]
                if r < smallest:
                    waste += r
                elif r < 2 * smallest:  # room for one more item at most: the largest that fits
                    waste += r - _largest_at_most(sizes, i + 1, r)
                elif r < 3 * smallest:  # two more at most: the fullest one or two that fit
                    waste += r - _best_pair_at_most(sizes, i + 1, r)
                    work += n - i
            work += n_bins
            if waste > slack:  # the rooms no later item fits add up to more than the slack
                room[best_bin] += size
                bin_of[i] = -1
                continue
        i += 1
