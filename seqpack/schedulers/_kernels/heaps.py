"""Binary and 4-ary heaps of bins and replicas the kernels share (ties by index, never by chance)."""

from __future__ import annotations

from seqpack.schedulers._kernels._types import FloatArray, IntArray
from seqpack.schedulers._kernels.jit import njit


@njit(cache=True)
def _before(key: FloatArray, tok: IntArray, a: int, b: int) -> bool:
    """Heap order of bins: smaller key, then fewer tokens, then lower index."""
    if key[a] != key[b]:
        return key[a] < key[b]
    if tok[a] != tok[b]:
        return tok[a] < tok[b]
    return a < b


@njit(cache=True)
def _sift_down(heap: IntArray, size: int, i: int, key: FloatArray, tok: IntArray) -> None:
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
def _park_push(park: IntArray, size: int, b: int, room: IntArray) -> int:
    """Push bin ``b`` on a max-heap of bins by free room (ties: lower index). Writes
    ``park[size]``: the caller keeps ``size < len(park)``."""
    i = size
    park[i] = b
    while i > 0:
        parent = (i - 1) // 2
        a, q = park[i], park[parent]
        if room[a] > room[q] or (room[a] == room[q] and a < q):
            park[i], park[parent] = q, a
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _park_pop(park: IntArray, size: int, room: IntArray) -> tuple[int, int]:
    top = park[0]
    size -= 1
    park[0] = park[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        right = left + 1
        if right < size and (
            room[park[right]] > room[park[left]] or (room[park[right]] == room[park[left]] and park[right] < park[left])
        ):
            child = right
        a, c = park[i], park[child]
        if room[c] > room[a] or (room[c] == room[a] and c < a):
            park[i], park[child] = c, a
            i = child
        else:
            break
    return top, size


@njit(cache=True)
def _entry_before(ka: float, ta: int, ba: int, kb: float, tb: int, bb: int) -> bool:
    """Order of heap entries (key, tokens, bin): smaller key, then fewer tokens, then bin."""
    if ka != kb:
        return ka < kb
    if ta != tb:
        return ta < tb
    return ba < bb


@njit(cache=True)
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


@njit(cache=True)
def _entry_up(hk: FloatArray, ht: IntArray, hb: IntArray, i: int) -> None:
    """Sift entry ``i`` up the 4-ary heap ``(hk, ht, hb)``."""
    k, t, b = hk[i], ht[i], hb[i]
    while i > 0:
        parent = (i - 1) // 4
        if _entry_before(k, t, b, hk[parent], ht[parent], hb[parent]):
            hk[i], ht[i], hb[i] = hk[parent], ht[parent], hb[parent]
            i = parent
        else:
            break
    hk[i], ht[i], hb[i] = k, t, b


@njit(cache=True)
def _total_before(total: FloatArray, a: int, b: int, sign: float) -> bool:
    """Heap order of replicas: smaller ``sign * total``, then lower index."""
    x, y = sign * total[a], sign * total[b]
    if x != y:
        return x < y
    return a < b


@njit(cache=True)
def _total_down(heap: IntArray, pos: IntArray, size: int, i: int, total: FloatArray, sign: float) -> None:
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        right = child + 1
        if right < size and _total_before(total, heap[right], heap[child], sign):
            child = right
        a, c = heap[i], heap[child]
        if _total_before(total, c, a, sign):
            heap[i], heap[child] = c, a
            pos[c], pos[a] = i, child
            i = child
        else:
            return


@njit(cache=True)
def _total_up(heap: IntArray, pos: IntArray, i: int, total: FloatArray, sign: float) -> None:
    while i > 0:
        parent = (i - 1) // 2
        a, q = heap[i], heap[parent]
        if _total_before(total, a, q, sign):
            heap[i], heap[parent] = q, a
            pos[q], pos[a] = i, parent
            i = parent
        else:
            return


@njit(cache=True, inline="always")
def _lightest_into(heap: IntArray, size: int, total: FloatArray, out: IntArray, frontier: IntArray) -> None:
    """The ``len(out)`` smallest totals of a min-heap, in order (ties: lower index), by a
    best-first walk from the root: ``O(k**2)`` for ``k`` of them, whatever the heap size.
    ``frontier`` is scratch for ``2 * len(out) + 1`` heap positions still to visit: nothing
    is allocated. Bounds: the walk holds at most ``t + 1`` positions after ``t`` steps (each
    takes one and adds at most two), so ``len(out) + 1`` suffice; ``len(out)`` must not
    exceed ``size`` (the frontier would run dry and repeat a stale position)."""
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
