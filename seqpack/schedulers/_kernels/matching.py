"""greedy_matching: rows to columns along candidate pairs given best first."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import njit
from seqpack.schedulers._kernels._types import IntArray


@njit(cache=True)
def greedy_matching(rows: IntArray, cols: IntArray, n: int) -> IntArray:
    """Match rows to columns (both ``0..n-1``) along candidate pairs given best first.

    Walks the pairs ``(rows[k], cols[k])`` in order and takes each whose row and column are
    both still free. Rows left over then take the lowest free columns, in row order. The
    caller sorts the pairs (e.g. heaviest overlap first), so the work is
    ``O(len(rows) + n)``, never ``n * n``. Returns ``column_of_row``.

    Bounds: ``column_of_row`` and ``column_taken`` have ``n`` entries; ``rows`` and ``cols``
    must lie in ``[0, n)``. A row left over finds a free column below ``n``: every matched
    row took exactly one column, so fewer than ``n`` are taken while a row is unmatched.
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
