"""home_swaps: bring sequences home by moves and swaps that keep every cap (the locality
pass of ``balanced``; docs/scale.md describes it).

Bin ``(m, d)`` is index ``m * dp + d``. While home ``h``'s turn runs, the *cache* holds the
sequences on ``h`` sorted by cost, and the *pairs* of the turn are sorted by summed cost. A
swap of ``x`` (cost ``cx``, ``tx`` tokens) into bin ``b`` for what returns from it (``cy``,
``ty``) keeps ``b``'s caps only if ``cx <= cy + round_cap[m] - load[b]`` and ``tx <= ty +
capacity - tok[b]``: the right-hand sides are an entry's *keys* (:func:`_keys`). Max trees
over the cache, the pairs and the home's bins keep each key's largest per subtree, so
:func:`_next_open` skips only entries the exact check (:func:`_fits`) would reject.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import BoolArray, FloatArray, IntArray, helper, njit, no_refcount

PAIR_BIN = 16  # home_swaps pairs sequences of bins holding at most this many
HOME_TREE_MIN = 256  # home_swaps walks trees over a home's sequences from this many (a turn's cache and own)
_NO_TOKENS = -(1 << 62)  # the token key of an empty leaf or a pair that moved
# (round_of, replica_of, lengths, costs, origin, moved_at): per sequence; moved_at[y], the change that last moved y
Seqs = tuple[IntArray, IntArray, IntArray, FloatArray, IntArray, IntArray]
# (load, tok, total, round_cap, capacity, replica_cap, dp): the bins' and replicas' loads and their caps
Book = tuple[FloatArray, IntArray, FloatArray, FloatArray, int, float, int]
# (cache_y, cache_o, cache_t, cache_c, cache_m): each entry's sequence, its home, tokens, cost and round
Cache = tuple[IntArray, IntArray, IntArray, FloatArray, IntArray]
Pairs = tuple[FloatArray, IntArray, IntArray, IntArray]  # (pair_c, pair_y1 < pair_y2, pair_m): summed cost, round
# (c1, c2, csize, p1, p2, psize, r1, r2, rsize): the cache's, the pairs' and the bins' trees and leaf counts
Trees = tuple[FloatArray, IntArray, int, FloatArray, IntArray, int, FloatArray, IntArray, int]
# (cpos, bhead, bnext, bprev, pseg, plist): each cache entry's position by sequence, the cache's sequences
# by round (linked lists) and the pairs by round (plist[pseg[m]:pseg[m + 1]])
Lists = tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray]
# (start, snap, changed, last_arrival, arrivals, arrival_seq, arrival_next): who is on which replica
Roster = tuple[IntArray, IntArray, BoolArray, IntArray, IntArray, IntArray, IntArray]
Buffers = tuple[IntArray, IntArray]


@njit(cache=True)
def home_swaps(
    round_of: IntArray,
    replica_of: IntArray,
    lengths: IntArray,
    costs: FloatArray,
    origin: IntArray,
    dp: int,
    rounds: int,
    capacity: int,
    round_cap: FloatArray,
    replica_cap: float,
    order: IntArray,
    passes: int,
) -> int:
    """Bring sequences home by moves and swaps that keep every cap; updates ``round_of`` and
    ``replica_of`` in place and returns the number of changes made.

    ``order`` runs through the sequences home by home: home ``h``'s *turn* is the run of its
    sequences. Each ``x`` of the turn placed off ``h`` tries every bin of ``h``: a move, a
    swap with one sequence of the bin, or (when neither fits) a swap with a pair ``y1 < y2``
    that shared a bin of ``h`` of at most ``PAIR_BIN`` sequences when the turn began and has
    not moved since. Both bins must keep at most ``capacity`` tokens and ``round_cap[m]``
    cost, both replicas at most ``replica_cap``. The change that brings home the most tokens
    (``x``'s, plus each returning sequence's that lands on its home, minus each one's that
    leaves it) is made if that is above zero; ties go to a move (lowest round first), then to
    the lowest ``y``, then to the lowest ``(y1, y2)``. At most ``passes`` passes, fewer once
    one changes nothing. A home of fewer than ``HOME_TREE_MIN`` sequences (cache and own), or
    fewer than ``HOME_TREE_MIN // 4`` rounds for the bins' tree, is scanned without trees.

    Bounds: the cache holds exactly the sequences on the current home (at most ``n``; ``n +
    1`` entries); a turn's pairs come from rounds of at most ``PAIR_BIN``, at most ``rounds *
    PAIR_BIN * (PAIR_BIN - 1) / 2``; the sort buffers hold either; the cache's tree has a leaf
    for every entry the turn can reach (one more per move, at most one change per sequence of
    its run: ``k + j - i``, capped at ``n``); the arrival list, reset every pass, gets an entry
    per sequence a change sends away from a home (two for a pair swap), and each sequence of
    ``order`` makes at most one change a pass: at most ``2 * len(order)``. Requires ``0 <=
    round_of < rounds``, ``0 <= replica_of, origin < dp``, ``order`` a permutation grouped by origin.
    """
    n = lengths.shape[0]
    load = np.zeros(rounds * dp, dtype=np.float64)
    tok = np.zeros(rounds * dp, dtype=np.int64)
    total = np.zeros(dp, dtype=np.float64)
    for i in range(n):
        b = round_of[i] * dp + replica_of[i]
        load[b] += costs[i]
        tok[b] += lengths[i]
        total[replica_of[i]] += costs[i]
    book = (load, tok, total, round_cap, capacity, replica_cap, dp)
    # Who is on which replica: a snapshot per pass, the sequences that changed replica since, the arrivals.
    start = np.zeros(dp + 1, dtype=np.int64)
    snap = np.empty(n, dtype=np.int64)
    changed = np.zeros(n, dtype=np.bool_)
    last_arrival = np.full(n, -1, dtype=np.int64)
    arrivals = np.full(dp, -1, dtype=np.int64)
    arrival_seq = np.empty(2 * order.shape[0] + 1, dtype=np.int64)
    arrival_next = np.empty(2 * order.shape[0] + 1, dtype=np.int64)
    roster = (start, snap, changed, last_arrival, arrivals, arrival_seq, arrival_next)
    moved_at = np.zeros(n, dtype=np.int64)
    seqs = (round_of, replica_of, lengths, costs, origin, moved_at)
    cache_y = np.empty(n + 1, dtype=np.int64)
    cache_o = np.empty(n + 1, dtype=np.int64)
    cache_t = np.empty(n + 1, dtype=np.int64)
    cache_c = np.empty(n + 1, dtype=np.float64)
    cache_m = np.empty(n + 1, dtype=np.int64)
    n_pairs_max = rounds * PAIR_BIN * (PAIR_BIN - 1) // 2
    pair_c = np.empty(n_pairs_max, dtype=np.float64)
    pair_y1 = np.empty(n_pairs_max, dtype=np.int64)
    pair_y2 = np.empty(n_pairs_max, dtype=np.int64)
    pair_m = np.empty(n_pairs_max, dtype=np.int64)
    cache = (cache_y, cache_o, cache_t, cache_c, cache_m)
    pairs = (pair_c, pair_y1, pair_y2, pair_m)
    seg = np.empty(rounds + 1, dtype=np.int64)
    by_round = np.empty(n + 1, dtype=np.int64)
    buffers = (np.empty(max(n + 1, n_pairs_max), dtype=np.int64), np.empty(max(n + 1, n_pairs_max), dtype=np.int64))
    c1 = np.empty(2, dtype=np.float64)  # grown per turn
    c2 = np.empty(2, dtype=np.int64)
    p1 = np.empty(2 * _pow2_above(n_pairs_max + 1), dtype=np.float64)
    p2 = np.empty(2 * _pow2_above(n_pairs_max + 1), dtype=np.int64)
    r1 = np.empty(2 * _pow2_above(rounds), dtype=np.float64)
    r2 = np.empty(2 * _pow2_above(rounds), dtype=np.int64)
    rsize = r1.shape[0] // 2 if rounds >= HOME_TREE_MIN // 4 else 0  # few rounds: read each
    cpos = np.empty(n, dtype=np.int64)
    bhead = np.empty(rounds, dtype=np.int64)
    bnext = np.empty(n, dtype=np.int64)
    bprev = np.empty(n, dtype=np.int64)
    pseg = np.empty(rounds + 1, dtype=np.int64)
    plist = np.empty(n_pairs_max, dtype=np.int64)
    lists = (cpos, bhead, bnext, bprev, pseg, plist)
    clock = 0  # changes so far
    changes = 0
    for _ in range(passes):
        _snapshot(replica_of, dp, roster)
        n_arrivals = 0
        made = 0
        i = 0
        while i < order.shape[0]:
            home = origin[order[i]]
            j = i
            while j < order.shape[0] and origin[order[j]] == home:
                j += 1
            # The turn of home: its sequences by cost, their pairs, and the trees.
            k = _fill_cache(home, seqs, roster, cache, buffers)
            n_pairs = _turn_pairs(k, rounds, cache, seg, by_round, pairs, buffers)
            csize, psize = 0, 0  # a small home: no cache and pair trees
            if k + j - i >= HOME_TREE_MIN:
                csize, psize = _pow2_above(min(k + j - i, n) + 1), _pow2_above(n_pairs + 1)
                if 2 * csize > c1.shape[0]:
                    c1 = np.empty(2 * csize, dtype=np.float64)
                    c2 = np.empty(2 * csize, dtype=np.int64)
            trees = (c1, c2, csize, p1, p2, psize, r1, r2, rsize)
            _turn_trees(k, n_pairs, home, seqs, book, cache, pairs, trees, lists)
            turn = clock
            for g in range(i, j):
                x = order[g]
                here = replica_of[x]
                if here == home:
                    continue
                ra = round_of[x]
                a = ra * dp + here
                cx, tx = costs[x], lengths[x]
                # A move: the first bin of home x fits into.
                best, best_y, best_y2, best_m = 0, -1, -1, -1
                if total[home] + cx <= replica_cap:
                    m = _next_open(r1, r2, rsize, 0, rounds, cx, tx)
                    while m < rounds:
                        b = m * dp + home
                        if load[b] + cx <= round_cap[m] and tok[b] + tx <= capacity:
                            best, best_m = tx, m
                            break
                        m = _next_open(r1, r2, rsize, m + 1, rounds, cx, tx)
                # A swap with one sequence of home whose cost lies in the window.
                lo, hi = _window(cx, r1[1], round_cap[ra] - load[a], total[home], total[here], replica_cap)
                end = _count(cache_c, k, hi, True)
                c = _next_open(c1, c2, csize, _count(cache_c, k, lo, False), end, cx, tx)
                while c < end:
                    ty, cy, m, y = cache_t[c], cache_c[c], cache_m[c], cache_y[c]
                    gain = tx + _returned(ty, cache_o[c], here, home)
                    c = _next_open(c1, c2, csize, c + 1, end, cx, tx)
                    if gain < best or (gain == best and (best_y < 0 or y > best_y)):
                        continue
                    if _fits(ra, here, m, home, cx, tx, cy, ty, book):
                        best, best_y, best_m = gain, y, m
                # Neither: a swap with a pair that has not moved since the turn began.
                if best_m < 0 and n_pairs > 0:
                    end = _count(pair_c, n_pairs, hi, True)
                    c = _next_open(p1, p2, psize, _count(pair_c, n_pairs, lo, False), end, cx, tx)
                    while c < end:
                        y1, y2, m, cy = pair_y1[c], pair_y2[c], pair_m[c], pair_c[c]
                        c = _next_open(p1, p2, psize, c + 1, end, cx, tx)
                        if moved_at[y1] > turn or moved_at[y2] > turn:
                            continue
                        gain = tx + _returned(lengths[y1], origin[y1], here, home)
                        gain += _returned(lengths[y2], origin[y2], here, home)
                        if gain < best or (gain == best and (y1 > best_y or (y1 == best_y and y2 > best_y2))):
                            continue
                        if _fits(ra, here, m, home, cx, tx, cy, lengths[y1] + lengths[y2], book):
                            best, best_y, best_y2, best_m = gain, y1, y2, m
                if best_m < 0:
                    continue
                # The change: x moves into bin (best_m, home); best_y (and best_y2) take its place.
                clock += 1
                b = best_m * dp + home
                moved_at[x] = clock
                _shift(here, home, cx, tx, a, b, book)
                changed[x] = True
                round_of[x], replica_of[x] = best_m, home
                slot = -1  # x's cache entry: a returning sequence's, else a new one
                for y in (best_y, best_y2):
                    if y < 0:
                        continue
                    moved_at[y] = clock
                    _shift(home, here, costs[y], lengths[y], b, a, book)
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
                slot = _cache_enter(x, home, tx, cx, best_m, slot, k, cache)
                v1, v2 = _keys(0.0, 0, best_m, home, book)
                _set_leaf(r1, r2, r1.shape[0] // 2, best_m, v1, v2)
                if csize > 0:
                    _cache_leaves(slot, best_y, best_y2, best_m, k, home, book, cache, trees, lists)
                    _pair_leaves(best_m, home, turn, seqs, book, pairs, trees, lists)
                made += 1
            i = j
        changes += made
        if made == 0:
            break
    return changes


# --- the checks of a change ---------------------------------------------------------------


@helper
def _returned(t: int, o: int, here: int, home: int) -> int:
    """Tokens a sequence (``t`` tokens, home ``o``) sent from ``home`` to ``here`` brings
    home (``t`` if ``here`` is its home), or takes away (``-t`` if ``home`` was)."""
    return t if o == here else -t if o == home else 0


@no_refcount
def _fits(ra: int, here: int, m: int, home: int, cx: float, tx: int, cy: float, ty: int, book: Book) -> bool:
    """Whether bins ``(ra, here)`` and ``(m, home)`` keep every cap once ``x`` (cost ``cx``,
    ``tx`` tokens) and what returns from the second (``cy``, ``ty``) trade places."""
    load, tok, total, round_cap, capacity, replica_cap, dp = book
    a, b = ra * dp + here, m * dp + home
    return (
        load[a] - cx + cy <= round_cap[ra]
        and load[b] - cy + cx <= round_cap[m]
        and tok[a] - tx + ty <= capacity
        and tok[b] - ty + tx <= capacity
        and total[here] - cx + cy <= replica_cap
        and total[home] - cy + cx <= replica_cap
    )


@helper
def _window(
    cx: float, room: float, spare: float, home_total: float, here_total: float, replica_cap: float
) -> tuple[float, float]:
    """Costs ``[lo, hi]`` a swap partner of ``x`` (cost ``cx``) may have for it to fit into
    ``x``'s bin (``spare`` left), ``x`` into its bin (at most ``room`` left in any bin of the
    home) and both replicas to keep ``replica_cap``; widened by far more than the rounding."""
    lo = cx - room
    hi = cx + spare
    lo -= 1e-9 * abs(lo) + 1e-9
    hi += 1e-9 * abs(hi) + 1e-9
    lo = max(lo, cx - (replica_cap - home_total) - 1e-9 * (abs(replica_cap) + abs(home_total) + abs(cx)) - 1e-9)
    hi = min(hi, cx + (replica_cap - here_total) + 1e-9 * (abs(replica_cap) + abs(here_total) + abs(cx)) + 1e-9)
    return lo, hi


@no_refcount
def _shift(src: int, dst: int, c: float, t: int, b_src: int, b_dst: int, book: Book) -> None:
    """Cost ``c`` and ``t`` tokens leave bin ``b_src`` (replica ``src``) for ``b_dst`` (``dst``)."""
    load, tok, total, _, _, _, _ = book
    load[b_src] -= c
    load[b_dst] += c
    tok[b_src] -= t
    tok[b_dst] += t
    total[src] -= c
    total[dst] += c


# --- who is where, the cache and the pairs of a home ----------------------------------------


@helper
def _snapshot(replica_of: IntArray, dp: int, roster: Roster) -> None:
    """Start a pass: the sequences by replica (``snap[start[d]:start[d + 1]]``), no changes
    and no arrivals yet. Bounds: ``start`` has ``dp + 1`` entries, ``snap`` one per sequence."""
    start, snap, changed, last_arrival, arrivals, _, _ = roster
    _group_by(replica_of, replica_of.shape[0], dp, start, snap)
    changed[:] = False
    arrivals[:] = -1
    last_arrival[:] = -1


@helper
def _fill_cache(home: int, seqs: Seqs, roster: Roster, cache: Cache, buffers: Buffers) -> int:
    """The cache: the sequences on ``home`` (those of the snapshot that did not move since,
    and those that arrived last there), sorted by cost. Returns how many."""
    round_of, replica_of, lengths, costs, origin, _ = seqs
    start, snap, changed, last_arrival, arrivals, arrival_seq, arrival_next = roster
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    k = 0
    for q in range(start[home], start[home + 1]):
        if not changed[snap[q]]:
            cache_y[k], cache_c[k] = snap[q], costs[snap[q]]
            k += 1
    e = arrivals[home]
    while e >= 0:
        y = arrival_seq[e]
        if last_arrival[y] == e and replica_of[y] == home:
            cache_y[k], cache_c[k] = y, costs[y]
            k += 1
        e = arrival_next[e]
    perm, tmp = _order_by(cache_c, k, buffers)
    _gather(cache_y, perm, tmp, k)
    for q in range(k):
        y = cache_y[q]
        cache_o[q], cache_t[q], cache_c[q], cache_m[q] = origin[y], lengths[y], costs[y], round_of[y]
    return k


@helper
def _turn_pairs(
    k: int, rounds: int, cache: Cache, seg: IntArray, by_round: IntArray, pairs: Pairs, buffers: Buffers
) -> int:
    """The pairs of a home's turn: every two sequences of the cache's first ``k`` entries
    that share a round holding at most ``PAIR_BIN`` of them, sorted by summed cost. Returns
    their number."""
    cache_y, _, _, cache_c, cache_m = cache
    pair_c, pair_y1, pair_y2, pair_m = pairs
    _group_by(cache_m, k, rounds, seg, by_round)
    n_pairs = 0
    for m in range(rounds):
        if seg[m + 1] - seg[m] <= PAIR_BIN:
            for u in range(seg[m], seg[m + 1]):
                for v in range(u + 1, seg[m + 1]):  # the cache entries of the pair, until sorted
                    pair_c[n_pairs] = cache_c[by_round[u]] + cache_c[by_round[v]]
                    pair_y1[n_pairs], pair_y2[n_pairs] = by_round[u], by_round[v]
                    n_pairs += 1
    perm, tmp = _order_by(pair_c, n_pairs, buffers)
    _gather(pair_y1, perm, tmp, n_pairs)
    _gather(pair_y2, perm, tmp, n_pairs)
    for c in range(n_pairs):
        p, q = pair_y1[c], pair_y2[c]
        pair_c[c], pair_m[c] = cache_c[p] + cache_c[q], cache_m[p]
        pair_y1[c], pair_y2[c] = min(cache_y[p], cache_y[q]), max(cache_y[p], cache_y[q])
    return n_pairs


@helper
def _group_by(key: IntArray, count: int, groups: int, seg: IntArray, out: IntArray) -> None:
    """Entries ``0..count-1`` by ``key`` (in ``[0, groups)``), stably: group ``m``'s in ``out[seg[m]:seg[m + 1]]``."""
    seg[:] = 0
    for q in range(count):
        seg[key[q] + 1] += 1
    for m in range(groups):
        seg[m + 1] += seg[m]
    for q in range(count):  # seg[m] runs through group m's places, ending at group m + 1's start
        out[seg[key[q]]] = q
        seg[key[q]] += 1
    for m in range(groups, 0, -1):  # back to the starts
        seg[m] = seg[m - 1]
    seg[0] = 0


@helper
def _order_by(key: FloatArray, k: int, buffers: Buffers) -> Buffers:
    """The positions ``0..k-1`` sorted by ``key`` (stable) in the first array returned, the other
    free: a merge sort in ``buffers`` (runs of 16 by insertion, then bottom-up merges)."""
    perm, tmp = buffers
    for t in range(k):
        perm[t] = t
    for lo in range(0, k, 16):
        for t in range(lo + 1, min(lo + 16, k)):
            v = perm[t]
            u = t
            while u > lo and key[perm[u - 1]] > key[v]:
                perm[u] = perm[u - 1]
                u -= 1
            perm[u] = v
    width = 16
    while width < k:
        for lo in range(0, k, 2 * width):
            mid, hi = min(lo + width, k), min(lo + 2 * width, k)
            a, b = lo, mid
            for t in range(lo, hi):
                if b >= hi or (a < mid and key[perm[a]] <= key[perm[b]]):
                    tmp[t] = perm[a]
                    a += 1
                else:
                    tmp[t] = perm[b]
                    b += 1
        perm, tmp = tmp, perm
        width *= 2
    return perm, tmp


@no_refcount
def _gather(a: IntArray, perm: IntArray, tmp: IntArray, k: int) -> None:
    """``a[q]`` takes ``a[perm[q]]`` for ``q < k``, through ``tmp``."""
    for q in range(k):
        tmp[q] = a[perm[q]]
    for q in range(k):
        a[q] = tmp[q]


@no_refcount
def _count(a: FloatArray, k: int, v: float, or_equal: bool) -> int:
    """How many of ``a[:k]`` (sorted) are below ``v`` (``or_equal``: at most ``v``): the
    first (last) position ``v`` could take."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < v or (or_equal and a[mid] == v):
            lo = mid + 1
        else:
            hi = mid
    return lo


@no_refcount
def _cache_leave(y: int, cy: float, slot: int, k: int, cache: Cache) -> tuple[int, int]:
    """``y`` left the home: the first to leave frees its entry for ``x`` (``slot``), the
    second's entry is dropped. Returns (slot, cache size)."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    c = _count(cache_c, k, cy, False)
    while cache_y[c] != y:
        c += 1
    if slot < 0:
        return c, k
    for q in range(c, k - 1):  # the pair's second: drop its entry
        _cache_move(q + 1, q, cache)
    return slot - (slot > c), k - 1


@no_refcount
def _cache_enter(x: int, home: int, tx: int, cx: float, m: int, slot: int, k: int, cache: Cache) -> int:
    """``x`` enters at entry ``slot``, slid to its place by cost among the first ``k`` (it
    costs about what it replaced). Returns that place."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    while slot > 0 and cache_c[slot - 1] > cx:
        _cache_move(slot - 1, slot, cache)
        slot -= 1
    while slot + 1 < k and cache_c[slot + 1] < cx:
        _cache_move(slot + 1, slot, cache)
        slot += 1
    cache_y[slot], cache_o[slot], cache_t[slot], cache_c[slot], cache_m[slot] = x, home, tx, cx, m
    return slot


@no_refcount
def _cache_move(src: int, dst: int, cache: Cache) -> None:
    """Entry ``dst`` takes entry ``src``'s fields."""
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    cache_y[dst], cache_o[dst], cache_t[dst] = cache_y[src], cache_o[src], cache_t[src]
    cache_c[dst], cache_m[dst] = cache_c[src], cache_m[src]


# --- max trees -------------------------------------------------------------------------------


@helper
def _pow2_above(v: int) -> int:
    """The least power of two >= ``v``."""
    s = 1
    while s < v:
        s *= 2
    return s


@no_refcount
def _keys(c: float, t: int, m: int, home: int, book: Book) -> tuple[float, int]:
    """The most cost and tokens ``x`` may have to enter bin ``(m, home)`` for what costs ``c``
    and holds ``t`` tokens there; the cost widened by far more than the exact check's rounding."""
    load, tok, _, round_cap, capacity, _, dp = book
    cap, held = round_cap[m], load[m * dp + home]
    return c + (cap - held) + 1e-9 * (abs(cap) + abs(held) + abs(c)) + 1e-9, t + capacity - tok[m * dp + home]


@no_refcount
def _set_leaf(t1: FloatArray, t2: IntArray, size: int, q: int, v1: float, v2: int) -> None:
    """Leaf ``q`` holds ``(v1, v2)``; its ancestors their subtrees' maxima."""
    i = q + size
    t1[i], t2[i] = v1, v2
    i >>= 1
    while i >= 1:
        n1 = max(t1[2 * i], t1[2 * i + 1])
        n2 = max(t2[2 * i], t2[2 * i + 1])
        if n1 == t1[i] and n2 == t2[i]:
            break
        t1[i], t2[i] = n1, n2
        i >>= 1


@helper
def _build(t1: FloatArray, t2: IntArray, size: int, count: int) -> None:
    """Leaves ``[0, count)`` are set: empty the rest and fill the inner nodes."""
    for i in range(size + count, 2 * size):
        t1[i], t2[i] = -np.inf, _NO_TOKENS
    for i in range(size - 1, 0, -1):
        t1[i] = max(t1[2 * i], t1[2 * i + 1])
        t2[i] = max(t2[2 * i], t2[2 * i + 1])


@no_refcount
def _next_open(t1: FloatArray, t2: IntArray, size: int, p: int, end: int, cx: float, tx: int) -> int:
    """The first leaf ``q`` in ``[p, end)`` with ``t1[q] >= cx`` and ``t2[q] >= tx``, else
    ``end``: down into a subtree where both maxima pass, else on to the next subtree. With
    ``size`` 0 (no tree: a small home) every leaf is open."""
    if p >= end:
        return end
    if size == 0:
        return p
    i, height = p + size, 0
    while True:
        if t1[i] >= cx and t2[i] >= tx:
            if height == 0:
                return i - size
            i, height = 2 * i, height - 1
            continue
        while i & 1:
            i, height = i >> 1, height + 1
        if i == 0:
            return end
        i += 1
        if (i << height) - size >= end:
            return end


@helper
def _turn_trees(
    k: int, n_pairs: int, home: int, seqs: Seqs, book: Book, cache: Cache, pairs: Pairs, trees: Trees, lists: Lists
) -> None:
    """At a turn's start: the bins' tree, and for a large home (``csize > 0``) the cache's
    and the pairs' trees, the entries' positions and lists by round, the pairs by round."""
    lengths = seqs[2]
    cache_y, _, cache_t, cache_c, cache_m = cache
    pair_c, pair_y1, pair_y2, pair_m = pairs
    c1, c2, csize, p1, p2, psize, r1, r2, _ = trees
    cpos, bhead, bnext, bprev, pseg, plist = lists
    rounds, half = bhead.shape[0], r1.shape[0] // 2
    for m in range(rounds):
        r1[half + m], r2[half + m] = _keys(0.0, 0, m, home, book)
    _build(r1, r2, half, rounds)
    if csize == 0:
        return
    bhead[:] = -1
    for q in range(k):
        c1[csize + q], c2[csize + q] = _keys(cache_c[q], cache_t[q], cache_m[q], home, book)
        cpos[cache_y[q]] = q
        _push(cache_y[q], cache_m[q], bhead, bnext, bprev)
    _build(c1, c2, csize, k)
    for c in range(n_pairs):
        ty = lengths[pair_y1[c]] + lengths[pair_y2[c]]
        p1[psize + c], p2[psize + c] = _keys(pair_c[c], ty, pair_m[c], home, book)
    _build(p1, p2, psize, n_pairs)
    _group_by(pair_m, n_pairs, rounds, pseg, plist)


@no_refcount
def _push(y: int, m: int, bhead: IntArray, bnext: IntArray, bprev: IntArray) -> None:
    """``y`` joins round ``m``'s list."""
    bnext[y], bprev[y] = bhead[m], -1
    if bhead[m] >= 0:
        bprev[bhead[m]] = y
    bhead[m] = y


@no_refcount
def _drop(y: int, m: int, bhead: IntArray, bnext: IntArray, bprev: IntArray) -> None:
    """``y`` leaves round ``m``'s list."""
    if bprev[y] >= 0:
        bnext[bprev[y]] = bnext[y]
    else:
        bhead[m] = bnext[y]
    if bnext[y] >= 0:
        bprev[bnext[y]] = bprev[y]


@no_refcount
def _cache_leaves(
    q_x: int, y1: int, y2: int, m: int, k: int, home: int, book: Book, cache: Cache, trees: Trees, lists: Lists
) -> None:
    """``x`` (now cache entry ``q_x`` of ``k``) entered bin ``(m, home)`` for ``y1`` (and
    ``y2``), or moved there (``y1 < 0``): the leaves of the entries that changed place and
    of that bin's entries."""
    cache_y = cache[0]
    c1, c2, csize = trees[0], trees[1], trees[2]
    cpos, bhead, bnext, bprev, _, _ = lists
    lo_q = hi_q = q_x
    if y1 < 0:
        hi_q = k - 1  # a new entry at the end slid down to x's place
    for y in (y1, y2):
        if y >= 0:
            lo_q, hi_q = min(lo_q, cpos[y]), max(hi_q, cpos[y])
            _drop(y, m, bhead, bnext, bprev)
    if y2 >= 0:
        hi_q = k  # the pair's second was dropped: the entries after it shifted, the last leaf empties
    for q in range(lo_q, hi_q + 1):
        if q < k:
            cpos[cache_y[q]] = q
            _entry_leaf(q, home, book, cache, trees)
        else:
            _set_leaf(c1, c2, csize, q, -np.inf, _NO_TOKENS)
    _push(cache_y[q_x], m, bhead, bnext, bprev)
    y = bhead[m]
    while y >= 0:
        _entry_leaf(cpos[y], home, book, cache, trees)
        y = bnext[y]


@no_refcount
def _pair_leaves(
    m: int, home: int, turn: int, seqs: Seqs, book: Book, pairs: Pairs, trees: Trees, lists: Lists
) -> None:
    """The leaves of bin ``(m, home)``'s pairs; a pair with a sequence moved since ``turn``'s start is off."""
    lengths, moved_at = seqs[2], seqs[5]
    pair_c, pair_y1, pair_y2, _ = pairs
    p1, p2, psize = trees[3], trees[4], trees[5]
    pseg, plist = lists[4], lists[5]
    for u in range(pseg[m], pseg[m + 1]):
        c = plist[u]
        z1, z2 = pair_y1[c], pair_y2[c]
        if moved_at[z1] > turn or moved_at[z2] > turn:
            _set_leaf(p1, p2, psize, c, -np.inf, _NO_TOKENS)
        else:
            v1, v2 = _keys(pair_c[c], lengths[z1] + lengths[z2], m, home, book)
            _set_leaf(p1, p2, psize, c, v1, v2)


@no_refcount
def _entry_leaf(q: int, home: int, book: Book, cache: Cache, trees: Trees) -> None:
    """Leaf ``q`` of the cache's tree from cache entry ``q`` and its bin."""
    _, _, cache_t, cache_c, cache_m = cache
    c1, c2, csize = trees[0], trees[1], trees[2]
    v1, v2 = _keys(cache_c[q], cache_t[q], cache_m[q], home, book)
    _set_leaf(c1, c2, csize, q, v1, v2)
