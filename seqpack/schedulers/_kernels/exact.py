"""pack_dfs: the bounded exact search behind ``seqpack.schedulers._exact.pack_bins``.

Here, not in ``_exact.py``, so that importing the schedulers does not import numba (this
package loads kernel modules on first use)."""

from __future__ import annotations

import numpy as np
from numba import njit

from seqpack.schedulers._kernels._types import IntArray


@njit(cache=True)
def pack_dfs(sizes: IntArray, n_bins: int, capacity: int, max_work: int) -> tuple[int, IntArray]:
    """Depth-first search over placements of ``sizes`` (longest first) into bins.

    Item ``i`` tries the bins of each distinct free room ``>= sizes[i]`` in increasing room
    order (best fit first), one bin per room value (the lowest index): bins with equal room
    are interchangeable. ``tried[i]`` is the room last tried for item ``i``, so backtracking
    resumes with the next larger room. A placement is undone when the room smaller than the
    smallest item (which no later item can use) exceeds the slack.
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
        for b in range(n_bins):
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
                if room[b] < smallest:
                    waste += room[b]
            work += n_bins
            if waste > slack:  # the rooms no later item fits add up to more than the slack
                room[best_bin] += size
                bin_of[i] = -1
                continue
        i += 1
