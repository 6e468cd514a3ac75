"""numba kernels behind the schedulers. Private: the public functions in ``balanced.py`` and
``dp_balanced.py`` validate and coerce their inputs (contiguous int64 / float64 arrays) and
call these. Every kernel has a slow, obvious twin in ``tests/schedulers/`` it is checked
against.

Ties are broken by integer keys (token counts, then indices), never by chance, so every
rank computes the same result.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Bin-choice rules of grid_lpt.
MODE_COST = 0  # most under its cost target (LPT with per-bin targets)
MODE_TOKENS = 1  # fewest tokens (worst-fit decreasing on tokens)
MODE_FIRST_FIT = 2  # lowest index with room (first-fit decreasing)


@njit(cache=True)
def _before(key, tok, a, b):
    """Heap order of bins: smaller key, then fewer tokens, then lower index."""
    if key[a] != key[b]:
        return key[a] < key[b]
    if tok[a] != tok[b]:
        return tok[a] < tok[b]
    return a < b


@njit(cache=True)
def _sift_down(heap, size, i, key, tok):
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        right = left + 1
        if right < size and _before(key, tok, heap[right], heap[left]):
            child = right
        if _before(key, tok, heap[child], heap[i]):
            heap[i], heap[child] = heap[child], heap[i]
            i = child
        else:
            return


@njit(cache=True)
def _sift_up(heap, i, key, tok):
    while i > 0:
        parent = (i - 1) // 2
        if _before(key, tok, heap[i], heap[parent]):
            heap[i], heap[parent] = heap[parent], heap[i]
            i = parent
        else:
            return


@njit(cache=True)
def grid_lpt(order, lengths, costs, targets, capacity, mode):
    """Place items, in ``order``, each into the best bin that has room.

    ``mode`` picks "best": MODE_COST the bin with the smallest ``load - target`` (LPT when
    all targets are equal), MODE_TOKENS the bin with the fewest tokens, MODE_FIRST_FIT the
    lowest-indexed bin. Ties: fewer tokens, then lower index. A bin's tokens never exceed
    ``capacity``.

    Returns:
        (ok, bin_of[n], load[bins], tokens[bins]); ``ok`` is False when some item found no
        bin with room (the other outputs are then partial).
    """
    n_bins = targets.shape[0]
    n = order.shape[0]
    key = np.empty(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    load = np.zeros(n_bins, dtype=np.float64)
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    for b in range(n_bins):
        if mode == MODE_COST:
            key[b] = -targets[b]
        elif mode == MODE_TOKENS:
            key[b] = 0.0
        else:
            key[b] = float(b)
    heap = np.arange(n_bins, dtype=np.int64)
    size = n_bins
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(heap, size, i, key, tok)
    min_len = capacity
    for j in range(n):
        if lengths[order[j]] < min_len:
            min_len = lengths[order[j]]
    skipped = np.empty(n_bins, dtype=np.int64)
    for j in range(n):
        item = order[j]
        p = lengths[item]
        n_skipped = 0
        placed = -1
        while size > 0:
            b = heap[0]
            if tok[b] + p <= capacity:
                placed = b
                break
            # No room here: set the bin aside for this item; it stays out for good once
            # even the shortest item no longer fits.
            size -= 1
            heap[0] = heap[size]
            _sift_down(heap, size, 0, key, tok)
            if capacity - tok[b] >= min_len:
                skipped[n_skipped] = b
                n_skipped += 1
        if placed < 0:
            return False, bin_of, load, tok
        bin_of[item] = placed
        load[placed] += costs[item]
        tok[placed] += p
        if mode == MODE_COST:
            key[placed] = load[placed] - targets[placed]
        elif mode == MODE_TOKENS:
            key[placed] = float(tok[placed])
        if capacity - tok[placed] < min_len:
            size -= 1
            heap[0] = heap[size]
        _sift_down(heap, size, 0, key, tok)
        for s in range(n_skipped):
            heap[size] = skipped[s]
            _sift_up(heap, size, key, tok)
            size += 1
    return True, bin_of, load, tok


@njit(cache=True)
def next_fit(lengths, capacity):
    """Cut items, in order, into consecutive groups of at most ``capacity`` tokens.

    A group closes when the next item would overflow it. Returns (group_of[n], groups).
    """
    n = lengths.shape[0]
    group_of = np.empty(n, dtype=np.int64)
    group = 0
    used = 0
    for i in range(n):
        if used + lengths[i] > capacity and used > 0:
            group += 1
            used = 0
        used += lengths[i]
        group_of[i] = group
    return group_of, (group + 1 if n > 0 else 0)


@njit(cache=True)
def repair_replicas(round_of, replica_of, costs, lengths, load, tok, capacity, max_moves, rel_tol):
    """Move items off the most loaded replica without raising any round's maximum.

    One move takes an item of the most loaded replica ``d1`` from its bin in round ``m`` to
    the bin of replica ``d2`` in the same round, when that bin stays within capacity and
    within round ``m``'s current maximum, and the pair's larger total drops. So the
    replica maximum never rises and no round gets slower. Picks the move that lowers the
    pair's maximum most (ties: lower item id, then lighter replica). Updates ``replica_of``,
    ``load`` and ``tok`` (both ``[rounds, replicas]``) in place.

    Returns:
        Number of moves made.
    """
    n_rounds, dp = load.shape
    n = round_of.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    for m in range(n_rounds):
        for d in range(dp):
            total[d] += load[m, d]
    round_max = np.empty(n_rounds, dtype=np.float64)
    for m in range(n_rounds):
        best = load[m, 0]
        for d in range(1, dp):
            if load[m, d] > best:
                best = load[m, d]
        round_max[m] = best
    moves = 0
    while moves < max_moves:
        d1 = 0
        for d in range(1, dp):
            if total[d] > total[d1]:
                d1 = d
        ascending = np.argsort(total, kind="mergesort")
        best_gain = rel_tol * total[d1]
        best_item = -1
        best_to = -1
        for i in range(n):
            if replica_of[i] != d1:
                continue
            c = costs[i]
            if total[ascending[0]] + c >= total[d1]:
                continue
            m = round_of[i]
            for k in range(dp):
                d2 = ascending[k]
                if total[d2] + c >= total[d1]:
                    break
                if d2 == d1:
                    continue
                if load[m, d2] + c <= round_max[m] and tok[m, d2] + lengths[i] <= capacity:
                    # The lightest replica that can take the item gives this item's best move.
                    new_max = max(total[d1] - c, total[d2] + c)
                    gain = total[d1] - new_max
                    if gain > best_gain:
                        best_gain = gain
                        best_item = i
                        best_to = d2
                    break
        if best_item < 0:
            break
        i = best_item
        m = round_of[i]
        c = costs[i]
        load[m, d1] -= c
        load[m, best_to] += c
        tok[m, d1] -= lengths[i]
        tok[m, best_to] += lengths[i]
        total[d1] -= c
        total[best_to] += c
        replica_of[i] = best_to
        top = load[m, 0]
        for d in range(1, dp):
            if load[m, d] > top:
                top = load[m, d]
        round_max[m] = top
        moves += 1
    return moves
