"""dfs and complete_bins: the exact bin searches of :func:`seqpack.schedulers.balanced.exact.pack_bins`.

``complete_bins`` is bin completion (Korf, "An improved algorithm for optimal bin packing",
IJCAI 2003): one bin at a time, the largest item left and then an undominated set of others,
least waste first; equal items are counted, not named. Both searches are iterative: numba's
cache does not load recursive functions reliably.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import helper, njit

_POOL_LIMIT = 1 << 22  # int64 entries (32 MiB) the candidate sets may take before the search gives up


@njit(cache=True)
def dfs(sizes: np.ndarray, n_bins: int, capacity: int, max_work: int) -> tuple[int, np.ndarray]:
    """Depth-first search over placements of ``sizes`` (longest first) into bins: item ``i``
    tries one bin of each distinct free room ``>= sizes[i]``, smallest room first; a
    placement is undone when the room no later item can use exceeds the slack. Returns
    ``(status, bin_of)``: 0 found, 1 proved infeasible, 2 gave up after about ``max_work`` visits.

    Bounds: ``room`` has one entry per bin, ``bin_of`` one per item and ``tried`` ``n + 1``
    (read at the current item ``i < n``). Requires ``n >= 1``. Backtracking to item ``i``
    reads ``bin_of[i]``, set when ``i`` was placed.
    """
    n = sizes.shape[0]
    room = np.full(n_bins, capacity, dtype=np.int64)
    bin_of = np.full(n, -1, dtype=np.int64)
    tried = np.full(n + 1, -1, dtype=np.int64)
    total = 0
    for i in range(n):
        total += sizes[i]
    slack = n_bins * capacity - total
    smallest = sizes[n - 1]
    work = 0
    i = 0
    while True:
        if i == n:
            return 0, bin_of
        if work > max_work:
            return 2, bin_of
        size = sizes[i]
        best_room = capacity + 1
        best_bin = -1
        # Equal items are interchangeable: each goes to a bin no lower than the previous one's.
        first = bin_of[i - 1] if i > 0 and sizes[i - 1] == size else 0
        for b in range(first, n_bins):
            r = room[b]
            if r >= size and r > tried[i] and r < best_room:
                best_room = r
                best_bin = b
        work += n_bins
        if best_bin < 0:  # no more choices for item i: undo item i-1 and try its next bin
            tried[i] = -1
            i -= 1
            if i < 0:
                return 1, bin_of
            room[bin_of[i]] += sizes[i]
            bin_of[i] = -1
            continue
        tried[i] = best_room
        room[best_bin] -= size
        bin_of[i] = best_bin
        if i + 1 < n:
            waste = 0
            for b in range(n_bins):
                r = room[b]
                if r < smallest:
                    waste += r
                elif r < 2 * smallest:  # room for one more item at most: the largest that fits
                    waste += r - _largest_at_most(sizes, i + 1, r)
                elif r < 3 * smallest:  # two more at most: the fullest one or two that fit
                    waste += r - _best_pair_at_most(sizes, i + 1, r)
                    work += n - i
            work += n_bins
            if waste > slack:  # the rooms no later item fits add up to more than the slack
                room[best_bin] += size
                bin_of[i] = -1
                continue
        i += 1


@helper
def _largest_at_most(sizes: np.ndarray, start: int, limit: int) -> int:
    """The largest of ``sizes[start:]`` (longest first) at most ``limit`` (``>= sizes[-1]``)."""
    lo, hi = start, sizes.shape[0] - 1
    while lo < hi:  # first index whose size is <= limit
        mid = (lo + hi) // 2
        if sizes[mid] <= limit:
            hi = mid
        else:
            lo = mid + 1
    return sizes[lo]


@helper
def _best_pair_at_most(sizes: np.ndarray, start: int, limit: int) -> int:
    """The largest sum of one or two of ``sizes[start:]`` (longest first) at most ``limit`` (``>= sizes[-1]``)."""
    best = _largest_at_most(sizes, start, limit)
    lo, hi = start, sizes.shape[0] - 1
    while lo < hi:  # two pointers: sizes[lo] the larger, sizes[hi] the smaller of the pair
        pair = sizes[lo] + sizes[hi]
        if pair > limit:
            lo += 1
        else:
            if pair > best:
                best = pair
            hi -= 1
    return best


@njit(cache=True)
def complete_bins(sizes: np.ndarray, n_bins: int, capacity: int, max_work: int) -> tuple[int, np.ndarray]:
    """Pack ``sizes`` (longest first, each positive and at most ``capacity``, total at most
    ``n_bins * capacity``) into ``n_bins`` bins by bin completion; returns as :func:`dfs`.

    Bounds: the per-bin stacks have ``n_bins + 1`` entries; ``level`` never exceeds
    ``n_bins``, and the slack of bin ``level + 1`` is written only once bin ``level < n_bins``
    took a set. Each bin below ``level`` holds the set ``pos[b] - 1 >= lo[b]`` of its list."""
    n = sizes.shape[0]
    bin_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return 0, bin_of
    # The distinct sizes: vals[k] from item start[k] on, cnt[k] items of it (loops compile faster).
    nv = 1
    for i in range(1, n):
        nv += sizes[i] != sizes[i - 1]
    start = np.empty(nv, dtype=np.int64)
    vals = np.empty(nv, dtype=np.int64)
    cnt = np.empty(nv, dtype=np.int64)
    total = 0
    k = -1
    for i in range(n):
        if i == 0 or sizes[i] != sizes[i - 1]:
            k += 1
            start[k], vals[k], cnt[k] = i, sizes[i], 0
        cnt[k] += 1
        total += sizes[i]
    state = np.empty(2, dtype=np.int64)
    state[0], state[1] = 0, max_work
    pool = np.empty((64, nv + 1), dtype=np.int64)  # the candidate sets of every open bin
    top = 0
    lo = np.zeros(n_bins + 1, dtype=np.int64)  # bin b's sets: pool[lo[b]:hi[b]], next at pos[b]
    hi = np.zeros(n_bins + 1, dtype=np.int64)
    pos = np.zeros(n_bins + 1, dtype=np.int64)
    largest = np.zeros(n_bins + 1, dtype=np.int64)  # the size index bin b opened with
    slack = np.zeros(n_bins + 1, dtype=np.int64)  # slack left before bin b
    slack[0] = n_bins * capacity - total
    level = 0
    opening = True
    while True:
        if opening:  # open bin `level` with the largest item left and list its sets
            opening = False
            j0 = 0
            while j0 < nv and cnt[j0] == 0:
                j0 += 1
            if j0 == nv:
                break  # every item is placed
            if level < n_bins:
                rest = 0
                for k in range(j0, nv):
                    rest += cnt[k] * vals[k]
                cnt[j0] -= 1
                largest[level] = j0
                lo[level] = top
                ok, pool, top = _sets(
                    vals, cnt, j0, capacity - vals[j0], rest - vals[j0], slack[level], pool, top, state
                )
                if not ok:
                    return 2, bin_of
                _by_waste(pool, lo[level], top, nv)  # least waste first
                hi[level] = top
                pos[level] = lo[level]
            else:
                level -= 1  # items left but no bin: back to the last bin's next set
                if level < 0:
                    return 1, bin_of
        if pos[level] > lo[level]:  # undo the set bin `level` holds (none in a bin just opened)
            for k in range(nv):
                cnt[k] += pool[pos[level] - 1, k]
        state[0] += 2 * nv  # one set undone, the next applied
        if state[0] > state[1]:
            return 2, bin_of
        if pos[level] < hi[level]:
            row = pos[level]
            pos[level] += 1
            for k in range(nv):
                cnt[k] -= pool[row, k]
            slack[level + 1] = slack[level] - pool[row, nv]
            level += 1
            opening = True
            continue
        cnt[largest[level]] += 1  # bin `level` has no set left: close it
        top = lo[level]
        level -= 1
        if level < 0:
            return 1, bin_of
    return 0, _bin_of(pool, pos, largest, level, start, n)


@helper
def _sets(
    vals: np.ndarray,
    cnt: np.ndarray,
    j0: int,
    room0: int,
    avail0: int,
    slack: int,
    pool: np.ndarray,
    top: int,
    state: np.ndarray,
) -> tuple[bool, np.ndarray, int]:
    """Append to ``pool[top:]`` (grown as needed) every undominated set of the items ``cnt``
    counts (sizes ``vals[j0:]``, ``avail0`` tokens) that fits ``room0`` and wastes at most
    ``slack``: a row of counts, the last column its waste. Returns ``(ok, pool, top)``; ok is
    False when the work or the pool's room ran out.

    Bounds: the per-depth state has ``nv + 1`` entries (depth ``j + 1`` written only while
    ``j + 1 < nv``); the pool is doubled whenever ``top`` reaches its rows."""
    nv = vals.shape[0]
    cap1 = room0 + vals[j0] + 1  # above any room: "no constraint yet"
    room = np.empty(nv + 1, dtype=np.int64)  # per depth j: the state before choosing at j
    avail = np.empty(nv + 1, dtype=np.int64)
    min_out = np.empty(nv + 1, dtype=np.int64)  # smallest size left out above j
    need = np.empty(nv + 1, dtype=np.int64)  # the bin must end with less room than this
    choice = np.zeros(nv, dtype=np.int64)
    cur = np.zeros(nv, dtype=np.int64)
    room[j0], avail[j0], min_out[j0], need[j0] = room0, avail0, cap1, cap1
    j = j0
    enter = True
    while True:
        state[0] += 1
        if state[0] > state[1]:
            return False, pool, top
        if enter:
            enter = False
            if room[j] - avail[j] > slack:  # every item left cannot bring the waste within the slack
                j -= 1
                if j < j0:
                    return True, pool, top
                continue
            choice[j] = min(cnt[j], room[j] // vals[j]) + 1
        choice[j] -= 1
        if choice[j] < 0:
            j -= 1
            if j < j0:
                return True, pool, top
            continue
        c, v, here = choice[j], vals[j], cnt[j]
        cur[j] = c
        out_v = v if c < here else min_out[j]  # a copy of v left out: the bin must end below v
        new_need = min(need[j], v) if c < here else need[j]
        if c > 0 and min_out[j] - v < new_need:
            new_need = min_out[j] - v  # the smallest size left out above v must not fit in v's place
        r = room[j] - c * v
        if j + 1 == nv:
            if r < new_need and r <= slack:
                if top == pool.shape[0]:
                    if pool.size >= _POOL_LIMIT:
                        return False, pool, top
                    grown = np.empty((2 * pool.shape[0], pool.shape[1]), dtype=np.int64)
                    for t in range(top):  # loops, not slice assignment: its shape checks compile for seconds
                        for k in range(nv + 1):
                            grown[t, k] = pool[t, k]
                    pool = grown
                for k in range(nv):
                    pool[top, k] = cur[k]
                pool[top, nv] = r
                top += 1
                state[0] += nv  # copying the row
            continue
        room[j + 1], avail[j + 1], min_out[j + 1], need[j + 1] = r, avail[j] - here * v, out_v, new_need
        j += 1
        enter = True


@helper
def _by_waste(pool: np.ndarray, lo: int, hi: int, nv: int) -> None:
    """Sort the rows ``pool[lo:hi]`` stably by their waste (column ``nv``)."""
    m = hi - lo
    order = np.empty(m, dtype=np.int64)
    buf = np.empty(m, dtype=np.int64)
    for r in range(m):
        order[r] = r
    width = 1
    while width < m:
        for a in range(0, m, 2 * width):
            mid, b = min(a + width, m), min(a + 2 * width, m)
            i, j = a, mid
            for t in range(a, b):
                if j >= b or (i < mid and pool[lo + order[i], nv] <= pool[lo + order[j], nv]):
                    buf[t] = order[i]
                    i += 1
                else:
                    buf[t] = order[j]
                    j += 1
        order, buf = buf, order
        width *= 2
    rows = np.empty((m, nv + 1), dtype=np.int64)
    for r in range(m):
        for c in range(nv + 1):
            rows[r, c] = pool[lo + order[r], c]
    for r in range(m):
        for c in range(nv + 1):
            pool[lo + r, c] = rows[r, c]


@helper
def _bin_of(pool: np.ndarray, pos: np.ndarray, largest: np.ndarray, bins: int, start: np.ndarray, n: int) -> np.ndarray:
    """Each item's bin: bin ``b`` holds the set ``pool[pos[b] - 1]`` and one item of size
    index ``largest[b]``; the items of size index ``k`` start at ``start[k]``."""
    bin_of = np.full(n, -1, dtype=np.int64)
    nxt = start.copy()  # the next unassigned item of each size
    for b in range(bins):
        row = pos[b] - 1
        for k in range(start.shape[0]):
            for _ in range(pool[row, k] + (k == largest[b])):
                bin_of[nxt[k]] = b
                nxt[k] += 1
    return bin_of
