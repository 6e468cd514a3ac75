"""grid_lpt and grid_local: greedy placement of sequences into the bins of the grid (rounds x
replicas), and the heaps of bins they keep. Ties are broken by index, never by chance.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import BoolArray, FloatArray, IntArray, njit, no_refcount

# Bin-choice rules of grid_lpt.
MODE_COST = 0  # most under its cost target (LPT with per-bin targets)
MODE_TOKENS = 1  # fewest tokens (worst-fit decreasing on tokens)
MODE_FIRST_FIT = 2  # lowest index with room (first-fit decreasing)
GRID_LOCAL_SLICES = 8  # grid_local alternates home and LPT passes over 8 length classes


def grid_lpt(
    order: IntArray, lengths: IntArray, costs: FloatArray, targets: FloatArray, capacity: int, mode: int
) -> tuple[bool, IntArray, FloatArray, IntArray]:
    """Place items, in ``order`` (longest first), each into the best bin with room (``MODE_*``;
    ties: fewer tokens, then lower index).

    Returns:
        (ok, bin_of[n], load[bins], tokens[bins]); ``ok`` is False when some item found no
        bin with room (the other outputs are then partial).
    """
    n_bins = targets.shape[0]
    ok, bin_of_placed, load, tok = _grid_lpt_sorted(
        lengths[order], costs[order], targets, capacity, mode, np.zeros(n_bins), np.zeros(n_bins, dtype=np.int64)
    )
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    bin_of[order] = bin_of_placed
    return ok, bin_of, load, tok


@njit(cache=True)
def _grid_lpt_sorted(
    lengths: IntArray, costs: FloatArray, targets: FloatArray, capacity: int, mode: int, load: FloatArray, tok: IntArray
) -> tuple[bool, IntArray, FloatArray, IntArray]:
    """:func:`grid_lpt` on items already in fill order; ``bin_of`` in that order. Bins start
    with ``load`` and ``tok`` (updated in place).

    Bounds: every bin is in at most one of the heap and the park (a bin parked too full for
    the items left, a bin too full for any is retired), so each holds at most ``n_bins``.
    """
    n_bins = targets.shape[0]
    n = lengths.shape[0]
    key = np.empty(n_bins, dtype=np.float64)
    room = np.empty(n_bins, dtype=np.int64)
    bin_of = np.full(n, -1, dtype=np.int64)
    for b in range(n_bins):
        room[b] = capacity - tok[b]
        if mode == MODE_COST:
            key[b] = load[b] - targets[b]
        elif mode == MODE_TOKENS:
            key[b] = float(tok[b])
        else:
            key[b] = float(b)
    # 4-ary heaps of entries (key, tokens, bin); parked bins are (-room, 0, bin): most room first.
    hk = key.copy()
    ht = tok.copy()
    hb = np.arange(n_bins, dtype=np.int64)
    size = n_bins
    for i in range((size - 2) // 4, -1, -1):
        _entry_down(hk, ht, hb, size, i)
    pk = np.empty(n_bins, dtype=np.float64)
    pt = np.zeros(n_bins, dtype=np.int64)
    pb = np.empty(n_bins, dtype=np.int64)
    parked = 0
    min_len = capacity
    for j in range(n):  # a loop, not lengths.min(): the array reduction costs compile time
        min_len = min(min_len, lengths[j])
    for j in range(n):
        p = lengths[j]
        while parked > 0 and room[pb[0]] >= p:  # parked bins with room for this item come back
            b = pb[0]
            parked = _entry_pop(pk, pt, pb, parked)
            size = _entry_push(hk, ht, hb, size, key[b], tok[b], b)
        placed = -1
        while size > 0:
            b = hb[0]
            if room[b] >= p:
                placed = b
                break
            size = _entry_pop(hk, ht, hb, size)
            if room[b] >= min_len:  # else no item ever fits again: retired
                parked = _entry_push(pk, pt, pb, parked, -float(room[b]), 0, b)
        if placed < 0:
            return False, bin_of, load, tok
        bin_of[j] = placed
        load[placed] += costs[j]
        tok[placed] += p
        room[placed] -= p
        if mode == MODE_COST:
            key[placed] = load[placed] - targets[placed]
        elif mode == MODE_TOKENS:
            key[placed] = float(tok[placed])
        if room[placed] < min_len:
            size = _entry_pop(hk, ht, hb, size)
        else:
            hk[0], ht[0] = key[placed], tok[placed]
            _entry_down(hk, ht, hb, size, 0)
    return True, bin_of, load, tok


def grid_local(
    order: IntArray,
    lengths: IntArray,
    values: FloatArray,
    targets: FloatArray,
    home_fill: float,
    token_share: int,
    capacity: int,
    origin: IntArray,
    dp_size: int,
) -> tuple[bool, IntArray, BoolArray]:
    """:func:`grid_lpt` that first lets every rank keep what fits into its own share.

    Bin ``b`` is round ``b // dp_size`` of replica ``b % dp_size``. In each of
    :data:`GRID_LOCAL_SLICES` equal slices of ``order``, every item first goes to its own
    replica's best bin (smallest ``(load - target, tokens, round)``, ``load`` summing
    ``values``) if that keeps it within ``home_fill`` times its target and ``token_share``
    tokens; the rest go as :func:`grid_lpt` in ``MODE_COST`` places them. Requires
    ``len(targets) == rounds * dp_size`` (``rounds >= 1`` with items) and ``0 <= origin < dp_size``.

    Returns:
        (ok, bin_of[n], home[n]): ``home`` marks items placed by the home pass; ``ok`` is
        False when some waiting item found no bin with room.
    """
    n = order.shape[0]
    n_bins = targets.shape[0]
    origin_placed = origin[order]
    lengths_placed = lengths[order]
    values_placed = values[order]
    share = min(int(token_share), int(capacity))
    load = np.zeros(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    placed = np.full(n, -1, dtype=np.int64)
    home = np.zeros(n, dtype=np.bool_)
    ok = True
    bounds = [(n * s) // GRID_LOCAL_SLICES for s in range(GRID_LOCAL_SLICES + 1)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi == lo:
            continue
        # This slice's positions grouped by rank, in fill order within a rank (unique keys).
        count = hi - lo
        by_rank = lo + np.argsort(origin_placed[lo:hi] * count + np.arange(count, dtype=np.int64))
        _home_pass(
            by_rank, lengths_placed, values_placed, origin_placed, targets, float(home_fill), share, dp_size, placed,
            load, tok,
        )  # fmt: skip
        wait = lo + np.flatnonzero(placed[lo:hi] < 0)
        ok, waiting_bin, _, _ = _grid_lpt_sorted(
            lengths_placed[wait], values_placed[wait], targets, capacity, MODE_COST, load, tok
        )
        home[lo:hi] = placed[lo:hi] >= 0
        placed[wait] = waiting_bin
        if not ok:
            break
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    bin_of[order] = placed
    at_home = np.zeros(lengths.shape[0], dtype=np.bool_)
    at_home[order] = home
    return ok, bin_of, at_home


@njit(cache=True)
def _home_pass(
    by_rank: IntArray,
    lengths: IntArray,
    values: FloatArray,
    origin: IntArray,
    targets: FloatArray,
    fill: float,
    share: int,
    dp: int,
    placed: IntArray,
    load: FloatArray,
    tok: IntArray,
) -> None:
    """The home pass of :func:`grid_local` for the items ``by_rank`` (grouped by rank): sets
    ``placed`` (bin, or -1 to wait) and updates ``load`` and ``tok``.

    Bounds: one replica's heap has ``rounds = len(targets) // dp`` entries, read only when an
    item exists (``rounds >= 1``); bin ``m * dp + d`` is below ``rounds * dp`` for ``0 <= origin < dp``.
    """
    n, rounds = by_rank.shape[0], targets.shape[0] // dp
    # One replica at a time: its rounds in a heap of entries (key, tokens, round).
    hk = np.empty(rounds, dtype=np.float64)
    ht = np.empty(rounds, dtype=np.int64)
    hm = np.empty(rounds, dtype=np.int64)
    k = 0
    while k < n:
        d = origin[by_rank[k]]
        for m in range(rounds):
            b = m * dp + d
            hk[m], ht[m], hm[m] = load[b] - targets[b], tok[b], m
        for i in range((rounds - 2) // 4, -1, -1):
            _entry_down(hk, ht, hm, rounds, i)
        while k < n and origin[by_rank[k]] == d:
            j = by_rank[k]
            k += 1
            b = hm[0] * dp + d
            if ht[0] + lengths[j] <= share and load[b] + values[j] <= fill * targets[b]:
                placed[j] = b
                load[b] += values[j]
                ht[0] += lengths[j]
                hk[0] = load[b] - targets[b]
                _entry_down(hk, ht, hm, rounds, 0)
        for e in range(rounds):
            tok[hm[e] * dp + d] = ht[e]


# --- heaps of bins -----------------------------------------------------------------------


@no_refcount
def _entry_before(ka: float, ta: int, ba: int, kb: float, tb: int, bb: int) -> bool:
    """Order of heap entries (key, tokens, bin): smaller key, then fewer tokens, then bin."""
    if ka != kb:
        return ka < kb
    if ta != tb:
        return ta < tb
    return ba < bb


@no_refcount
def _entry_down(hk: FloatArray, ht: IntArray, hb: IntArray, size: int, i: int) -> None:
    """Sift entry ``i`` down the 4-ary heap ``(hk, ht, hb)[:size]``."""
    k, t, b = hk[i], ht[i], hb[i]
    while True:
        first = 4 * i + 1
        if first >= size:
            break
        best = first
        for c in range(first + 1, min(first + 4, size)):
            if _entry_before(hk[c], ht[c], hb[c], hk[best], ht[best], hb[best]):
                best = c
        if _entry_before(hk[best], ht[best], hb[best], k, t, b):
            hk[i], ht[i], hb[i] = hk[best], ht[best], hb[best]
            i = best
        else:
            break
    hk[i], ht[i], hb[i] = k, t, b


@no_refcount
def _entry_push(hk: FloatArray, ht: IntArray, hb: IntArray, size: int, k: float, t: int, b: int) -> int:
    """Push ``(k, t, b)`` on the 4-ary heap ``(hk, ht, hb)[:size]`` (``size < len(hk)``); returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) // 4
        if _entry_before(k, t, b, hk[parent], ht[parent], hb[parent]):
            hk[i], ht[i], hb[i] = hk[parent], ht[parent], hb[parent]
            i = parent
        else:
            break
    hk[i], ht[i], hb[i] = k, t, b
    return size + 1


@no_refcount
def _entry_pop(hk: FloatArray, ht: IntArray, hb: IntArray, size: int) -> int:
    """Drop the top entry of the 4-ary heap ``(hk, ht, hb)[:size]``; returns the new size."""
    size -= 1
    hk[0], ht[0], hb[0] = hk[size], ht[size], hb[size]
    _entry_down(hk, ht, hb, size, 0)
    return size
