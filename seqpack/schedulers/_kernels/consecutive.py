"""next_fit: cut items, in order, into consecutive groups of at most a capacity."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import IntArray, njit


@njit(cache=True)
def next_fit(lengths: IntArray, capacity: int) -> tuple[IntArray, int]:
    """``(group_of[n], groups)``: a group closes when the next item would overflow
    ``capacity``. Bounds: ``group_of`` is written at each item's index only."""
    n = lengths.shape[0]
    group_of = np.empty(n, dtype=np.int64)
    group = 0
    used = 0
    for i in range(n):
        if used + lengths[i] > capacity and i > 0:  # a group of empty items closes too
            group += 1
            used = 0
        used += lengths[i]
        group_of[i] = group
    return group_of, (group + 1 if n > 0 else 0)
