"""Max trees of :func:`~.home.home_swaps`: which cache entries and pairs of the current home
can fit at all, so that a scan skips the rest without reading them.

A swap puts ``x`` (cost ``cx``, ``tx`` tokens) into bin ``b`` of the home in exchange for
what returns from it (``cy``, ``ty``); bin ``b`` keeps its caps only if ``cx <= cy +
round_cap[m] - load[b]`` and ``tx <= ty + capacity - tok[b]``. Each entry's two right-hand
sides are its *keys* (the cost key widened against rounding, so that it never rejects what
the exact check in :func:`~.home_book._fits` accepts); a tree over the entries in scan order
(cost order) keeps the largest of each key per subtree, and :func:`next_open` walks to the
next entry whose keys both pass, skipping every subtree where one cannot. The keys of a bin's
entries change when the bin does; the scan's results are those of a full scan (every entry
skipped would fail the exact check).

``trees = (c1, c2, p1, p2, cpos, bhead, bnext, bprev, pseg, plist, r1, r2)``: the cache's
tree (cost keys, token keys), the pairs' tree, each cache entry's position (by sequence),
the cache's sequences by round of the home (linked lists), the pairs by round
(``plist[pseg[m]:pseg[m + 1]]``), and the home's bins' tree: the room each bin has left
(cost, widened as above; tokens), which finds the first bin ``x`` can move into and the
most room of any bin without reading every round.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._types import Cache, Caps, FloatArray, Grid, IntArray, Pairs, Seqs, Trees
from seqpack.schedulers._kernels.jit import njit

_NO_TOKENS = -(1 << 62)  # the token key of an empty leaf or a pair that moved


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
