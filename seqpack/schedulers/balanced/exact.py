"""Tight packings (docs/cost_models.md, "Tight packings"): :func:`bin_lower_bound` and
:func:`pack_bins`, the bounded exact search ``balanced`` runs when every greedy bin rule fails.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.rounds import fill_order

__all__ = ["FOUND", "GAVE_UP", "INFEASIBLE", "MODE_EXACT", "bin_lower_bound", "pack_bins"]

MODE_EXACT = 3  # bin rule of a plan whose bins came from pack_bins (after MODE_FIRST_FIT = 2)
FOUND, INFEASIBLE, GAVE_UP = 0, 1, 2
DEFAULT_WORK = 4_000_000  # bin visits (and bin-completion steps) before pack_bins gives up
FIRST_WORK = 100_000  # bin visits of the item search before bin completion takes over
FEW_PER_BIN = 8  # at most this many items per bin on average: bin completion runs


def bin_lower_bound(sizes: np.ndarray, capacity: int) -> int:
    """Martello and Toth's ``L2``: a lower bound on the bins of ``capacity`` any packing of
    ``sizes`` needs, at least ``ceil(sum / capacity)``."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size == 0:
        return 0
    c = int(capacity)
    token_bound = -(-int(sizes.sum()) // c)
    if 2 * int(sizes.max()) <= c:
        return token_bound  # no item needs a bin of its own: every threshold gives the token bound
    s = np.sort(sizes)
    prefix = np.concatenate([[0], np.cumsum(s)])
    n = s.shape[0]
    big = int(np.searchsorted(s, c // 2, side="right"))  # s[big:] > capacity/2 (2*s > c)
    k = np.unique(np.concatenate([[0], s[:big]]))  # every threshold that changes the sets
    over = np.searchsorted(s, c - k, side="right")  # s[over:] > c - k: a bin each, alone
    n1 = n - over
    n2 = over - big  # (c/2, c-k]: a bin each, room left for small items
    sum2 = prefix[over] - prefix[big]
    lo3 = np.searchsorted(s, k, side="left")
    sum3 = np.where(big > lo3, prefix[big] - prefix[np.minimum(lo3, big)], 0)  # [k, c/2]
    extra = np.maximum(0, -(-(sum3 - (n2 * c - sum2)) // c))
    return max(token_bound, int((n1 + n2 + extra).max()))


def pack_bins(
    lengths: np.ndarray, num_bins: int, capacity: int, *, max_work: int = DEFAULT_WORK, found_only: bool = False
) -> tuple[int, np.ndarray]:
    """Pack ``lengths`` into ``num_bins`` bins of ``capacity`` tokens exactly within ``max_work``
    (the item search, bin completion where bins hold few items: docs/cost_models.md). ``found_only``:
    a search that cannot find a packing within ``max_work`` is not run (``GAVE_UP`` may then
    stand for ``INFEASIBLE``).

    Returns:
        ``(status, bin_of)``: ``FOUND`` with every item's bin, ``INFEASIBLE`` when no packing
        exists, ``GAVE_UP`` when the work ran out (``bin_of`` is then meaningless).
    """
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    bin_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return FOUND, bin_of
    if num_bins <= 0 or int(lengths.max()) > capacity or bin_lower_bound(lengths, capacity) > num_bins:
        return INFEASIBLE, bin_of  # the bound is at least the token bound
    order = fill_order(lengths, None)  # longest first, ties by index
    sizes = lengths[order]
    few = n <= FEW_PER_BIN * num_bins and int(sizes[-1]) > 0  # bin completion takes positive sizes
    skip = _cannot_find(sizes, num_bins, capacity, max_work) if found_only else (False, False)
    status, placed = _item_search(sizes, num_bins, capacity, min(max_work, FIRST_WORK) if few else max_work, skip[0])
    if status == GAVE_UP and few:
        if not skip[1]:
            status, placed = _kernels.complete_bins(sizes, int(num_bins), int(capacity), int(max_work))
        if status == GAVE_UP and max_work > FIRST_WORK:  # whatever the item search alone packed, it still packs
            status, placed = _item_search(sizes, num_bins, capacity, max_work, skip[0])
    if status == FOUND:
        bin_of[order] = placed
    return int(status), bin_of


def _item_search(
    sizes: np.ndarray, num_bins: int, capacity: int, max_work: int, futile: bool
) -> tuple[int, np.ndarray]:
    """:func:`~seqpack.schedulers._kernels.dfs`, or ``(GAVE_UP, unplaced)`` without running it
    where it gives up for certain (or ``futile``)."""
    n = sizes.shape[0]
    if futile or (n >= 2 and 2 * num_bins > max_work):
        return GAVE_UP, np.full(n, -1, dtype=np.int64)
    status, placed = _kernels.dfs(sizes, int(num_bins), int(capacity), int(max_work))
    return int(status), placed


def _cannot_find(sizes: np.ndarray, num_bins: int, capacity: int, max_work: int) -> tuple[bool, bool]:
    """Whether the item search and bin completion cannot find a packing of ``sizes`` (longest
    first) within ``max_work``: the least work a packing costs each is above it."""
    n = sizes.shape[0]
    distinct = int(np.count_nonzero(sizes[1:] != sizes[:-1])) + 1
    least_bins = -(-int(sizes.sum()) // capacity)
    return 2 * num_bins * (n - 1) > max_work, 2 * distinct * least_bins > max_work
