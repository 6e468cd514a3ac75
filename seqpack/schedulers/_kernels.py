"""numba kernels behind the schedulers. Private: the public functions in ``balanced.py`` and
``dp_balanced.py`` validate and coerce their inputs (contiguous int64 / float64 arrays) and
call these. Every kernel has a slow, obvious twin in ``tests/schedulers/`` it is checked
against.

Ties are broken by integer keys (token counts, then indices), never by chance, so every
rank computes the same result.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Bin-choice rules of grid_lpt.
MODE_COST = 0  # most under its cost target (LPT with per-bin targets)
MODE_TOKENS = 1  # fewest tokens (worst-fit decreasing on tokens)
MODE_FIRST_FIT = 2  # lowest index with room (first-fit decreasing)
GRID_LOCAL_SLICES = 8  # grid_local alternates home and LPT passes over 8 length classes
PAIR_BIN = 16  # home_swaps pairs sequences of bins holding at most this many


@njit(cache=True)
def _before(key, tok, a, b):
    """Heap order of bins: smaller key, then fewer tokens, then lower index."""
    if key[a] != key[b]:
        return key[a] < key[b]
    if tok[a] != tok[b]:
        return tok[a] < tok[b]
    return a < b


@njit(cache=True)
def _sift_down(heap, size, i, key, tok):
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
def _park_push(park, size, b, room):
    """Push bin ``b`` on a max-heap of bins by free room (ties: lower index)."""
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
def _park_pop(park, size, room):
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
def _entry_before(ka, ta, ba, kb, tb, bb):
    """Order of heap entries (key, tokens, bin): smaller key, then fewer tokens, then bin."""
    if ka != kb:
        return ka < kb
    if ta != tb:
        return ta < tb
    return ba < bb


@njit(cache=True)
def _entry_down(hk, ht, hb, size, i):
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
def _entry_up(hk, ht, hb, i):
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


def grid_lpt(order, lengths, costs, targets, capacity, mode):
    """Place items, in ``order``, each into the best bin that has room.

    ``mode`` picks "best": MODE_COST the bin with the smallest ``load - target`` (LPT when
    all targets are equal), MODE_TOKENS the bin with the fewest tokens, MODE_FIRST_FIT the
    lowest-indexed bin. Ties: fewer tokens, then lower index. A bin's tokens never exceed
    ``capacity``. Items must come longest first (``order``), so a bin too full for one item
    is parked until the items get short enough for it.

    The kernel reads items in placement order from arrays gathered here: read through
    ``order``, every item would be a cache miss (half of the time at a million items).

    Returns:
        (ok, bin_of[n], load[bins], tokens[bins]); ``ok`` is False when some item found no
        bin with room (the other outputs are then partial).
    """
    n_bins = targets.shape[0]
    ok, bin_of_placed, load, tok = _grid_lpt_sorted(
        lengths[order], costs[order], targets, capacity, mode, np.zeros(n_bins), np.zeros(n_bins, dtype=np.int64)
    )
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    bin_of[order] = bin_of_placed
    return ok, bin_of, load, tok


@njit(cache=True)
def _grid_lpt_sorted(lengths, costs, targets, capacity, mode, load, tok):
    """:func:`grid_lpt` on items already in placement order; ``bin_of`` in that order.
    Bins start with ``load`` and ``tok`` (updated in place)."""
    n_bins = targets.shape[0]
    n = lengths.shape[0]
    key = np.empty(n_bins, dtype=np.float64)
    room = np.empty(n_bins, dtype=np.int64)
    bin_of = np.full(n, -1, dtype=np.int64)
    for b in range(n_bins):
        room[b] = capacity - tok[b]
        if mode == MODE_COST:
            key[b] = load[b] - targets[b]
        elif mode == MODE_TOKENS:
            key[b] = float(tok[b])
        else:
            key[b] = float(b)
    # A 4-ary heap whose entries carry their (key, tokens, bin): a sift reads four siblings
    # from one or two cache lines instead of chasing bin indices (25% faster at 4M items).
    hk = key.copy()
    ht = tok.copy()
    hb = np.arange(n_bins, dtype=np.int64)
    size = n_bins
    for i in range((size - 2) // 4, -1, -1):
        _entry_down(hk, ht, hb, size, i)
    park = np.empty(n_bins, dtype=np.int64)
    parked = 0
    min_len = capacity
    for j in range(n):
        if lengths[j] < min_len:
            min_len = lengths[j]
    for j in range(n):
        p = lengths[j]
        # Parked bins with room for this item come back.
        while parked > 0 and room[park[0]] >= p:
            b, parked = _park_pop(park, parked, room)
            hk[size], ht[size], hb[size] = key[b], tok[b], b
            _entry_up(hk, ht, hb, size)
            size += 1
        placed = -1
        while size > 0:
            b = hb[0]
            if room[b] >= p:
                placed = b
                break
            size -= 1
            hk[0], ht[0], hb[0] = hk[size], ht[size], hb[size]
            _entry_down(hk, ht, hb, size, 0)
            if room[b] >= min_len:  # else no item ever fits again: retired
                parked = _park_push(park, parked, b, room)
        if placed < 0:
            return False, bin_of, load, tok
        bin_of[j] = placed
        load[placed] += costs[j]
        tok[placed] += p
        room[placed] -= p
        if mode == MODE_COST:
            key[placed] = load[placed] - targets[placed]
        elif mode == MODE_TOKENS:
            key[placed] = float(tok[placed])
        if room[placed] < min_len:
            size -= 1
            hk[0], ht[0], hb[0] = hk[size], ht[size], hb[size]
        else:
            hk[0], ht[0] = key[placed], tok[placed]
        _entry_down(hk, ht, hb, size, 0)
    return True, bin_of, load, tok


def grid_local(order, lengths, values, targets, home_fill, token_share, capacity, origin, dp_size):
    """:func:`grid_lpt` that first lets every rank keep what fits into its own share.

    Bin ``b`` belongs to replica ``b % dp_size`` (round ``b // dp_size``); ``key = load -
    target`` with ``load`` the sum of the bin's ``values`` (costs, or tokens).

    ``order`` (longest first) is cut into :data:`GRID_LOCAL_SLICES` consecutive slices of
    equal count; for each slice in turn:

    1. Home: each item, in order, goes to its own replica's best bin (smallest (key,
       tokens, round)) if that keeps the bin within ``home_fill`` times its target and
       within ``token_share`` tokens (a rank of short, cheap-per-token sequences must leave
       room for the cost its microbatches still lack); else it waits.
    2. The slice's waiting items, in order, go to the best bin anywhere that has room, as
       :func:`grid_lpt` in ``MODE_COST`` does, starting from the current loads.

    Home placements never push a bin over its target and the LPT passes even out the rest,
    so the bins end about as even as LPT leaves them while each rank keeps most of its own.
    Slices keep the LPT passes close to longest first, which tight packings need (one home
    pass over everything leaves no room for the long items that wait). The home pass is
    independent per rank, so it runs rank by rank (cache friendly).

    Returns:
        (ok, bin_of[n], home[n]): ``home`` marks items placed by the home pass; ``ok`` is
        False when some waiting item found no bin with room.
    """
    n = order.shape[0]
    n_bins = targets.shape[0]
    rounds = n_bins // max(dp_size, 1)
    origin_placed = origin[order]
    lengths_placed = lengths[order]
    values_placed = values[order]
    share = min(int(token_share), int(capacity))
    load = np.zeros(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    placed = np.full(n, -1, dtype=np.int64)
    home = np.zeros(n, dtype=np.bool_)
    ok = True
    for lo, hi in _slices(n, GRID_LOCAL_SLICES):
        # This slice's positions grouped by rank, in placement order within a rank.
        origin_slice = origin_placed[lo:hi]
        count = hi - lo
        if dp_size * count < 2**62:
            by_rank = lo + np.argsort(origin_slice * count + np.arange(count, dtype=np.int64))
        else:
            by_rank = lo + np.argsort(origin_slice, kind="stable")
        _home_pass(
            by_rank,
            lengths_placed,
            values_placed,
            origin_placed,
            targets,
            float(home_fill),
            share,
            dp_size,
            rounds,
            placed,
            load,
            tok,
        )
        wait = lo + np.flatnonzero(placed[lo:hi] < 0)
        ok, waiting_bin, _, _ = _grid_lpt_sorted(
            lengths_placed[wait], values_placed[wait], targets, capacity, MODE_COST, load, tok
        )
        home[lo:hi] = placed[lo:hi] >= 0
        placed[wait] = waiting_bin
        if not ok:
            break
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    bin_of[order] = placed
    at_home = np.zeros(lengths.shape[0], dtype=np.bool_)
    at_home[order] = home
    return ok, bin_of, at_home


def _slices(n, count):
    """``count`` consecutive (start, end) ranges covering ``0..n`` (empty ones left out)."""
    bounds = [(n * k) // count for k in range(count + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


@njit(cache=True)
def _home_pass(by_rank, lengths, values, origin, targets, fill, share, dp, rounds, placed, load, tok):
    """Step 1 of :func:`grid_local` for the items ``by_rank`` (grouped by rank): sets
    ``placed`` (bin, or -1 to wait) and updates ``load`` and ``tok`` of the bins."""
    n = by_rank.shape[0]
    # One replica at a time: its rounds in a small heap of (key, tokens, round).
    key = np.empty(rounds, dtype=np.float64)
    own_tok = np.zeros(rounds, dtype=np.int64)
    heap = np.empty(rounds, dtype=np.int64)
    k = 0
    while k < n:
        d = origin[by_rank[k]]
        for m in range(rounds):
            b = m * dp + d
            key[m] = load[b] - targets[b]
            own_tok[m] = tok[b]
            heap[m] = m
        for i in range(rounds // 2 - 1, -1, -1):
            _sift_down(heap, rounds, i, key, own_tok)
        while k < n and origin[by_rank[k]] == d:
            j = by_rank[k]
            k += 1
            m = heap[0]
            b = m * dp + d
            if own_tok[m] + lengths[j] <= share and load[b] + values[j] <= fill * targets[b]:
                placed[j] = b
                load[b] += values[j]
                own_tok[m] += lengths[j]
                key[m] = load[b] - targets[b]
                _sift_down(heap, rounds, 0, key, own_tok)
        for m in range(rounds):
            tok[m * dp + d] = own_tok[m]


@njit(cache=True, inline="always")
def _cache_set(q, y, origin, lengths, costs, round_of, cache_y, cache_o, cache_t, cache_c, cache_m):
    """Entry ``q`` of the cache: sequence ``y``, its home, tokens, cost and round."""
    cache_y[q], cache_o[q], cache_t[q], cache_c[q], cache_m[q] = y, origin[y], lengths[y], costs[y], round_of[y]


@njit(cache=True, inline="always")
def _returned(t, o, here, home):
    """Tokens a sequence (``t`` tokens, home ``o``) sent from ``home`` to ``here`` brings
    home (``t`` if ``here`` is its home), or takes away (``-t`` if ``home`` was)."""
    if o == here:
        return t
    if o == home:
        return -t
    return 0


@njit(cache=True, inline="always")
def _fits(a, ra, b, m, cx, tx, cy, ty, here, home, load, tok, total, round_cap, capacity, replica_cap):
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


@njit(cache=True)
def _cache_drop(k, at, cache_y, cache_o, cache_t, cache_c, cache_m):
    """Remove entry ``at`` of the first ``k`` entries."""
    for q in range(at, k - 1):
        cache_y[q], cache_o[q], cache_t[q] = cache_y[q + 1], cache_o[q + 1], cache_t[q + 1]
        cache_c[q], cache_m[q] = cache_c[q + 1], cache_m[q + 1]


@njit(cache=True)
def _cache_swap(p, q, cache_y, cache_o, cache_t, cache_c, cache_m):
    """Exchange entries ``p`` and ``q``."""
    cache_y[p], cache_y[q] = cache_y[q], cache_y[p]
    cache_o[p], cache_o[q] = cache_o[q], cache_o[p]
    cache_t[p], cache_t[q] = cache_t[q], cache_t[p]
    cache_c[p], cache_c[q] = cache_c[q], cache_c[p]
    cache_m[p], cache_m[q] = cache_m[q], cache_m[p]


@njit(cache=True)
def _turn_pairs(k, rounds, cache_y, cache_c, cache_m, seg, by_round, pair_c, pair_y, pair_m):
    """The pairs of a home's turn (:func:`home_swaps`): every two sequences of the cache's
    first ``k`` entries that share a round holding at most ``PAIR_BIN`` of them, sorted by
    summed cost. Returns their number."""
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
    by_cost = np.argsort(pair_c[:n_pairs])
    pair_c[:n_pairs] = pair_c[:n_pairs][by_cost]
    pair_y[:n_pairs] = pair_y[:n_pairs][by_cost]
    pair_m[:n_pairs] = pair_m[:n_pairs][by_cost]
    return n_pairs


@njit(cache=True)
def home_swaps(
    round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, passes
):
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
    the tests).

    Returns:
        The number of changes made.
    """
    n = lengths.shape[0]
    n_bins = rounds * dp
    load = np.zeros(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    total = np.zeros(dp, dtype=np.float64)
    for i in range(n):
        b = round_of[i] * dp + replica_of[i]
        load[b] += costs[i]
        tok[b] += lengths[i]
        total[replica_of[i]] += costs[i]
    # Who is on which replica: a snapshot by replica taken at the start of each pass (a
    # counting sort), the sequences that changed replica since (skipped there), and the
    # arrivals of the pass, a list per replica (an entry counts if it is its sequence's last).
    start = np.zeros(dp + 1, dtype=np.int64)
    snap = np.empty(n, dtype=np.int64)
    changed = np.zeros(n, dtype=np.bool_)
    last_arrival = np.full(n, -1, dtype=np.int64)
    arrivals = np.full(dp, -1, dtype=np.int64)
    arrival_seq = np.empty(n + 1, dtype=np.int64)
    arrival_next = np.empty(n + 1, dtype=np.int64)
    # The sequences on the current home, by cost: index, home, tokens, cost, round.
    cache_y = np.empty(n + 1, dtype=np.int64)
    cache_o = np.empty(n + 1, dtype=np.int64)
    cache_t = np.empty(n + 1, dtype=np.int64)
    cache_c = np.empty(n + 1, dtype=np.float64)
    cache_m = np.empty(n + 1, dtype=np.int64)
    # The pairs of the current turn by summed cost: cost, the two sequences, their round.
    n_pairs_max = rounds * PAIR_BIN * (PAIR_BIN - 1) // 2
    pair_c = np.empty(n_pairs_max, dtype=np.float64)
    pair_y = np.empty((n_pairs_max, 2), dtype=np.int64)
    pair_m = np.empty(n_pairs_max, dtype=np.int64)
    seg = np.empty(rounds + 1, dtype=np.int64)
    by_round = np.empty(n + 1, dtype=np.int64)
    moved_at = np.zeros(n, dtype=np.int64)  # the change that last moved each sequence
    clock = 0
    changes = 0
    for _ in range(passes):
        start[:] = 0
        for i in range(n):
            start[replica_of[i] + 1] += 1
        for d in range(dp):
            start[d + 1] += start[d]
        fill = start[:dp].copy()
        for i in range(n):
            snap[fill[replica_of[i]]] = i
            fill[replica_of[i]] += 1
        changed[:] = False
        arrivals[:] = -1
        last_arrival[:] = -1
        n_arrivals = 0
        made = 0
        i = 0
        while i < order.shape[0]:
            home = origin[order[i]]
            j = i
            while j < order.shape[0] and origin[order[j]] == home:
                j += 1
            k = 0
            for q in range(start[home], start[home + 1]):
                y = snap[q]
                if not changed[y]:
                    _cache_set(k, y, origin, lengths, costs, round_of, cache_y, cache_o, cache_t, cache_c, cache_m)
                    k += 1
            e = arrivals[home]
            while e >= 0:
                y = arrival_seq[e]
                if last_arrival[y] == e and replica_of[y] == home:
                    _cache_set(k, y, origin, lengths, costs, round_of, cache_y, cache_o, cache_t, cache_c, cache_m)
                    k += 1
                e = arrival_next[e]
            by_cost = np.argsort(cache_c[:k])
            cache_y[:k], cache_o[:k], cache_t[:k] = cache_y[by_cost], cache_o[by_cost], cache_t[by_cost]
            cache_c[:k], cache_m[:k] = cache_c[by_cost], cache_m[by_cost]
            n_pairs = _turn_pairs(k, rounds, cache_y, cache_c, cache_m, seg, by_round, pair_c, pair_y, pair_m)
            turn = clock
            for g in range(i, j):
                x = order[g]
                here = replica_of[x]
                if here == home:
                    continue
                ra = round_of[x]
                a = ra * dp + here
                cx, tx = costs[x], lengths[x]
                best, best_y, best_m = 0, -1, -1
                room = -np.inf  # the most cost any bin of home can take
                for m in range(rounds):
                    b = m * dp + home
                    room = max(room, round_cap[m] - load[b])
                    if best_m < 0 and load[b] + cx <= round_cap[m] and tok[b] + tx <= capacity:
                        if total[home] + cx <= replica_cap:
                            best, best_m = tx, m
                # Swaps need cx - room <= cy <= cx + (round_cap[ra] - load[a]), widened
                # against rounding; each candidate is then checked exactly.
                lo = cx - room
                hi = cx + (round_cap[ra] - load[a])
                lo -= 1e-9 * abs(lo) + 1e-9
                hi += 1e-9 * abs(hi) + 1e-9
                c = np.searchsorted(cache_c[:k], lo)
                while c < k and cache_c[c] <= hi:
                    ty, cy, m = cache_t[c], cache_c[c], cache_m[c]
                    gain = tx + _returned(ty, cache_o[c], here, home)
                    y = cache_y[c]
                    c += 1
                    if gain < best or (gain == best and (best_y < 0 or y > best_y)):
                        continue
                    b = m * dp + home
                    if _fits(
                        a, ra, b, m, cx, tx, cy, ty, here, home, load, tok, total, round_cap, capacity, replica_cap
                    ):
                        best, best_y, best_m = gain, y, m
                best_y2 = -1
                if best_m < 0 and n_pairs > 0:
                    c = np.searchsorted(pair_c[:n_pairs], lo)
                    while c < n_pairs and pair_c[c] <= hi:
                        y1, y2, m, cy = pair_y[c, 0], pair_y[c, 1], pair_m[c], pair_c[c]
                        c += 1
                        if moved_at[y1] > turn or moved_at[y2] > turn:
                            continue
                        gain = tx + _returned(lengths[y1], origin[y1], here, home)
                        gain += _returned(lengths[y2], origin[y2], here, home)
                        if gain < best or (gain == best and (y1 > best_y or (y1 == best_y and y2 > best_y2))):
                            continue
                        b = m * dp + home
                        ty = lengths[y1] + lengths[y2]
                        if _fits(
                            a, ra, b, m, cx, tx, cy, ty, here, home, load, tok, total, round_cap, capacity, replica_cap
                        ):
                            best, best_y, best_y2, best_m = gain, y1, y2, m
                if best_m < 0:
                    continue
                clock += 1
                moved_at[x] = clock
                b = best_m * dp + home
                load[a] -= cx
                load[b] += cx
                tok[a] -= tx
                tok[b] += tx
                total[here] -= cx
                total[home] += cx
                changed[x] = True
                round_of[x], replica_of[x] = best_m, home
                slot = -1  # x's cache entry: a returning sequence's, else a new one
                for y in (best_y, best_y2):
                    if y < 0:
                        continue
                    moved_at[y] = clock
                    load[b] -= costs[y]
                    load[a] += costs[y]
                    tok[b] -= lengths[y]
                    tok[a] += lengths[y]
                    total[home] -= costs[y]
                    total[here] += costs[y]
                    changed[y] = True
                    arrival_seq[n_arrivals], arrival_next[n_arrivals] = y, arrivals[here]
                    arrivals[here] = n_arrivals
                    last_arrival[y] = n_arrivals
                    n_arrivals += 1
                    round_of[y], replica_of[y] = ra, here
                    c = np.searchsorted(cache_c[:k], costs[y])
                    while cache_y[c] != y:
                        c += 1
                    if slot < 0:
                        slot = c
                    else:  # the pair's second: drop its entry
                        _cache_drop(k, c, cache_y, cache_o, cache_t, cache_c, cache_m)
                        k -= 1
                        slot -= slot > c
                if slot < 0:
                    slot = k
                    k += 1
                # x takes the slot, then slides to its place by cost (it costs about what it replaced).
                cache_y[slot], cache_o[slot], cache_t[slot], cache_c[slot], cache_m[slot] = x, home, tx, cx, best_m
                while slot > 0 and cache_c[slot - 1] > cx:
                    _cache_swap(slot, slot - 1, cache_y, cache_o, cache_t, cache_c, cache_m)
                    slot -= 1
                while slot + 1 < k and cache_c[slot + 1] < cx:
                    _cache_swap(slot, slot + 1, cache_y, cache_o, cache_t, cache_c, cache_m)
                    slot += 1
                made += 1
            i = j
        changes += made
        if made == 0:
            break
    return changes


@njit(cache=True)
def next_fit(lengths, capacity):
    """Cut items, in order, into consecutive groups of at most ``capacity`` tokens.

    A group closes when the next item would overflow it. Returns (group_of[n], groups).
    """
    n = lengths.shape[0]
    group_of = np.empty(n, dtype=np.int64)
    group = 0
    used = 0
    for i in range(n):
        if used + lengths[i] > capacity and used > 0:
            group += 1
            used = 0
        used += lengths[i]
        group_of[i] = group
    return group_of, (group + 1 if n > 0 else 0)


@njit(cache=True)
def _top3(load, m, top_val, top_idx):
    """Recompute the three largest loads of round ``m`` (ties: lower replica first)."""
    v0 = v1 = v2 = -np.inf
    i0 = i1 = i2 = -1
    for d in range(load.shape[1]):
        x = load[m, d]
        if x > v0:
            v2, i2, v1, i1, v0, i0 = v1, i1, v0, i0, x, d
        elif x > v1:
            v2, i2, v1, i1 = v1, i1, x, d
        elif x > v2:
            v2, i2 = x, d
    top_val[m, 0], top_val[m, 1], top_val[m, 2] = v0, v1, v2
    top_idx[m, 0], top_idx[m, 1], top_idx[m, 2] = i0, i1, i2


@njit(cache=True)
def _max_without(top_val, top_idx, m, a, b):
    """Largest load of round ``m`` among replicas other than ``a`` and ``b``."""
    for k in range(3):
        if top_idx[m, k] != a and top_idx[m, k] != b:
            return top_val[m, k]
    return -np.inf


@njit(cache=True)
def _round_sum_change(load, top_val, top_idx, m, d1, m2, d2, delta):
    """Change of ``sum_m max_d load`` when ``delta`` moves from cell (m, d1) to (m2, d2)."""
    if m2 != m:
        new_m = max(load[m, d1] - delta, _max_without(top_val, top_idx, m, d1, -1))
        new_m2 = max(top_val[m2, 0], load[m2, d2] + delta)
        return (new_m - top_val[m, 0]) + (new_m2 - top_val[m2, 0])
    new = max(load[m, d1] - delta, load[m, d2] + delta, _max_without(top_val, top_idx, m, d1, d2))
    return new - top_val[m, 0]


@njit(cache=True)
def _sorted_members(head, nxt, costs, buf):
    """Items of one replica (its linked list) sorted by cost; returns how many."""
    k = 0
    i = head
    while i >= 0:
        buf[k] = i
        k += 1
        i = nxt[i]
    keys = np.empty(k, dtype=np.float64)
    for t in range(k):
        keys[t] = costs[buf[t]]
    order = np.argsort(keys, kind="mergesort")
    tmp = buf[:k].copy()
    for t in range(k):
        buf[t] = tmp[order[t]]
    return k


@njit(cache=True)
def _first_cost_above(items, k, costs, value):
    """Index of the first of ``items[:k]`` (sorted by cost) costing more than ``value``."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        if costs[items[mid]] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _move(i, d_from, m_from, d_to, m_to, head, prv, nxt, load, tok, total, costs, lengths, replica_of, round_of):
    """Move sequence ``i`` from microbatch ``(m_from, d_from)`` to ``(m_to, d_to)``: unlink it
    from ``d_from``'s list, push it on ``d_to``'s, and update every load and token count."""
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


@njit(cache=True)
def _total_before(total, a, b, sign):
    """Heap order of replicas: smaller ``sign * total``, then lower index."""
    x, y = sign * total[a], sign * total[b]
    if x != y:
        return x < y
    return a < b


@njit(cache=True)
def _total_down(heap, pos, size, i, total, sign):
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
def _total_up(heap, pos, i, total, sign):
    while i > 0:
        parent = (i - 1) // 2
        a, q = heap[i], heap[parent]
        if _total_before(total, a, q, sign):
            heap[i], heap[parent] = q, a
            pos[q], pos[a] = i, parent
            i = parent
        else:
            return


@njit(cache=True)
def _lightest(heap, size, total, out):
    """The ``len(out)`` smallest totals of a min-heap, in order (ties: lower index), by a
    best-first walk from the root: ``O(k**2)`` for ``k`` of them, whatever the heap size."""
    k = out.shape[0]
    frontier = np.empty(2 * k + 1, dtype=np.int64)  # heap positions still to visit
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


@njit(cache=True)
def repair_replicas(
    round_of,
    replica_of,
    costs,
    lengths,
    load,
    tok,
    capacity,
    max_moves,
    rel_tol,
    stop_at,
    swap_candidates,
    round_budget=0.0,
    max_work=50_000_000,
    move_candidates=16,
    scan_limit=16,
):
    """Even out replica totals without making the rounds (much) slower.

    Each step takes the most loaded replica ``d1`` and applies the best of: moving one of
    its sequences into any microbatch (any round) of one of the ``move_candidates``
    lightest replicas ``d2``, or swapping one of its sequences with a cheaper one of one of
    the ``swap_candidates`` lightest replicas. A change is allowed when both microbatches
    stay within ``capacity``, the pair's larger total drops (``max(R_d1, R_d2)`` strictly
    decreases), and the sum of round maxima ``S = sum_m max_d load[m, d]`` stays at most
    ``max(S, round_budget)``: 0 never lets the rounds get slower, ``inf`` ignores them.
    "Best" is the largest drop of the pair's maximum; candidates are scanned from the
    ideal cost difference ``(R_d1 - R_d2) / 2`` outwards, so the first allowed one is the
    best for its replica (ties: lighter replica, cheaper item, lower round); at most
    ``scan_limit`` partners are checked per sequence and replica. Stops when no
    change helps, after ``max_moves`` changes, once the busiest replica is at most
    ``stop_at``, or after about ``max_work`` candidate checks (a deterministic time cap).
    Updates ``round_of``, ``replica_of``, ``load`` and ``tok`` (``[rounds, replicas]``) in
    place.

    Returns:
        Number of changes made.
    """
    n_rounds, dp = load.shape
    n = round_of.shape[0]
    total = np.zeros(dp, dtype=np.float64)
    for m in range(n_rounds):
        for d in range(dp):
            total[d] += load[m, d]
    top_val = np.empty((n_rounds, 3), dtype=np.float64)
    top_idx = np.empty((n_rounds, 3), dtype=np.int64)
    for m in range(n_rounds):
        _top3(load, m, top_val, top_idx)
    # Items of every replica as doubly linked lists (moves are O(1)).
    head = np.full(dp, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    prv = np.full(n, -1, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        d = replica_of[i]
        nxt[i] = head[d]
        if head[d] >= 0:
            prv[head[d]] = i
        head[d] = i
    mine = np.empty(n, dtype=np.int64)
    theirs = np.empty(n, dtype=np.int64)
    eps = 1e-12
    round_sum = 0.0
    for m in range(n_rounds):
        round_sum += top_val[m, 0]
    # Replicas in a min-heap and a max-heap of totals (ties: lower index): the busiest one
    # and the few lightest are read in O(log dp) per change, not a sort of all dp totals.
    lo = np.arange(dp, dtype=np.int64)
    lo_pos = np.arange(dp, dtype=np.int64)
    hi = np.arange(dp, dtype=np.int64)
    hi_pos = np.arange(dp, dtype=np.int64)
    for i in range(dp // 2 - 1, -1, -1):
        _total_down(lo, lo_pos, dp, i, total, 1.0)
        _total_down(hi, hi_pos, dp, i, total, -1.0)
    n_light = min(dp, max(move_candidates, swap_candidates) + 1)
    ascending = np.empty(n_light, dtype=np.int64)
    moves = 0
    work = 0
    while moves < max_moves and work < max_work:
        d1 = hi[0]
        if total[d1] <= stop_at:
            break
        _lightest(lo, dp, total, ascending)
        allow = max(0.0, round_budget - round_sum) + eps * total[d1]
        best_gain = rel_tol * total[d1]
        best_i = -1
        best_j = -1
        best_d2 = -1
        best_m2 = -1
        k1 = _sorted_members(head[d1], nxt, costs, mine)
        # Moves: for each light replica, items from the ideal cost outwards.
        tried = 0
        for kk in range(n_light):
            if tried >= move_candidates:
                break
            d2 = ascending[kk]
            if d2 == d1:
                continue
            tried += 1
            gap = total[d1] - total[d2]
            if gap / 2 <= best_gain:
                break
            right = _first_cost_above(mine, k1, costs, gap / 2)
            left = right - 1
            checked = 0
            while (left >= 0 or right < k1) and checked < scan_limit * 4:
                gain_left = costs[mine[left]] if left >= 0 else -np.inf
                gain_right = gap - costs[mine[right]] if right < k1 else -np.inf
                if gain_left >= gain_right:
                    i = mine[left]
                    gain = gain_left
                    left -= 1
                else:
                    i = mine[right]
                    gain = gain_right
                    right += 1
                if gain <= best_gain:
                    break
                checked += 1
                m = round_of[i]
                found = False
                for m2 in range(n_rounds):
                    work += 1
                    if tok[m2, d2] + lengths[i] > capacity:
                        continue
                    if _round_sum_change(load, top_val, top_idx, m, d1, m2, d2, costs[i]) <= allow:
                        best_gain, best_i, best_j, best_d2, best_m2 = gain, i, -1, d2, m2
                        found = True
                        break
                if found:
                    break
        # Swaps: for each of d1's items, partners from the ideal difference outwards.
        tried = 0
        for kk in range(n_light):
            if tried >= swap_candidates:
                break
            d2 = ascending[kk]
            if d2 == d1:
                continue
            tried += 1
            gap = total[d1] - total[d2]
            if gap / 2 <= best_gain:
                break
            k2 = _sorted_members(head[d2], nxt, costs, theirs)
            for t in range(k1):
                i = mine[t]
                ci = costs[i]
                m = round_of[i]
                # delta = ci - cj; gain = min(delta, gap - delta); ideal cj = ci - gap/2.
                right = _first_cost_above(theirs, k2, costs, ci - gap / 2)
                left = right - 1
                checked = 0
                while (left >= 0 or right < k2) and checked < scan_limit:
                    gain_left = gap - (ci - costs[theirs[left]]) if left >= 0 else -np.inf
                    gain_right = ci - costs[theirs[right]] if right < k2 else -np.inf
                    if gain_left >= gain_right:
                        j = theirs[left]
                        gain = gain_left
                        left -= 1
                    else:
                        j = theirs[right]
                        gain = gain_right
                        right += 1
                    if gain <= best_gain:
                        break
                    work += 1
                    checked += 1
                    m2 = round_of[j]
                    fits = tok[m2, d2] + lengths[i] - lengths[j] <= capacity
                    if m2 != m:
                        fits = fits and tok[m, d1] - lengths[i] + lengths[j] <= capacity
                    if fits and _round_sum_change(load, top_val, top_idx, m, d1, m2, d2, ci - costs[j]) <= allow:
                        best_gain, best_i, best_j, best_d2, best_m2 = gain, i, j, d2, m2
                        break
        if best_i < 0:
            break
        i, j, d2, m2 = best_i, best_j, best_d2, best_m2
        m = round_of[i]
        # i moves from (m, d1) to (m2, d2); in a swap j moves the other way.
        _move(i, d1, m, d2, m2, head, prv, nxt, load, tok, total, costs, lengths, replica_of, round_of)
        if j >= 0:
            _move(j, d2, m2, d1, m, head, prv, nxt, load, tok, total, costs, lengths, replica_of, round_of)
        for d in (d1, d2):
            _total_up(lo, lo_pos, lo_pos[d], total, 1.0)
            _total_down(lo, lo_pos, dp, lo_pos[d], total, 1.0)
            _total_up(hi, hi_pos, hi_pos[d], total, -1.0)
            _total_down(hi, hi_pos, dp, hi_pos[d], total, -1.0)
        _top3(load, m, top_val, top_idx)
        if m2 != m:
            _top3(load, m2, top_val, top_idx)
        round_sum = 0.0
        for r in range(n_rounds):
            round_sum += top_val[r, 0]
        moves += 1
    return moves


@njit(cache=True)
def greedy_matching(rows, cols, n):
    """Match rows to columns (both ``0..n-1``) along candidate pairs given best first.

    Walks the pairs ``(rows[k], cols[k])`` in order and takes each whose row and column are
    both still free. Rows left over then take the lowest free columns, in row order. The
    caller sorts the pairs (e.g. heaviest overlap first), so the work is
    ``O(len(rows) + n)``, never ``n * n``. Returns ``column_of_row``.
    """
    column_of_row = np.full(n, -1, dtype=np.int64)
    column_taken = np.zeros(n, dtype=np.bool_)
    matched = 0
    for k in range(rows.shape[0]):
        if matched == n:
            break
        r, c = rows[k], cols[k]
        if column_of_row[r] < 0 and not column_taken[c]:
            column_of_row[r] = c
            column_taken[c] = True
            matched += 1
    c = 0
    for r in range(n):
        if column_of_row[r] >= 0:
            continue
        while column_taken[c]:
            c += 1
        column_of_row[r] = c
        column_taken[c] = True
    return column_of_row
