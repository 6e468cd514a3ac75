"""home_swaps: bring sequences home by moves and swaps that keep every cap (the locality
pass of ``balanced``).

Every njit function the kernel calls, and every constant it reads, is defined in this
module: numba stamps a kernel's disk cache with its own file only, and freezes the globals
it reads when it compiles.

State travels in tuples of arrays (numba passes them by reference):

- ``seqs = (round_of, replica_of, lengths, costs, origin)``, per sequence;
- ``grid = (load, tok, total)``: cost and tokens of bin ``m * dp + d``, cost of replica ``d``;
- ``caps = (round_cap, replica_cap, capacity)``;
- ``book``: who is on which replica (:func:`new_book`);
- ``cache = (y, home, tokens, cost, round)``: the sequences on the current home, by cost;
- ``pairs = (cost, (y1, y2), round, seg, by_round)``: the pairs of the current turn, by cost;
- ``trees``: max trees over the cache, the pairs and the home's bins (below).

Max trees: which cache entries and pairs of the current home can fit at all, so that a scan
skips the rest without reading them. A swap puts ``x`` (cost ``cx``, ``tx`` tokens) into
bin ``b`` of the home in exchange for what returns from it (``cy``, ``ty``); bin ``b`` keeps
its caps only if ``cx <= cy + round_cap[m] - load[b]`` and ``tx <= ty + capacity - tok[b]``.
Each entry's two right-hand sides are its *keys* (the cost key widened against rounding, so
that it never rejects what the exact check in :func:`_fits` accepts); a tree over the
entries in scan order (cost order) keeps the largest of each key per subtree, and
:func:`next_open` walks to the next entry whose keys both pass, skipping every subtree where
one cannot. The keys of a bin's entries change when the bin does; the scan's results are
those of a full scan (every entry skipped would fail the exact check).

``trees = (c1, c2, p1, p2, cpos, bhead, bnext, bprev, pseg, plist, r1, r2)``: the cache's
tree (cost keys, token keys), the pairs' tree, each cache entry's position (by sequence),
the cache's sequences by round of the home (linked lists), the pairs by round
(``plist[pseg[m]:pseg[m + 1]]``), and the home's bins' tree: the room each bin has left
(cost, widened as above; tokens), which finds the first bin ``x`` can move into and the
most room of any bin without reading every round.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from seqpack.schedulers._kernels._types import Book, Cache, Caps, FloatArray, Grid, IntArray, Pairs, Seqs, Trees

PAIR_BIN = 16  # home_swaps pairs sequences of bins holding at most this many
HOME_TREE_MIN = 256  # home_swaps walks trees over a home's sequences from this many (a turn's cache and own)
SMALL_SORT = 32  # home_swaps sorts a home's cache and pairs by insertion up to this many, by argsort above
_NO_TOKENS = -(1 << 62)  # the token key of an empty leaf or a pair that moved

# The per-sequence loops run without numba's reference counting (they allocate nothing; an
# allocation in one fails to compile): ``_nrt`` is numba's option for it (not in its stubs).
no_refcount = njit(cache=True, _nrt=False)  # type: ignore[call-overload]


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
    """Bring sequences home by moves and swaps that keep every cap. Updates ``round_of`` and
    ``replica_of`` in place.

    Bin ``(m, d)`` is index ``m * dp + d``. ``order`` runs through the sequences home by home
    (grouped by ``origin``): home ``h``'s *turn* is the run of its sequences. For each
    sequence ``x`` placed on another replica than its home ``h``, every bin of ``h`` is
    tried: moving ``x`` there, or swapping it with a sequence ``y`` of that bin; when neither
    fits, swapping it with a pair ``y1 < y2`` that shared a bin of ``h`` of at most
    ``PAIR_BIN`` sequences when ``h``'s turn began and has not moved since. After the change
    both bins must hold at most ``capacity`` tokens and at most ``round_cap[m]`` cost, and
    both replicas at most ``replica_cap`` cost. The change that brings home the most tokens
    (``x``'s, plus each returning sequence's that lands on its own home, minus each one's
    that leaves it) is made, if that is more than zero; ties go to a move (lowest round
    first), then to the swap with the lowest ``y``, and among pairs to the lowest ``(y1,
    y2)``. ``passes`` passes over ``order``, fewer once a pass changes nothing.

    A swap keeps both bins under their caps only if what returns costs about what ``x``
    does, so while ``h``'s turn runs its sequences are kept sorted by cost, and its pairs by
    their summed cost, and only that window of costs is read (checked against a full scan in
    the tests). Within the window, max trees (module docstring) skip every entry
    whose bin has too little cost or token room left to take ``x``, and find the first bin
    ``x`` can move into, so a scan reads the few entries that can fit rather than the whole
    window; the result is the full scan's.

    Bounds (every buffer, from an invariant): the cache holds exactly the sequences on the
    current home (at most ``n``; ``n + 1`` entries); a turn's pairs come from rounds of at
    most ``PAIR_BIN`` of them, at most ``rounds * PAIR_BIN * (PAIR_BIN - 1) / 2``; the
    cache's tree has a leaf for every entry the turn can reach (the cache grows by one per
    move and the turn makes at most one change per sequence of ``xs``: ``k + len(xs)``,
    capped at ``n``); the arrival list of a pass at most two entries per sequence of
    ``order`` (:func:`new_book`). Requires ``0 <= round_of < rounds``, ``0 <=
    replica_of, origin < dp``, ``order`` a permutation of the sequences grouped by origin.

    Returns:
        The number of changes made.
    """
    n = lengths.shape[0]
    seqs = (round_of, replica_of, lengths, costs, origin)
    grid = bin_loads(seqs, dp, rounds)
    caps = (round_cap, replica_cap, capacity)
    book = new_book(n, dp, order.shape[0])
    cache = (
        np.empty(n + 1, dtype=np.int64),
        np.empty(n + 1, dtype=np.int64),
        np.empty(n + 1, dtype=np.int64),
        np.empty(n + 1, dtype=np.float64),
        np.empty(n + 1, dtype=np.int64),
    )
    n_pairs_max = rounds * PAIR_BIN * (PAIR_BIN - 1) // 2
    pairs = (
        np.empty(n_pairs_max, dtype=np.float64),
        np.empty((n_pairs_max, 2), dtype=np.int64),
        np.empty(n_pairs_max, dtype=np.int64),
        np.empty(rounds + 1, dtype=np.int64),
        np.empty(n + 1, dtype=np.int64),
    )
    trees = new_trees(n, n_pairs_max, rounds)
    clock = 0  # changes so far: moved_at[y] is the change that last moved y
    changes = 0
    for _ in range(passes):
        made, clock = _swap_pass(seqs, grid, caps, book, cache, pairs, trees, dp, rounds, order, clock)
        changes += made
        if made == 0:
            break
    return changes


@njit(cache=True, inline="always")
def _swap_pass(
    seqs: Seqs,
    grid: Grid,
    caps: Caps,
    book: Book,
    cache: Cache,
    pairs: Pairs,
    trees: Trees,
    dp: int,
    rounds: int,
    order: IntArray,
    clock: int,
) -> tuple[int, int]:
    """One pass over ``order``, home by home. Returns (changes made, clock)."""
    origin, replica_of = seqs[4], seqs[1]
    snapshot(replica_of, dp, book)
    n_arrivals = 0
    made = 0
    i = 0
    while i < order.shape[0]:
        home = origin[order[i]]
        j = i
        while j < order.shape[0] and origin[order[j]] == home:
            j += 1
        k = turn_cache(home, seqs, book, cache)
        n_pairs = turn_pairs(k, rounds, cache, pairs)
        csize, psize = 0, 0  # no cache and pair trees for a small home: plain scans are cheaper
        if k + j - i >= HOME_TREE_MIN:
            csize, psize = pow2_above(min(k + j - i, origin.shape[0]) + 1), pow2_above(n_pairs + 1)
            trees = grow(trees, csize)
        changed, clock, n_arrivals = _turn(
            order[i:j], home, k, n_pairs, clock, n_arrivals, seqs, grid, caps, book, cache, pairs, trees, csize,
            psize, dp, rounds,
        )  # fmt: skip
        made += changed
        i = j
    return made, clock


@no_refcount
def _turn(
    xs: IntArray,
    home: int,
    k: int,
    n_pairs: int,
    clock: int,
    n_arrivals: int,
    seqs: Seqs,
    grid: Grid,
    caps: Caps,
    book: Book,
    cache: Cache,
    pairs: Pairs,
    trees: Trees,
    csize: int,
    psize: int,
    dp: int,
    rounds: int,
) -> tuple[int, int, int]:
    """Home ``home``'s turn over its sequences ``xs``: the turn's trees, then each sequence
    away from home is brought home by the best change, if any. Returns (changes made, clock,
    arrivals)."""
    turn_trees(k, n_pairs, home, cache, pairs, seqs[2], grid, caps, dp, rounds, trees, csize, psize)
    replica_of = seqs[1]
    turn = clock
    made = 0
    for x in xs:
        if replica_of[x] == home:
            continue
        best, best_y, best_m, lo, hi = _best_single(x, home, seqs, grid, caps, cache, k, trees, csize, dp, rounds)
        best_y2 = -1
        if best_m < 0 and n_pairs > 0:
            best_y, best_y2, best_m = _best_pair(
                x, home, turn, lo, hi, seqs, grid, caps, pairs, n_pairs, book, trees, psize, dp
            )
        if best_m < 0:
            continue
        clock += 1
        k_before = k
        k, n_arrivals = apply_change(
            x, home, best_y, best_y2, best_m, clock, k, n_arrivals, seqs, grid, book, cache, dp
        )
        trees_after_change(
            x, best_y, best_y2, best_m, k_before, k, home, turn, seqs, cache, pairs, book[7], grid, caps, dp, trees,
            csize, psize,
        )  # fmt: skip
        made += 1
    return made, clock, n_arrivals


@njit(cache=True, inline="always")
def _best_single(
    x: int,
    home: int,
    seqs: Seqs,
    grid: Grid,
    caps: Caps,
    cache: Cache,
    k: int,
    trees: Trees,
    csize: int,
    dp: int,
    rounds: int,
) -> tuple[int, int, int, float, float]:
    """The best move of ``x`` home, or swap with one sequence of the cache's first ``k``:
    (tokens brought home, y or -1 for a move, round or -1 for none, lo, hi) with ``[lo, hi]``
    the window of costs a swap partner may have."""
    round_of, replica_of, lengths, costs, _ = seqs
    load, tok, total = grid
    round_cap, replica_cap, capacity = caps
    cache_y, cache_o, cache_t, cache_c, cache_m = cache
    here = replica_of[x]
    ra = round_of[x]
    a = ra * dp + here
    cx, tx = costs[x], lengths[x]
    best, best_y, best_m = 0, -1, -1
    r1, r2 = trees[10], trees[11]
    rsize = r1.shape[0] // 2 if rounds >= HOME_TREE_MIN // 4 else 0  # few rounds: read each
    room = r1[1]  # the most cost any bin of home can take (widened: a wider window)
    if total[home] + cx <= replica_cap:  # the first bin of home x fits into
        m = next_open(r1, r2, rsize, 0, rounds, cx, tx)
        while m < rounds:
            b = m * dp + home
            if load[b] + cx <= round_cap[m] and tok[b] + tx <= capacity:
                best, best_m = tx, m
                break
            m = next_open(r1, r2, rsize, m + 1, rounds, cx, tx)
    lo, hi = window(cx, room, round_cap[ra] - load[a])
    lo, hi = replica_window(lo, hi, cx, total[home], total[here], replica_cap)
    end = int(np.searchsorted(cache_c[:k], hi, side="right"))
    c = next_open(trees[0], trees[1], csize, int(np.searchsorted(cache_c[:k], lo)), end, cx, tx)
    while c < end:
        ty, cy, m = cache_t[c], cache_c[c], cache_m[c]
        gain = tx + _returned(ty, cache_o[c], here, home)
        y = cache_y[c]
        c = next_open(trees[0], trees[1], csize, c + 1, end, cx, tx)
        if gain < best or (gain == best and (best_y < 0 or y > best_y)):
            continue
        b = m * dp + home
        if _fits(a, ra, b, m, cx, tx, cy, ty, here, home, load, tok, total, round_cap, capacity, replica_cap):
            best, best_y, best_m = gain, y, m
    return best, best_y, best_m, lo, hi


@njit(cache=True, inline="always")
def _best_pair(
    x: int,
    home: int,
    turn: int,
    lo: float,
    hi: float,
    seqs: Seqs,
    grid: Grid,
    caps: Caps,
    pairs: Pairs,
    n_pairs: int,
    book: Book,
    trees: Trees,
    psize: int,
    dp: int,
) -> tuple[int, int, int]:
    """The best swap of ``x`` with a pair of the turn costing within ``[lo, hi]`` that has
    not moved since the turn began: (y1, y2, round), round -1 for none."""
    round_of, replica_of, lengths, costs, origin = seqs
    load, tok, total = grid
    round_cap, replica_cap, capacity = caps
    pair_c, pair_y, pair_m = pairs[0], pairs[1], pairs[2]
    moved_at = book[7]
    here = replica_of[x]
    ra = round_of[x]
    a = ra * dp + here
    cx, tx = costs[x], lengths[x]
    best, best_y, best_y2, best_m = 0, -1, -1, -1
    end = int(np.searchsorted(pair_c[:n_pairs], hi, side="right"))
    c = next_open(trees[2], trees[3], psize, int(np.searchsorted(pair_c[:n_pairs], lo)), end, cx, tx)
    while c < end:
        y1, y2, m, cy = pair_y[c, 0], pair_y[c, 1], pair_m[c], pair_c[c]
        c = next_open(trees[2], trees[3], psize, c + 1, end, cx, tx)
        if moved_at[y1] > turn or moved_at[y2] > turn:
            continue
        gain = tx + _returned(lengths[y1], origin[y1], here, home)
        gain += _returned(lengths[y2], origin[y2], here, home)
        if gain < best or (gain == best and (y1 > best_y or (y1 == best_y and y2 > best_y2))):
            continue
        b = m * dp + home
        ty = lengths[y1] + lengths[y2]
        if _fits(a, ra, b, m, cx, tx, cy, ty, here, home, load, tok, total, round_cap, capacity, replica_cap):
            best, best_y, best_y2, best_m = gain, y1, y2, m
    return best_y, best_y2, best_m


# --- bookkeeping: bin loads, who is where, the cache and pairs of a home, changes -------


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
    with a few array bindings per sequence: without reference counts.)"""
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


# --- max trees ------------------------------------------------------------------------


@njit(cache=True, inline="always")
def pow2_above(v: int) -> int:
    """The least power of two >= ``v``."""
    s = 1
    while s < v:
        s *= 2
    return s


@njit(cache=True)
def new_trees(n: int, n_pairs_max: int, rounds: int) -> Trees:
    """Empty trees (grown per turn by :func:`grow`) and the per-sequence lists."""
    return (
        np.empty(2, dtype=np.float64),
        np.empty(2, dtype=np.int64),
        np.empty(2 * pow2_above(n_pairs_max + 1), dtype=np.float64),
        np.empty(2 * pow2_above(n_pairs_max + 1), dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(rounds, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(rounds + 1, dtype=np.int64),
        np.empty(n_pairs_max, dtype=np.int64),
        np.empty(2 * pow2_above(rounds), dtype=np.float64),
        np.empty(2 * pow2_above(rounds), dtype=np.int64),
    )


@njit(cache=True, inline="always")
def grow(trees: Trees, size: int) -> Trees:
    """``trees`` with a cache tree of at least ``size`` leaves."""
    if 2 * size <= trees[0].shape[0]:
        return trees
    c1, c2 = np.empty(2 * size, dtype=np.float64), np.empty(2 * size, dtype=np.int64)
    return (c1, c2, *trees[2:])


@njit(cache=True, inline="always")
def cost_key(c: float, cap: float, load: float) -> float:
    """The most cost ``x`` may have to enter a bin (``load`` of ``cap``) that ``c`` leaves:
    ``c + cap - load``, widened by far more than the rounding of the exact check."""
    return c + (cap - load) + 1e-9 * (abs(cap) + abs(load) + abs(c)) + 1e-9


@njit(cache=True, inline="always")
def set_leaf(t1: FloatArray, t2: IntArray, size: int, q: int, v1: float, v2: int) -> None:
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


@njit(cache=True, inline="always")
def build(t1: FloatArray, t2: IntArray, size: int, count: int) -> None:
    """Leaves ``[0, count)`` are set: empty the rest and fill the inner nodes."""
    t1[size + count : 2 * size] = -np.inf
    t2[size + count : 2 * size] = _NO_TOKENS
    for i in range(size - 1, 0, -1):
        t1[i] = max(t1[2 * i], t1[2 * i + 1])
        t2[i] = max(t2[2 * i], t2[2 * i + 1])


@njit(cache=True, inline="always")
def next_open(t1: FloatArray, t2: IntArray, size: int, p: int, end: int, cx: float, tx: int) -> int:
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


@njit(cache=True, inline="always")
def _entry_leaf(q: int, home: int, cache: Cache, grid: Grid, caps: Caps, dp: int, trees: Trees, size: int) -> None:
    """Leaf ``q`` of the cache's tree from cache entry ``q`` and its bin."""
    load, tok = grid[0], grid[1]
    m = cache[4][q]
    b = m * dp + home
    key = cost_key(cache[3][q], caps[0][m], load[b])
    set_leaf(trees[0], trees[1], size, q, key, cache[2][q] + caps[2] - tok[b])


@njit(cache=True, inline="always")
def turn_trees(
    k: int,
    n_pairs: int,
    home: int,
    cache: Cache,
    pairs: Pairs,
    lengths: IntArray,
    grid: Grid,
    caps: Caps,
    dp: int,
    rounds: int,
    trees: Trees,
    csize: int,
    psize: int,
) -> None:
    """At a turn's start: both trees, the entries' positions and lists by round, the pairs
    by round."""
    c1, c2, p1, p2, cpos, bhead, bnext, bprev, pseg, plist, r1, r2 = trees
    load, tok = grid[0], grid[1]
    cache_y, cache_m = cache[0], cache[4]
    rsize = r1.shape[0] // 2
    for m in range(rounds):
        r1[rsize + m] = cost_key(0.0, caps[0][m], load[m * dp + home])
        r2[rsize + m] = caps[2] - tok[m * dp + home]
    build(r1, r2, rsize, rounds)
    if csize == 0:
        return
    bhead[:] = -1
    for q in range(k):
        y, m = cache_y[q], cache_m[q]
        b = m * dp + home
        c1[csize + q] = cost_key(cache[3][q], caps[0][m], load[b])
        c2[csize + q] = cache[2][q] + caps[2] - tok[b]
        cpos[y] = q
        _push(y, m, bhead, bnext, bprev)
    build(c1, c2, csize, k)
    pair_c, pair_y, pair_m = pairs[0], pairs[1], pairs[2]
    pseg[:] = 0
    for c in range(n_pairs):
        m = pair_m[c]
        b = m * dp + home
        p1[psize + c] = cost_key(pair_c[c], caps[0][m], load[b])
        p2[psize + c] = lengths[pair_y[c, 0]] + lengths[pair_y[c, 1]] + caps[2] - tok[b]
        pseg[m + 1] += 1
    build(p1, p2, psize, n_pairs)
    for m in range(rounds):
        pseg[m + 1] += pseg[m]
    for c in range(n_pairs):  # pseg[m] runs through round m's places, ending at round m + 1's start
        plist[pseg[pair_m[c]]] = c
        pseg[pair_m[c]] += 1
    for m in range(rounds, 0, -1):  # back to the starts (allocates nothing)
        pseg[m] = pseg[m - 1]
    pseg[0] = 0


@njit(cache=True, inline="always")
def _push(y: int, m: int, bhead: IntArray, bnext: IntArray, bprev: IntArray) -> None:
    """``y`` joins round ``m``'s list."""
    bnext[y], bprev[y] = bhead[m], -1
    if bhead[m] >= 0:
        bprev[bhead[m]] = y
    bhead[m] = y


@njit(cache=True, inline="always")
def _drop(y: int, m: int, bhead: IntArray, bnext: IntArray, bprev: IntArray) -> None:
    """``y`` leaves round ``m``'s list."""
    if bprev[y] >= 0:
        bnext[bprev[y]] = bnext[y]
    else:
        bhead[m] = bnext[y]
    if bnext[y] >= 0:
        bprev[bnext[y]] = bprev[y]


@njit(cache=True, inline="always")
def trees_after_change(
    x: int,
    y1: int,
    y2: int,
    m: int,
    k_before: int,
    k: int,
    home: int,
    turn: int,
    seqs: Seqs,
    cache: Cache,
    pairs: Pairs,
    moved_at: IntArray,
    grid: Grid,
    caps: Caps,
    dp: int,
    trees: Trees,
    csize: int,
    psize: int,
) -> None:
    """``x`` entered bin ``(m, home)`` for ``y1`` (and ``y2``), or moved there (``y1 <
    0``): the entries that changed place, the entries and pairs of that bin."""
    c1, c2, p1, p2, cpos, bhead, bnext, bprev, pseg, plist, r1, r2 = trees
    cache_y, cache_c = cache[0], cache[3]
    b = m * dp + home
    set_leaf(r1, r2, r1.shape[0] // 2, m, cost_key(0.0, caps[0][m], grid[0][b]), caps[2] - grid[1][b])
    if csize == 0:
        return
    lo_q = int(np.searchsorted(cache_c[:k], seqs[3][x]))
    while cache_y[lo_q] != x:
        lo_q += 1
    hi_q = lo_q
    if y1 < 0:
        hi_q = k_before  # a new entry at the end slid down to x's place
    for y in (y1, y2):
        if y >= 0:
            lo_q, hi_q = min(lo_q, cpos[y]), max(hi_q, cpos[y])
            _drop(y, m, bhead, bnext, bprev)
    if y2 >= 0:
        hi_q = k_before - 1  # the pair's second was dropped: the entries after it shifted
    for q in range(lo_q, hi_q + 1):
        if q < k:
            cpos[cache_y[q]] = q
            _entry_leaf(q, home, cache, grid, caps, dp, trees, csize)
        else:
            set_leaf(c1, c2, csize, q, -np.inf, _NO_TOKENS)
    _push(x, m, bhead, bnext, bprev)
    y = bhead[m]
    while y >= 0:
        _entry_leaf(cpos[y], home, cache, grid, caps, dp, trees, csize)
        y = bnext[y]
    lengths = seqs[2]
    for u in range(pseg[m], pseg[m + 1]):
        c = plist[u]
        z1, z2 = pairs[1][c, 0], pairs[1][c, 1]
        if moved_at[z1] > turn or moved_at[z2] > turn:
            set_leaf(p1, p2, psize, c, -np.inf, _NO_TOKENS)
        else:
            key = cost_key(pairs[0][c], caps[0][m], grid[0][b])
            set_leaf(p1, p2, psize, c, key, lengths[z1] + lengths[z2] + caps[2] - grid[1][b])
