"""numba kernels of the dynamic-CP planner (docs/dynamic_cp.md), each checked against its twin
in ``tests/schedulers/dynamic_cp_reference.py``. ``coef`` is :meth:`CostModel.group_coefficients`;
ties are broken by indices, never by chance."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._jit import helper, njit


@helper
def padded(length: int, size: int, pad_multiple: int) -> int:
    """Padded length of a sequence in a group of ``size`` ranks (padding.py's rule)."""
    multiple = 2 * size * pad_multiple if size > 1 else pad_multiple
    return -(-length // multiple) * multiple


@helper
def ring_per_token(size: int, spans: bool, coef: np.ndarray) -> float:
    """Ring cost of one more token in a group of ``size`` ranks (0 alone)."""
    return (size - 1) * (coef[5] if spans else coef[4]) / size if size > 1 else 0.0


@helper
def pack_time(size: int, s: float, ss: float, spans: bool, coef: np.ndarray) -> float:
    """Cost of a microbatch of padded sums ``s``, ``ss`` on a group of ``size`` ranks."""
    t = coef[0] + (coef[1] * s + coef[2] * ss) / size
    if size > 1:
        t += (size - 1) * coef[3] + ring_per_token(size, spans, coef) * s
    return t


@njit(cache=True)
def choose_sizes(
    lengths: np.ndarray,
    sizes: np.ndarray,
    coef: np.ndarray,
    ranks_per_node: int,
    capacity: int,
    pad_multiple: int,
    height: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's group size and its time alone: the smallest of ``sizes`` that holds it
    and runs it within ``height``, else the fastest that holds it (ties: smaller), else -1.
    Bounds: both outputs have one entry per sequence."""
    n = lengths.shape[0]
    size_of, time_of = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.float64)
    for i in range(n):
        for k in range(sizes.shape[0]):
            c = sizes[k]
            p = padded(lengths[i], c, pad_multiple)
            if p > c * capacity:
                continue
            t = pack_time(c, float(p), float(p) * float(p), c > ranks_per_node, coef)
            if t <= height:
                size_of[i], time_of[i] = c, t
                break
            if size_of[i] < 0 or t < time_of[i]:
                size_of[i], time_of[i] = c, t
    return size_of, time_of


@njit(cache=True)
def shelf(widths: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray, int]:
    """First fit of blocks of ``widths``, in order, into rounds of ``num_ranks``: (round of each
    block, ranks used per round, rounds). Bounds: a round opens only for a block (``used``
    holds ``max(n, 1)``)."""
    n = widths.shape[0]
    round_of = np.empty(n, dtype=np.int64)
    used = np.zeros(max(n, 1), dtype=np.int64)
    rounds = 0
    for i in range(n):
        m = 0
        while m < rounds and used[m] + widths[i] > num_ranks:
            m += 1
        rounds = max(rounds, m + 1)
        round_of[i] = m
        used[m] += widths[i]
    return round_of, used[:rounds], rounds


@helper
def _before(a: int, b: int, first: np.ndarray, second: np.ndarray) -> bool:
    """Heap order: larger ``first``, then smaller ``second``, then lower index."""
    if first[a] != first[b]:
        return first[a] > first[b]
    if second[a] != second[b]:
        return second[a] < second[b]
    return a < b


@helper
def _push(heap: np.ndarray, size: int, b: int, first: np.ndarray, second: np.ndarray) -> int:
    i = size
    heap[i] = b
    while i > 0:
        parent = (i - 1) // 2
        if not _before(heap[i], heap[parent], first, second):
            break
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent
    return size + 1


@helper
def _pop(heap: np.ndarray, size: int, first: np.ndarray, second: np.ndarray) -> tuple[int, int]:
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _before(heap[child + 1], heap[child], first, second):
            child += 1
        if not _before(heap[child], heap[i], first, second):
            break
        heap[i], heap[child] = heap[child], heap[i]
        i = child
    return top, size


@njit(cache=True)
def lpt(
    lengths: np.ndarray,
    bin_size: np.ndarray,
    bin_room: np.ndarray,
    bin_load: np.ndarray,
    bin_floor: np.ndarray,
    bin_tokens: np.ndarray,
    bin_s: np.ndarray,
    bin_ss: np.ndarray,
    coef: np.ndarray,
    ranks_per_node: int,
    pad_multiple: int,
) -> tuple[bool, np.ndarray]:
    """The fill (docs/dynamic_cp.md, step 3): each sequence, longest first, into the bin with
    room furthest below its floor (ties: fewer tokens, lower index); updates the bins. Returns
    (every sequence placed, bin of each or -1). Bounds: ``main`` and ``park`` have one entry
    per bin and together hold each bin at most once. Requires the sequences longest first."""
    n, nb = lengths.shape[0], bin_size.shape[0]
    bin_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return True, bin_of
    smallest = padded(lengths[n - 1], 1, pad_multiple)
    key = bin_floor - bin_load
    main, park = np.empty(nb, np.int64), np.empty(nb, np.int64)
    in_main, in_park = 0, 0
    for b in range(nb):
        if bin_room[b] >= smallest:
            in_main = _push(main, in_main, b, key, bin_tokens)
    for j in range(n):
        fits_alone = padded(lengths[j], 1, pad_multiple)
        while in_park > 0 and bin_room[park[0]] >= fits_alone:
            b, in_park = _pop(park, in_park, bin_room, bin_room)
            in_main = _push(main, in_main, b, key, bin_tokens)
        while in_main > 0 and bin_of[j] < 0:
            b, in_main = _pop(main, in_main, key, bin_tokens)
            p = padded(lengths[j], bin_size[b], pad_multiple)
            if p <= bin_room[b]:
                c, fp = bin_size[b], float(p)
                bin_load[b] += (coef[1] * fp + coef[2] * fp * fp) / c + ring_per_token(c, c > ranks_per_node, coef) * fp
                bin_s[b] += fp
                bin_ss[b] += fp * fp
                bin_room[b] -= p
                bin_tokens[b] += p
                key[b] = bin_floor[b] - bin_load[b]
                bin_of[j] = b
                if bin_room[b] >= smallest:
                    in_main = _push(main, in_main, b, key, bin_tokens)
            elif bin_room[b] >= smallest:
                in_park = _push(park, in_park, b, bin_room, bin_room)
        if bin_of[j] < 0:
            return False, bin_of
    return True, bin_of


@njit(cache=True)
def layout(order: np.ndarray, bin_round: np.ndarray, bin_size: np.ndarray) -> np.ndarray:
    """First rank of every bin: the bins of a round, in ``order`` (sorted by round), laid
    left to right. Bounds: ``start`` has one entry per bin; ``order`` lists bin indices."""
    start = np.empty(bin_size.shape[0], dtype=np.int64)
    cursor, current = 0, -1
    for b in order:
        if bin_round[b] != current:
            current, cursor = bin_round[b], 0
        start[b] = cursor
        cursor += bin_size[b]
    return start


@njit(cache=True)
def bin_times(
    bin_size: np.ndarray,
    bin_start: np.ndarray,
    bin_count: np.ndarray,
    bin_s: np.ndarray,
    bin_ss: np.ndarray,
    coef: np.ndarray,
    ranks_per_node: int,
) -> np.ndarray:
    """Each bin's microbatch cost on its block (``constant`` without sequences: a padding filler)."""
    nb = bin_size.shape[0]
    out = np.empty(nb, dtype=np.float64)
    for b in range(nb):
        c = bin_size[b]
        spans = bin_start[b] // ranks_per_node != (bin_start[b] + c - 1) // ranks_per_node
        out[b] = pack_time(c, bin_s[b], bin_ss[b], spans, coef) if bin_count[b] > 0 else coef[0]
    return out


@njit(cache=True)
def replica_finish(
    order: np.ndarray, bin_start: np.ndarray, bin_size: np.ndarray, times: np.ndarray, num_ranks: int
) -> float:
    """The last rank's finish time when every group, in ``order`` (by run round), starts once
    all its ranks are free. Bounds: ``finish`` has one entry per rank; requires ``start +
    size <= num_ranks`` (as the layouts lay them)."""
    finish = np.zeros(num_ranks, dtype=np.float64)
    for b in order:
        lo, hi = bin_start[b], bin_start[b] + bin_size[b]
        ready = 0.0
        for r in range(lo, hi):
            ready = max(ready, finish[r])
        for r in range(lo, hi):
            finish[r] = ready + times[b]
    last = 0.0  # loops, not .max(): numpy's reductions compile for a second
    for r in range(num_ranks):
        last = max(last, finish[r]) if r else finish[r]
    return last


@njit(cache=True)
def widen(
    round_of: np.ndarray,
    size_of: np.ndarray,
    time_of: np.ndarray,
    lengths: np.ndarray,
    used: np.ndarray,
    sizes: np.ndarray,
    coef: np.ndarray,
    ranks_per_node: int,
    capacity: int,
    pad_multiple: int,
    num_ranks: int,
) -> None:
    """Widening (docs/dynamic_cp.md, step 2); updates ``size_of``, ``time_of`` and ``used``.
    Bounds: requires every round of ``used`` to hold a sequence (as :func:`shelf` opens them),
    so the tallest ``top`` is a sequence index, not -1."""
    n = round_of.shape[0]
    for m in range(used.shape[0]):
        while used[m] < num_ranks:
            top = -1
            for i in range(n):
                if round_of[i] == m and (top < 0 or time_of[i] > time_of[top]):
                    top = i
            for k in range(sizes.shape[0]):
                c = sizes[k]
                if c <= size_of[top] or c - size_of[top] > num_ranks - used[m]:
                    continue
                p = padded(lengths[top], c, pad_multiple)
                t = pack_time(c, float(p), float(p) * float(p), c > ranks_per_node, coef)
                if p <= c * capacity and t < time_of[top]:
                    used[m] += c - size_of[top]
                    size_of[top], time_of[top] = c, t
                    break
            else:  # the tallest cannot grow
                break


@helper
def _round_in_nodes(
    members: np.ndarray, count: int, bin_size: np.ndarray, start: np.ndarray, ranks_per_node: int, num_ranks: int
) -> bool:
    """Lay out one round's bins (``members[:count]``, largest first): a node or more left to
    right, smaller first-fit into the nodes' free ranks, single ranks in the gaps; False when
    a small bin finds no node with room. Bounds: ``taken`` has one entry per rank, ``fill``
    one per node; requires the round's widths to sum to at most ``num_ranks`` (so the singles
    find free ranks below it)."""
    taken = np.zeros(num_ranks, dtype=np.bool_)
    nodes = -(-num_ranks // ranks_per_node)
    fill = np.zeros(nodes, dtype=np.int64)  # ranks used from the left of each node
    cursor = 0
    for k in range(count):
        b = members[k]
        c = bin_size[b]
        if c == 1:  # single ranks (a node's worth when ranks_per_node is 1) wait for the gaps
            break
        if c >= ranks_per_node:
            start[b] = cursor
            taken[cursor : cursor + c] = True
            cursor += c
            continue
        for node in range(cursor // ranks_per_node, nodes):
            lo = max(node * ranks_per_node, cursor) + fill[node]
            if lo + c <= min((node + 1) * ranks_per_node, num_ranks):
                start[b] = lo
                taken[lo : lo + c] = True
                fill[node] = lo + c - max(node * ranks_per_node, cursor)
                break
        else:  # no node has room
            return False
    r = 0
    for k in range(count):
        b = members[k]
        if bin_size[b] == 1:
            while taken[r]:
                r += 1
            start[b] = r
            taken[r] = True
    return True


@njit(cache=True)
def layout_in_nodes(
    order: np.ndarray, bin_round: np.ndarray, bin_size: np.ndarray, ranks_per_node: int, num_ranks: int
) -> np.ndarray:
    """:func:`layout` keeping groups smaller than a node inside one when a round allows
    (``order`` by round, then size descending). Bounds: as :func:`_round_in_nodes`."""
    start = layout(order, bin_round, bin_size)
    members = np.empty(order.shape[0], dtype=np.int64)
    k = 0
    while k < order.shape[0]:
        count = 0
        while k + count < order.shape[0] and bin_round[order[k + count]] == bin_round[order[k]]:
            members[count] = order[k + count]
            count += 1
        trial = start.copy()
        if _round_in_nodes(members, count, bin_size, trial, ranks_per_node, num_ranks):
            for j in range(count):
                start[members[j]] = trial[members[j]]
        k += count
    return start


@njit(cache=True)
def place_blocks(
    widths: np.ndarray, times: np.ndarray, num_ranks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Groups, in order, each onto the least busy aligned block of its width: (first rank and
    round of each group, busy time and group rounds of every rank). Bounds: ``load`` and
    ``depth`` have one entry per rank; requires every width at most ``num_ranks``."""
    load, depth = np.zeros(num_ranks, dtype=np.float64), np.zeros(num_ranks, dtype=np.int64)
    start, rounds = np.empty(widths.shape[0], dtype=np.int64), np.empty(widths.shape[0], dtype=np.int64)
    for i in range(widths.shape[0]):
        c = widths[i]
        best, best_load = 0, np.inf
        for lo in range(0, num_ranks - c + 1, c):
            busy = load[lo]  # loops, not .max(): numpy's reductions compile for a second
            for r in range(lo + 1, lo + c):
                busy = max(busy, load[r])
            if busy < best_load:
                best, best_load = lo, busy
        deepest = depth[best]
        for r in range(best + 1, best + c):
            deepest = max(deepest, depth[r])
        start[i], rounds[i] = best, deepest
        load[best : best + c] = best_load + times[i]
        depth[best : best + c] = rounds[i] + 1
    return start, rounds, load, depth


@njit(cache=True)
def lpt_ranks(
    lengths: np.ndarray, load: np.ndarray, capacity: int, pad_multiple: int, coef: np.ndarray, depth: int
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """Each sequence, longest first, onto the least busy rank that holds it in one of its
    ``depth`` microbatches; updates ``load``. Returns (every sequence placed, rank and slot of
    each, microbatches per rank). Bounds: ``room`` is ``ranks x depth``, read below
    ``count[b] <= depth``; ``heap`` and ``park`` hold each rank at most once."""
    ranks, n = load.shape[0], lengths.shape[0]
    room = np.full((ranks, depth), capacity, dtype=np.int64)
    count = np.zeros(ranks, dtype=np.int64)
    free = np.full(ranks, capacity, dtype=np.int64)
    rank_of, slot_of = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    heap, park = np.empty(ranks, np.int64), np.empty(ranks, np.int64)
    size, parked = 0, 0
    neg = -load  # the heap puts the larger first: the least busy rank comes first
    for b in range(ranks):
        size = _push(heap, size, b, neg, neg)
    smallest = padded(lengths[n - 1], 1, pad_multiple) if n else 0
    for j in range(n):
        p = padded(lengths[j], 1, pad_multiple)
        while parked > 0 and free[park[0]] >= p:
            b, parked = _pop(park, parked, free, free)
            size = _push(heap, size, b, neg, neg)
        best, best_slot, best_t = -1, -1, np.inf
        while best < 0 and size > 0:
            b, size = _pop(heap, size, neg, neg)
            k = 0  # first fit into its microbatches, else a new one, which costs ``constant``
            while k < count[b] and room[b, k] < p:
                k += 1
            if k < depth:
                fp = float(p)
                best, best_slot, best_t = b, k, load[b] + (coef[1] * fp + coef[2] * fp * fp)
                if k == count[b]:
                    best_t += coef[0]
            elif free[b] >= smallest:
                parked = _push(park, parked, b, free, free)
        if best < 0:
            return False, rank_of, slot_of, count
        count[best] = max(count[best], best_slot + 1)
        room[best, best_slot] -= p
        load[best], neg[best] = best_t, -best_t
        free[best] = capacity if count[best] < depth else 0  # the longest sequence it can still take
        if count[best] == depth:
            for slot in range(depth):
                free[best] = max(free[best], room[best, slot])
        rank_of[j], slot_of[j] = best, best_slot
        size = _push(heap, size, best, neg, neg)
    return True, rank_of, slot_of, count
