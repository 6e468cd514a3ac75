"""greedy_matching: rows to columns along candidate pairs given best first."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import IntArray, njit


@njit(cache=True)
def greedy_matching(rows: IntArray, cols: IntArray, n: int) -> IntArray:
    """``column_of_row``: each pair ``(rows[k], cols[k])``, in the caller's order, whose row
    and column are both still free; then each row left over, in row order, takes the lowest
    free column. ``O(len(rows) + n)``.

    Bounds: ``rows`` and ``cols`` lie in ``[0, n)``; a row left over finds a free column
    below ``n``, as fewer than ``n`` are taken while a row is unmatched.
    """
    column_of_row = np.full(n, -1, dtype=np.int64)
    column_taken = np.zeros(n, dtype=np.bool_)
    matched = 0
    for k in range(rows.shape[0]):
        if matched == n:
            break
        r, c = rows[k], cols[k]
        if column_of_row[r] < 0 and not column_taken[c]:
            column_of_row[r] = c
            column_taken[c] = True
            matched += 1
    c = 0
    for r in range(n):
        if column_of_row[r] >= 0:
            continue
        while column_taken[c]:
            c += 1
        column_of_row[r] = c
        column_taken[c] = True
    return column_of_row
