"""The packing kernel behind :func:`seqpack.packing.pack_lengths` (contiguous int64 in, trusted).

Sequences of equal length are interchangeable, so the kernel keeps a count per distinct
length and a presence tree over their ranks (the largest length <= x, the smallest present,
in O(log d) for d distinct lengths). Every length above ``max_tokens // 2`` opens a pack of
its own; those packs, then new ones, are filled one at a time: by a length equal to the room,
else two lengths summing to it, else the largest length that leaves room the lengths left can
still cover (``k`` of them between the shortest and the longest), else the largest that fits.
Taking the largest length that leaves room keeps short lengths for the ends of packs, where
only they fit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PAIR_TRIES = 8
"""Candidates tried for the larger of two lengths that fill a room exactly."""
COVER_TRIES = 16
"""Candidates tried for a length whose leftover the lengths left can cover."""


@njit(cache=True)
def _rank_le(values: np.ndarray, table: np.ndarray, x: int) -> int:
    """Index of the largest of the sorted distinct ``values`` that is <= ``x``, or -1:
    ``table[x]`` when the table covers ``x`` (``table`` has ``values[-1] + 1`` entries),
    else a binary search."""
    if x < 0:
        return -1
    if x < table.shape[0]:
        return table[x]
    return int(np.searchsorted(values, x, side="right")) - 1


@njit(cache=True)
def _pred(tree: np.ndarray, leaves: int, r: int) -> int:
    """The largest present rank <= ``r``, or -1. ``tree[v]`` counts the present ranks under
    node ``v``; leaf of rank ``r`` is ``leaves + r``."""
    if r < 0:
        return -1
    v = leaves + r
    if tree[v] > 0:
        return r
    while v > 1:
        if v % 2 == 1 and tree[v - 1] > 0:  # a left sibling holds a smaller present rank
            v -= 1
            while v < leaves:
                v = 2 * v + 1 if tree[2 * v + 1] > 0 else 2 * v
            return v - leaves
        v //= 2
    return -1


@njit(cache=True)
def _first(tree: np.ndarray, leaves: int) -> int:
    """The smallest present rank, or -1 when none is."""
    if tree[1] == 0:
        return -1
    v = 1
    while v < leaves:
        v = 2 * v if tree[2 * v] > 0 else 2 * v + 1
    return v - leaves


@njit(cache=True)
def _toggle(tree: np.ndarray, leaves: int, r: int, delta: int) -> None:
    """Mark rank ``r`` present (``delta=1``) or absent (-1) on its path to the root."""
    v = leaves + r
    while v >= 1:
        tree[v] += delta
        v //= 2


@njit(cache=True)
def pack_sizes(lengths: np.ndarray, max_tokens: int, use_table: bool) -> tuple[np.ndarray, int]:
    """Pack ``lengths`` (int64 ``[n]``, each in ``[1, max_tokens]``) into packs of at most
    ``max_tokens`` tokens (module docstring). ``use_table``: count-sort the lengths and look
    ranks up in a table of ``longest + 1`` entries (the wrapper picks it for short lengths),
    else sort and search.

    Returns:
        ``(pack_of, num_packs)``: int64 ``[n]``, the pack of each length, numbered in the
        order packs are opened (pack 0 holds a longest length); the number of packs.

    Bounds: ``table`` has ``longest + 1`` entries (or none) and is read at ``x`` only for
    ``0 <= x < table.shape[0]`` (:func:`_rank_le`); it is first indexed by lengths, which
    are in ``[1, longest]``. ``values``, ``count`` and ``start`` have one entry per rank
    ``r < d`` (``d <= n`` distinct lengths); ``_rank_le`` returns a rank in ``[-1, d)``,
    and every rank used to index is checked ``>= 0`` first or comes from ``_pred`` /
    ``_first`` / ``high`` (present ranks). A rank is taken only while its ``count`` is
    > 0 (present in the tree, or checked), so a rank's takes never pass its number of
    sequences and ``start[r] + taken[r]`` stays below ``start[r + 1]`` (or ``n``) when the
    sequences are handed out of ``by_size``, a permutation of ``[0, n)`` grouped by rank.
    ``tree`` has ``2 * leaves`` entries with ``leaves >= d``: its walks stay in
    ``[1, 2 * leaves)``. ``entry_rank`` / ``entry_pack`` get one entry per take, ``n`` takes
    in all (``left`` counts them down to 0), so ``t <= n``; a pack is opened only while
    lengths are left, so ``num_packs <= n`` and the pack ``p < big`` read back was written.
    """
    n = lengths.shape[0]
    pack_of = np.empty(n, dtype=np.int64)
    if n == 0:
        return pack_of, 0
    longest = 0
    for i in range(n):
        longest = max(longest, lengths[i])
    # Distinct lengths (``values``, ascending), how many of each, and the sequences of each
    # in ascending index (``by_size``, grouped by rank from ``start``).
    if use_table:
        # A counting sort, and ``table[x]``: the rank of the largest length <= x.
        table = np.zeros(longest + 1, dtype=np.int64)
        for i in range(n):
            table[lengths[i]] += 1
        d = 0
        for x in range(longest + 1):
            if table[x] > 0:
                d += 1
        values = np.empty(d, dtype=np.int64)
        count = np.empty(d, dtype=np.int64)
        r = -1
        for x in range(longest + 1):
            if table[x] > 0:
                r += 1
                values[r] = x
                count[r] = table[x]
            table[x] = r
        start = np.zeros(d, dtype=np.int64)
        for r in range(1, d):
            start[r] = start[r - 1] + count[r - 1]
        fill = start.copy()
        by_size = np.empty(n, dtype=np.int64)
        for i in range(n):
            r = table[lengths[i]]
            by_size[fill[r]] = i
            fill[r] += 1
    else:
        table = np.zeros(0, dtype=np.int64)
        by_size = np.argsort(lengths, kind="mergesort")  # stable: ascending index within a length
        d = 0
        for j in range(n):
            if d == 0 or lengths[by_size[j]] != lengths[by_size[j - 1]]:
                d += 1
        values = np.empty(d, dtype=np.int64)
        count = np.zeros(d, dtype=np.int64)
        start = np.zeros(d, dtype=np.int64)
        r = -1
        for j in range(n):
            if r < 0 or lengths[by_size[j]] != values[r]:
                r += 1
                values[r] = lengths[by_size[j]]
                start[r] = j
            count[r] += 1
    leaves = 1
    while leaves < d:
        leaves *= 2
    tree = np.zeros(2 * leaves, dtype=np.int32)
    for r in range(d):
        _toggle(tree, leaves, r, 1)

    entry_rank = np.empty(n, dtype=np.int64)
    entry_pack = np.empty(n, dtype=np.int64)
    t = 0
    left = n
    num_packs = 0
    # 1. Lengths above half the capacity: a pack each, longest first.
    r = d - 1
    while r >= 0 and 2 * values[r] > max_tokens:
        while count[r] > 0:
            count[r] -= 1
            entry_rank[t] = r
            entry_pack[t] = num_packs
            t += 1
            num_packs += 1
            left -= 1
        _toggle(tree, leaves, r, -1)
        r -= 1
    big = num_packs
    low = _first(tree, leaves)  # shortest length left (rank), kept as lengths are taken
    high = _pred(tree, leaves, d - 1)  # longest length left (rank)
    # 2. Fill the big packs, tightest first, then new packs, until no length is left.
    p = 0
    while left > 0:
        if p < big:
            pack = p
            room = max_tokens - values[entry_rank[p]]
        else:
            pack = num_packs
            num_packs += 1
            room = max_tokens
        p += 1
        while room > 0 and left > 0:
            shortest = values[low]
            if shortest > room:
                break
            pick = -1
            second = -1
            exact = _rank_le(values, table, room)
            if exact >= 0 and values[exact] == room and count[exact] > 0:
                pick = exact
            elif room - values[high] >= 2 * shortest:
                # The longest length left leaves room for two more: no two lengths fill the
                # room, and the longest is the pick when what it leaves can be covered.
                rest = room - values[high]
                k = rest // shortest
                if (rest + k - 1) // k <= values[high]:
                    pick = high
            else:
                # Two lengths that sum to the room: the larger one first, a few tries.
                x = _pred(tree, leaves, _rank_le(values, table, room - shortest))
                tries = 0
                while x >= 0 and 2 * values[x] >= room and tries < PAIR_TRIES:
                    y = _rank_le(values, table, room - values[x])
                    if y >= 0 and values[y] == room - values[x] and count[y] > (1 if y == x else 0):
                        pick = x
                        second = y
                        break
                    tries += 1
                    x = _pred(tree, leaves, x - 1)
            if pick < 0:
                # The largest length leaving room for two of the shortest that the lengths
                # left can cover: k of them, each between the shortest and the longest.
                x = _pred(tree, leaves, _rank_le(values, table, room - 2 * shortest))
                tries = 0
                while x >= 0 and tries < COVER_TRIES:
                    rest = room - values[x]
                    k = rest // shortest
                    if (rest + k - 1) // k <= values[high]:
                        pick = x
                        break
                    tries += 1
                    x = _pred(tree, leaves, x - 1)
            if pick < 0:
                pick = _pred(tree, leaves, _rank_le(values, table, room - shortest))
            if pick < 0:
                pick = _pred(tree, leaves, _rank_le(values, table, room))  # its leftover stays empty
            emptied = False
            for chosen in range(2):
                r = pick if chosen == 0 else second
                if r < 0:
                    continue
                count[r] -= 1
                if count[r] == 0:
                    _toggle(tree, leaves, r, -1)
                    emptied = True
                entry_rank[t] = r
                entry_pack[t] = pack
                t += 1
                left -= 1
                room -= values[r]
            if emptied and left > 0:
                low = _first(tree, leaves)
                high = _pred(tree, leaves, high)
    # Hand out the sequences of each length in ascending index order.
    taken = np.zeros(d, dtype=np.int64)
    for e in range(t):
        r = entry_rank[e]
        pack_of[by_size[start[r] + taken[r]]] = entry_pack[e]
        taken[r] += 1
    return pack_of, num_packs


@njit(cache=True)
def group_by_pack(pack_of: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """The sequences pack by pack: ``(order, cu_packs)``, int64 ``[n]`` and
    ``[num_packs + 1]``; pack ``k`` holds ``order[cu_packs[k]:cu_packs[k + 1]]``, in
    ascending index (a counting sort).

    Bounds: every ``pack_of[i]`` is in ``[0, num_packs)`` (the kernel's output), so
    ``cu_packs[pack_of[i] + 1]`` is in range; ``fill[k]`` starts at ``cu_packs[k]`` and is
    bumped once per member of pack ``k``, so it stays below ``cu_packs[k + 1] <= n``.
    """
    n = pack_of.shape[0]
    cu_packs = np.zeros(num_packs + 1, dtype=np.int64)
    for i in range(n):
        cu_packs[pack_of[i] + 1] += 1
    for k in range(num_packs):
        cu_packs[k + 1] += cu_packs[k]
    fill = cu_packs[:num_packs].copy()
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        k = pack_of[i]
        order[fill[k]] = i
        fill[k] += 1
    return order, cu_packs
