"""repair_replicas and replica_lpt: the kernels that balance replica totals, and the heaps of
replicas by total they share. Ties are broken by index, never by chance.

A swap sends ``delta`` from the busier replica to the lighter one, ``gap`` apart, and lowers
the pair's larger total by ``min(delta, gap - delta)`` (its *gain*), best at half the gap:
partners sorted by cost are walked from there outwards (:func:`walk_next`).
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import FloatArray, IntArray, njit, no_refcount

Lists = tuple[IntArray, IntArray, IntArray]  # (head, prv, nxt): every replica's sequences, linked
Book = tuple[FloatArray, IntArray, FloatArray]  # (load, tok, total): the microbatches' and replicas' sums
Seqs = tuple[FloatArray, IntArray, IntArray, IntArray]  # (costs, lengths, replica_of, round_of)


@njit(cache=True)
def repair_replicas(
    round_of: IntArray,
    replica_of: IntArray,
    costs: FloatArray,
    lengths: IntArray,
    load: FloatArray,
    tok: IntArray,
    capacity: int,
    max_moves: int,
    rel_tol: float,
    stop_at: float,
    swap_candidates: int,
    max_work: int = 50_000_000,
    scan_limit: int = 16,
) -> int:
    """Even out replica totals by swaps, updating ``round_of``, ``replica_of``, ``load`` and
    ``tok`` in place; returns how many were made.

    Each step makes the swap of a sequence of the busiest replica ``d1`` with one of the
    ``swap_candidates`` lightest replicas' (each takes the other's microbatch) that lowers
    the pair's larger total most, by more than ``rel_tol`` times ``d1``'s, within
    ``capacity`` (ties: lighter replica, cheaper item of ``d1``; ``scan_limit`` partners per
    sequence and replica). Stops when none does, after ``max_moves`` swaps, once ``d1`` is at
    most ``stop_at``, or after about ``max_work`` checks.

    Bounds: ``mine``, ``theirs`` and the merge scratch have one entry per sequence;
    ``light`` holds ``min(dp, swap_candidates + 1)`` replicas. Requires ``dp >= 1``, ``0 <=
    round_of < rounds``, ``0 <= replica_of < dp`` and ``load`` / ``tok`` the sums over the sequences.
    """
    n_rounds, dp = load.shape
    n = round_of.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    for m in range(n_rounds):
        for d in range(dp):
            total[d] += load[m, d]
    # Items of every replica as doubly linked lists.
    head = np.full(dp, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    prv = np.full(n, -1, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        d = replica_of[i]
        nxt[i] = head[d]
        if head[d] >= 0:
            prv[head[d]] = i
        head[d] = i
    # A min-heap and a max-heap of the totals, with positions.
    lo = np.arange(dp, dtype=np.int64)
    lo_pos = np.arange(dp, dtype=np.int64)
    hi = np.arange(dp, dtype=np.int64)
    hi_pos = np.arange(dp, dtype=np.int64)
    for i in range(dp):
        _total_sift(lo, lo_pos, i + 1, i, total, 1.0)
        _total_sift(hi, hi_pos, i + 1, i, total, -1.0)
    light = np.empty(min(dp, max(swap_candidates, 0) + 1), dtype=np.int64)
    frontier = np.empty(2 * light.shape[0] + 1, dtype=np.int64)
    mine = np.empty(n, dtype=np.int64)
    theirs = np.empty(n, dtype=np.int64)
    tmp = np.empty(n, dtype=np.int64)
    lists, book, seqs = (head, prv, nxt), (load, tok, total), (costs, lengths, replica_of, round_of)
    swaps = 0
    work = 0
    while swaps < max_moves and work < max_work:
        d1 = hi[0]
        if total[d1] <= stop_at:
            break
        _lightest_into(lo, dp, total, light, frontier)
        k1 = _sorted_members(head[d1], nxt, costs, mine, tmp)
        # The best swap of one of d1's items with one of a light replica's, if it gains enough.
        best_gain, best_i, best_j, best_d2 = rel_tol * total[d1], -1, -1, -1
        tried = 0
        for kk in range(light.shape[0]):
            d2 = light[kk]
            if d2 == d1:
                continue
            gap = total[d1] - total[d2]
            if tried == swap_candidates or gap / 2 <= best_gain:  # no partner left that could gain more
                break
            tried += 1
            k2 = _sorted_members(head[d2], nxt, costs, theirs, tmp)
            for t in range(k1):  # d2's items from the ideal cost outwards
                i = mine[t]
                ci = costs[i]
                right = first_cost_above(theirs, k2, costs, ci - gap / 2)
                left = right - 1
                checked = 0
                while checked < scan_limit:
                    j, gain, left, right = walk_next(theirs, k2, costs, ci, gap, left, right)
                    if j < 0 or gain <= best_gain:
                        break
                    work += 1
                    checked += 1
                    shift = lengths[i] - lengths[j]  # tokens d2's microbatch gains, d1's loses
                    if tok[round_of[j], d2] + shift <= capacity and tok[round_of[i], d1] - shift <= capacity:
                        best_gain, best_i, best_j, best_d2 = gain, i, j, d2
                        break
        if best_i < 0:
            break
        # i moves from its microbatch (m, d1) to j's (m2, d2), and j the other way.
        m, m2 = round_of[best_i], round_of[best_j]
        _move(best_i, d1, m, best_d2, m2, lists, book, seqs)
        _move(best_j, best_d2, m2, d1, m, lists, book, seqs)
        for d in (d1, best_d2):
            _total_sift(lo, lo_pos, dp, lo_pos[d], total, 1.0)
            _total_sift(hi, hi_pos, dp, hi_pos[d], total, -1.0)
        swaps += 1
    return swaps


@no_refcount
def _sorted_members(head: int, nxt: IntArray, costs: FloatArray, buf: IntArray, tmp: IntArray) -> int:
    """Items of one replica (its linked list) into ``buf``, stably sorted by cost; returns how
    many. ``tmp``: scratch of ``buf``'s size."""
    k = 0
    i = head
    while i >= 0:
        buf[k] = i
        k += 1
        i = nxt[i]
    # Runs of 16 by insertion, then bottom-up merges.
    for lo in range(0, k, 16):
        for t in range(lo + 1, min(lo + 16, k)):
            v = buf[t]
            c = costs[v]
            u = t
            while u > lo and costs[buf[u - 1]] > c:
                buf[u] = buf[u - 1]
                u -= 1
            buf[u] = v
    width = 16
    src, dst, in_tmp = buf, tmp, False  # the sorted runs are in src
    while width < k:
        for lo in range(0, k, 2 * width):
            _merge(src, dst, lo, min(lo + width, k), min(lo + 2 * width, k), costs)
        src, dst, in_tmp = dst, src, not in_tmp
        width *= 2
    if in_tmp:
        for t in range(k):
            buf[t] = tmp[t]
    return k


@no_refcount
def _merge(src: IntArray, dst: IntArray, lo: int, mid: int, hi: int, costs: FloatArray) -> None:
    """Merge the sorted runs ``src[lo:mid]`` and ``src[mid:hi]`` into ``dst[lo:hi]``, stably."""
    a, b = lo, mid
    for t in range(lo, hi):
        if b >= hi or (a < mid and costs[src[a]] <= costs[src[b]]):
            dst[t] = src[a]
            a += 1
        else:
            dst[t] = src[b]
            b += 1


@no_refcount
def _move(i: int, d_from: int, m_from: int, d_to: int, m_to: int, lists: Lists, book: Book, seqs: Seqs) -> None:
    """Move sequence ``i`` from microbatch ``(m_from, d_from)`` to ``(m_to, d_to)``."""
    head, prv, nxt = lists
    load, tok, total = book
    costs, lengths, replica_of, round_of = seqs
    if prv[i] >= 0:
        nxt[prv[i]] = nxt[i]
    else:
        head[d_from] = nxt[i]
    if nxt[i] >= 0:
        prv[nxt[i]] = prv[i]
    prv[i] = -1
    nxt[i] = head[d_to]
    if head[d_to] >= 0:
        prv[head[d_to]] = i
    head[d_to] = i
    load[m_from, d_from] -= costs[i]
    tok[m_from, d_from] -= lengths[i]
    load[m_to, d_to] += costs[i]
    tok[m_to, d_to] += lengths[i]
    total[d_from] -= costs[i]
    total[d_to] += costs[i]
    replica_of[i] = d_to
    round_of[i] = m_to


@no_refcount
def first_cost_above(items: IntArray, k: int, costs: FloatArray, value: float) -> int:
    """Index of the first of ``items[:k]`` (sorted by cost) costing more than ``value``, or ``k``."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        if costs[items[mid]] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@no_refcount
def walk_next(
    items: IntArray, k: int, costs: FloatArray, base: float, gap: float, left: int, right: int
) -> tuple[int, float, int, int]:
    """One step of the walk over ``items[:k]`` from the ideal cost (``right`` the first item
    past it, ``left = right - 1``): ``(item, gain, left, right)``, item -1 when both sides
    are used up; ties go left. Reads ``items`` only within ``[0, k)``."""
    if left < 0 and right >= k:
        return -1, -np.inf, left, right
    gain_left = gap - (base - costs[items[left]]) if left >= 0 else -np.inf
    gain_right = base - costs[items[right]] if right < k else -np.inf
    if gain_left >= gain_right:
        return items[left], gain_left, left - 1, right
    return items[right], gain_right, left, right + 1


@njit(cache=True)
def replica_lpt(
    order: np.ndarray, sizes: np.ndarray, costs: np.ndarray, dp: int, num_rounds: int, capacity: int, max_work: int
) -> tuple[bool, np.ndarray, np.ndarray]:
    """Sequences in ``order`` each to the lightest replica with one of its ``num_rounds`` bins
    of ``capacity`` that fits it, into the fullest such bin (ties: lower index). Returns
    ``(ok, round_of, replica_of)``; ``ok`` is False when a sequence fits no bin or after
    about ``max_work`` heap steps.

    Bounds: ``total``, ``widest``, the heap and ``aside`` have one entry per replica (each set
    aside at most once per sequence); a replica whose widest room fits has a round that does.
    """
    n = order.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    room = np.full((dp, num_rounds), capacity, dtype=np.int64)
    widest = np.full(dp, capacity, dtype=np.int64)  # largest room of each replica's bins
    heap = np.arange(dp, dtype=np.int64)  # a min-heap of replicas by total (ties: lower index)
    pos = np.arange(dp, dtype=np.int64)  # kept up to date by the heap helpers, not read here
    aside = np.empty(dp, dtype=np.int64)
    round_of = np.full(sizes.shape[0], -1, dtype=np.int64)
    replica_of = np.full(sizes.shape[0], -1, dtype=np.int64)
    work = 0
    for k in range(n):
        i = order[k]
        size = sizes[i]
        n_aside = 0
        size_heap = dp
        d = -1
        while size_heap > 0:
            top = heap[0]
            work += 1
            if widest[top] >= size:
                d = top
                break
            # Fits no bin of this replica: set it aside (pop), try the next lightest.
            aside[n_aside] = top
            n_aside += 1
            size_heap -= 1
            heap[0] = heap[size_heap]
            heap[size_heap] = top
            _total_sift(heap, pos, size_heap, 0, total, 1.0)
        if d < 0 or work > max_work:
            return False, round_of, replica_of
        best = -1
        for m in range(num_rounds):
            r = room[d, m]
            if r >= size and (best < 0 or r < room[d, best]):
                best = m
        room[d, best] -= size
        widest[d] = 0
        for m in range(num_rounds):
            if room[d, m] > widest[d]:
                widest[d] = room[d, m]
        work += num_rounds
        round_of[i] = best
        replica_of[i] = d
        total[d] += costs[i]
        _total_sift(heap, pos, size_heap, 0, total, 1.0)
        # Put the set-aside replicas back (their totals did not change).
        for j in range(n_aside):
            heap[size_heap] = aside[j]
            size_heap += 1
            _total_sift(heap, pos, size_heap, size_heap - 1, total, 1.0)
    return True, round_of, replica_of


@no_refcount
def _total_before(total: FloatArray, a: int, b: int, sign: float) -> bool:
    """Heap order of replicas: smaller ``sign * total``, then lower index."""
    x, y = sign * total[a], sign * total[b]
    if x != y:
        return x < y
    return a < b


@no_refcount
def _total_sift(heap: IntArray, pos: IntArray, size: int, i: int, total: FloatArray, sign: float) -> None:
    """Restore the heap ``heap[:size]`` after the total of entry ``i`` changed: up, then down.
    ``pos`` (each replica's place in the heap) follows."""
    while i > 0:
        parent = (i - 1) // 2
        a, q = heap[i], heap[parent]
        if not _total_before(total, a, q, sign):
            break
        heap[i], heap[parent] = q, a
        pos[q], pos[a] = i, parent
        i = parent
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _total_before(total, heap[child + 1], heap[child], sign):
            child += 1
        a, c = heap[i], heap[child]
        if not _total_before(total, c, a, sign):
            return
        heap[i], heap[child] = c, a
        pos[c], pos[a] = i, child
        i = child


@no_refcount
def _lightest_into(heap: IntArray, size: int, total: FloatArray, out: IntArray, frontier: IntArray) -> None:
    """The replicas of the ``len(out) <= size`` smallest totals of a min-heap, in order (ties:
    lower index), by a best-first walk from the root. Bounds: ``frontier`` (scratch) holds at
    most ``t + 1`` positions after ``t`` steps."""
    k = out.shape[0]
    frontier[0] = 0
    count = 1
    for t in range(k):
        best = 0
        for f in range(1, count):
            if _total_before(total, heap[frontier[f]], heap[frontier[best]], 1.0):
                best = f
        p = frontier[best]
        out[t] = heap[p]
        count -= 1
        frontier[best] = frontier[count]
        for child in (2 * p + 1, 2 * p + 2):
            if child < size:
                frontier[count] = child
                count += 1
