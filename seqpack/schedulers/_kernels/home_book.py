"""Bookkeeping of :func:`~.home.home_swaps`: bin loads, who is on which replica, the
cost-sorted cache of the current home and its pairs, the window of costs a swap partner
may have, and making a change. State tuples as in :mod:`.home`."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._types import (
    Book,
    Cache,
    FloatArray,
    Grid,
    IntArray,
    Pairs,
    Seqs,
)
from seqpack.schedulers._kernels.constants import PAIR_BIN, SMALL_SORT
from seqpack.schedulers._kernels.jit import njit
from seqpack.schedulers._kernels.no_refcount import no_refcount


@njit(cache=True, inline="always")
def _returned(t: int, o: int, here: int, home: int) -> int:
    """Tokens a sequence (``t`` tokens, home ``o``) sent from ``home`` to ``here`` brings
    home (``t`` if ``here`` is its home), or takes away (``-t`` if ``home`` was)."""
    if o == here:
        return t
    if o == home:
        return -t
    return 0


@njit(cache=True, inline="always")
def _fits(
    a: int,
    ra: int,
    b: int,
    m: int,
    cx: float,
    tx: int,
    cy: float,
    ty: int,
    here: int,
    home: int,
    load: FloatArray,
    tok: IntArray,
    total: FloatArray,
    round_cap: FloatArray,
    capacity: int,
    replica_cap: float,
) -> bool:
    """Whether bins ``a`` (round ``ra``, on ``here``) and ``b`` (round ``m``, on ``home``)
    keep every cap once ``x`` (cost ``cx``, ``tx`` tokens) and what returns from ``b``
    (``cy``, ``ty``) trade places."""
    return (
        load[a] - cx + cy <= round_cap[ra]
        and load[b] - cy + cx <= round_cap[m]
        and tok[a] - tx + ty <= capacity
        and tok[b] - ty + tx <= capacity
        and total[here] - cx + cy <= replica_cap
        and total[home] - cy + cx <= replica_cap
    )


@njit(cache=True, inline="always")
def window(cx: float, room: float, spare: float) -> tuple[float, float]:
    """Costs ``[lo, hi]`` a swap partner of ``x`` (cost ``cx``) may have: it must fit into
    ``x``'s bin (``spare`` cost left there) and ``x`` into its bin (at most ``room`` left in
    any bin of the home). Widened against rounding; each candidate is then checked exactly."""
    lo = cx - room
    hi = cx + spare
    lo -= 1e-9 * abs(lo) + 1e-9
    hi += 1e-9 * abs(hi) + 1e-9
    return lo, hi


@njit(cache=True, inline="always")
def replica_window(
    lo: float, hi: float, cx: float, home_total: float, here_total: float, replica_cap: float
) -> tuple[float, float]:
    """``[lo, hi]`` narrowed to the costs that keep both replicas within ``replica_cap``:
    the home takes ``x`` for what returns, ``x``'s replica the reverse. Widened by far more
    than the rounding of the exact check."""
    lo = max(lo, cx - (replica_cap - home_total) - 1e-9 * (abs(replica_cap) + abs(home_total) + abs(cx)) - 1e-9)
    hi = min(hi, cx + (replica_cap - here_total) + 1e-9 * (abs(replica_cap) + abs(here_total) + abs(cx)) + 1e-9)
    return lo, hi


@njit(cache=True)
def bin_loads(seqs: Seqs, dp: int, rounds: int) -> Grid:
    """``(load, tok, total)``: cost and tokens of every bin, cost of every replica."""
    round_of, replica_of, lengths, costs, _ = seqs
    load = np.zeros(rounds * dp, dtype=np.float64)
    tok = np.zeros(rounds * dp, dtype=np.int64)
    total = np.zeros(dp, dtype=np.float64)
    for i in range(lengths.shape[0]):
        b = round_of[i] * dp + replica_of[i]
        load[b] += costs[i]
        tok[b] += lengths[i]
        total[replica_of[i]] += costs[i]
    return load, tok, total


@njit(cache=True)
def new_book(n: int, dp: int, turns: int) -> Book:
    """Who is on which replica: a snapshot by replica taken at the start of each pass (a
    counting sort: ``start``, ``snap``), the sequences that changed replica since (skipped
    there), the arrivals of the pass, a list per replica (``last_arrival``, ``arrivals``,
    ``arrival_seq``, ``arrival_next``: an entry counts if it is its sequence's last), and
    ``moved_at``, the change that last moved each sequence.

    Bounds: ``start`` has ``dp + 1`` entries, ``snap``, ``changed``, ``last_arrival`` and
    ``moved_at`` one per sequence (``n``). The arrival list gets an entry for every sequence a
    change sends away from a home, two for a pair swap, and is reset at every pass; a pass
    gives each of its ``turns`` sequences (the length of ``order``) one turn, in which it
    makes at most one change, so a pass logs at most ``2 * turns`` arrivals. (One entry per
    sequence is not enough: a sequence can be sent away, come back and be sent away again in
    one pass.)
    """
    arrivals = 2 * turns + 1
    return (
        np.zeros(dp + 1, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.zeros(n, dtype=np.bool_),
        np.full(n, -1, dtype=np.int64),
        np.full(dp, -1, dtype=np.int64),
        np.empty(arrivals, dtype=np.int64),
        np.empty(arrivals, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
    )


@njit(cache=True)
def snapshot(replica_of: IntArray, dp: int, book: Book) -> None:
    """Start a pass: the snapshot by replica, no changes and no arrivals yet."""
    start, snap, changed, last_arrival, arrivals = book[0], book[1], book[2], book[3], book[4]
    start[:] = 0
    for i in range(replica_of.shape[0]):
        start[replica_of[i] + 1] += 1
    for d in range(dp):
        start[d + 1] += start[d]
    fill = start[:dp].copy()
    for i in range(replica_of.shape[0]):
        snap[fill[replica_of[i]]] = i
        fill[replica_of[i]] += 1
    changed[:] = False
    arrivals[:] = -1
    last_arrival[:] = -1


@njit(cache=True, inline="always")
def _cache_set(q: int, y: int, seqs: Seqs, cache: Cache) -> None:
    """Entry ``q`` of the cache: sequence ``y``, its home, tokens, cost and round."""
    round_of, _, lengths, costs, origin = seqs
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    cache_y[q], cache_o[q], cache_t[q], cache_c[q], cache_m[q] = y, origin[y], lengths[y], costs[y], round_of[y]


@njit(cache=True, inline="always")
def turn_cache(home: int, seqs: Seqs, book: Book, cache: Cache) -> int:
    """Fill the cache with the sequences on ``home`` sorted by cost; returns how many."""
    k = _cache_fill(home, seqs, book, cache)
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    if k <= SMALL_SORT:
        _sort_cache_small(k, cache)
        return k
    by_cost = np.argsort(cache_c[:k])
    cache_y[:k], cache_o[:k], cache_t[:k] = cache_y[by_cost], cache_o[by_cost], cache_t[by_cost]
    cache_c[:k], cache_m[:k] = cache_c[by_cost], cache_m[by_cost]
    return k


@njit(cache=True, inline="always")
def _sort_cache_small(k: int, cache: Cache) -> None:
    """The cache's first ``k`` entries sorted by cost in place, by insertion (no allocation:
    most homes hold a few sequences, and two sorted copies per home were the set-up's cost).
    Equal costs may come in any order: every reader breaks ties by sequence id."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    for t in range(1, k):
        y, o, tt, c, m = cache_y[t], cache_o[t], cache_t[t], cache_c[t], cache_m[t]
        u = t
        while u > 0 and cache_c[u - 1] > c:
            cache_y[u], cache_o[u], cache_t[u] = cache_y[u - 1], cache_o[u - 1], cache_t[u - 1]
            cache_c[u], cache_m[u] = cache_c[u - 1], cache_m[u - 1]
            u -= 1
        cache_y[u], cache_o[u], cache_t[u], cache_c[u], cache_m[u] = y, o, tt, c, m


@no_refcount
def _cache_fill(home: int, seqs: Seqs, book: Book, cache: Cache) -> int:
    """The sequences on ``home`` into the cache, unsorted; returns how many. (Once per home,
    with a few array bindings per sequence: without reference counts, see
    :mod:`.no_refcount`.)"""
    replica_of = seqs[1]
    start, snap, changed, last_arrival, arrivals, arrival_seq, arrival_next = book[:7]
    k = 0
    for q in range(start[home], start[home + 1]):
        y = snap[q]
        if not changed[y]:
            _cache_set(k, y, seqs, cache)
            k += 1
    e = arrivals[home]
    while e >= 0:
        y = arrival_seq[e]
        if last_arrival[y] == e and replica_of[y] == home:
            _cache_set(k, y, seqs, cache)
            k += 1
        e = arrival_next[e]
    return k


@njit(cache=True, inline="always")
def turn_pairs(k: int, rounds: int, cache: Cache, pairs: Pairs) -> int:
    """The pairs of a home's turn: every two sequences of the cache's first ``k`` entries
    that share a round holding at most ``PAIR_BIN`` of them, sorted by summed cost. Returns
    their number."""
    cache_y, _, _, cache_c, cache_m = cache
    pair_c, pair_y, pair_m, seg, by_round = pairs
    seg[:] = 0
    for q in range(k):
        seg[cache_m[q] + 1] += 1
    for m in range(rounds):
        seg[m + 1] += seg[m]
    for q in range(k):  # cache entries by round; seg[m] ends at round m's end
        by_round[seg[cache_m[q]]] = q
        seg[cache_m[q]] += 1
    n_pairs = 0
    begin = 0
    for m in range(rounds):
        if seg[m] - begin <= PAIR_BIN:
            for u in range(begin, seg[m]):
                p = by_round[u]
                for v in range(u + 1, seg[m]):
                    q = by_round[v]
                    pair_c[n_pairs] = cache_c[p] + cache_c[q]
                    pair_y[n_pairs, 0] = min(cache_y[p], cache_y[q])
                    pair_y[n_pairs, 1] = max(cache_y[p], cache_y[q])
                    pair_m[n_pairs] = m
                    n_pairs += 1
        begin = seg[m]
    if n_pairs <= SMALL_SORT:
        _sort_pairs_small(n_pairs, pairs)
        return n_pairs
    by_cost = np.argsort(pair_c[:n_pairs])
    pair_c[:n_pairs] = pair_c[:n_pairs][by_cost]
    pair_y[:n_pairs] = pair_y[:n_pairs][by_cost]
    pair_m[:n_pairs] = pair_m[:n_pairs][by_cost]
    return n_pairs


@njit(cache=True, inline="always")
def _sort_pairs_small(n_pairs: int, pairs: Pairs) -> None:
    """The first ``n_pairs`` pairs sorted by summed cost in place, by insertion (as
    :func:`_sort_cache_small`)."""
    pair_c, pair_y, pair_m = pairs[0], pairs[1], pairs[2]
    for t in range(1, n_pairs):
        c, y1, y2, m = pair_c[t], pair_y[t, 0], pair_y[t, 1], pair_m[t]
        u = t
        while u > 0 and pair_c[u - 1] > c:
            pair_c[u], pair_y[u, 0], pair_y[u, 1], pair_m[u] = (
                pair_c[u - 1],
                pair_y[u - 1, 0],
                pair_y[u - 1, 1],
                pair_m[u - 1],
            )
            u -= 1
        pair_c[u], pair_y[u, 0], pair_y[u, 1], pair_m[u] = c, y1, y2, m


@njit(cache=True, inline="always")
def _shift(src: int, dst: int, cx: float, tx: int, grid: Grid, dp: int, b_src: int, b_dst: int) -> None:
    """Cost ``cx`` and ``tx`` tokens of a sequence leave bin ``b_src`` (replica ``src``) for
    ``b_dst`` (replica ``dst``)."""
    load, tok, total = grid
    load[b_src] -= cx
    load[b_dst] += cx
    tok[b_src] -= tx
    tok[b_dst] += tx
    total[src] -= cx
    total[dst] += cx


@njit(cache=True, inline="always")
def apply_change(
    x: int,
    home: int,
    y1: int,
    y2: int,
    m: int,
    clock: int,
    k: int,
    n_arrivals: int,
    seqs: Seqs,
    grid: Grid,
    book: Book,
    cache: Cache,
    dp: int,
) -> tuple[int, int]:
    """``x`` moves into bin ``(m, home)``; ``y1`` and ``y2`` (if not -1) take its old place.
    Updates the loads, the book and the cache. Returns (cache size, arrivals)."""
    round_of, replica_of, lengths, costs, _ = seqs
    changed, last_arrival, arrivals, arrival_seq, arrival_next, moved_at = book[2:8]
    here = replica_of[x]
    ra = round_of[x]
    a = ra * dp + here
    b = m * dp + home
    moved_at[x] = clock
    _shift(here, home, costs[x], lengths[x], grid, dp, a, b)
    changed[x] = True
    round_of[x], replica_of[x] = m, home
    slot = -1  # x's cache entry: a returning sequence's, else a new one
    for y in (y1, y2):
        if y < 0:
            continue
        moved_at[y] = clock
        _shift(home, here, costs[y], lengths[y], grid, dp, b, a)
        changed[y] = True
        arrival_seq[n_arrivals], arrival_next[n_arrivals] = y, arrivals[here]
        arrivals[here] = n_arrivals
        last_arrival[y] = n_arrivals
        n_arrivals += 1
        round_of[y], replica_of[y] = ra, here
        slot, k = _cache_leave(y, costs[y], slot, k, cache)
    if slot < 0:
        slot = k
        k += 1
    _cache_enter(x, home, lengths[x], costs[x], m, slot, k, cache)
    return k, n_arrivals


@njit(cache=True, inline="always")
def _cache_leave(y: int, cy: float, slot: int, k: int, cache: Cache) -> tuple[int, int]:
    """``y`` left the home: the first to leave frees its entry for ``x`` (``slot``), the
    second's entry is dropped. Returns (slot, cache size)."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    c = int(np.searchsorted(cache_c[:k], cy))
    while cache_y[c] != y:
        c += 1
    if slot < 0:
        return c, k
    for q in range(c, k - 1):  # the pair's second: drop its entry
        cache_y[q], cache_o[q], cache_t[q] = cache_y[q + 1], cache_o[q + 1], cache_t[q + 1]
        cache_c[q], cache_m[q] = cache_c[q + 1], cache_m[q + 1]
    return slot - (slot > c), k - 1


@njit(cache=True, inline="always")
def _cache_enter(x: int, home: int, tx: int, cx: float, m: int, slot: int, k: int, cache: Cache) -> None:
    """``x`` takes entry ``slot``, then slides to its place by cost (it costs about what it
    replaced)."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    cache_y[slot], cache_o[slot], cache_t[slot], cache_c[slot], cache_m[slot] = x, home, tx, cx, m
    while slot > 0 and cache_c[slot - 1] > cx:
        _cache_swap(slot, slot - 1, cache)
        slot -= 1
    while slot + 1 < k and cache_c[slot + 1] < cx:
        _cache_swap(slot, slot + 1, cache)
        slot += 1


@njit(cache=True, inline="always")
def _cache_swap(p: int, q: int, cache: Cache) -> None:
    """Exchange entries ``p`` and ``q``."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    cache_y[p], cache_y[q] = cache_y[q], cache_y[p]
    cache_o[p], cache_o[q] = cache_o[q], cache_o[p]
    cache_t[p], cache_t[q] = cache_t[q], cache_t[p]
    cache_c[p], cache_c[q] = cache_c[q], cache_c[p]
    cache_m[p], cache_m[q] = cache_m[q], cache_m[p]
