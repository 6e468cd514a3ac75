"""home_swaps: bring sequences home by moves and swaps that keep every cap.

State travels in tuples of arrays (numba passes them by reference):

- ``seqs = (round_of, replica_of, lengths, costs, origin)``, per sequence;
- ``grid = (load, tok, total)``: cost and tokens of bin ``m * dp + d``, cost of replica ``d``;
- ``caps = (round_cap, replica_cap, capacity)``;
- ``book``: who is on which replica (module :mod:`.home_book`);
- ``cache = (y, home, tokens, cost, round)``: the sequences on the current home, by cost;
- ``pairs = (cost, (y1, y2), round, seg, by_round)``: the pairs of the current turn, by cost;
- ``trees``: max trees over the cache, the pairs and the home's bins (module :mod:`.home_tree`).
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._types import Book, Cache, Caps, FloatArray, Grid, IntArray, Pairs, Seqs, Trees
from seqpack.schedulers._kernels.constants import HOME_TREE_MIN, PAIR_BIN
from seqpack.schedulers._kernels.home_book import (
    _fits,
    _returned,
    apply_change,
    bin_loads,
    new_book,
    replica_window,
    snapshot,
    turn_cache,
    turn_pairs,
    window,
)
from seqpack.schedulers._kernels.home_tree import grow, new_trees, next_open, pow2_above, trees_after_change, turn_trees
from seqpack.schedulers._kernels.jit import njit
from seqpack.schedulers._kernels.no_refcount import no_refcount


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
    the tests). Within the window, max trees (module :mod:`.home_tree`) skip every entry
    whose bin has too little cost or token room left to take ``x``, and find the first bin
    ``x`` can move into, so a scan reads the few entries that can fit rather than the whole
    window; the result is the full scan's.

    Bounds (every buffer, from an invariant): the cache holds exactly the sequences on the
    current home (at most ``n``; ``n + 1`` entries); a turn's pairs come from rounds of at
    most ``PAIR_BIN`` of them, at most ``rounds * PAIR_BIN * (PAIR_BIN - 1) / 2``; the
    cache's tree has a leaf for every entry the turn can reach (the cache grows by one per
    move and the turn makes at most one change per sequence of ``xs``: ``k + len(xs)``,
    capped at ``n``); the arrival list of a pass at most two entries per sequence of
    ``order`` (:func:`.home_book.new_book`). Requires ``0 <= round_of < rounds``, ``0 <=
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
