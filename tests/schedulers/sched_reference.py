"""Slow, obvious references for the scheduler kernels (pure Python, lists and loops)."""

from __future__ import annotations

import itertools


def grid_lpt_reference(order, lengths, costs, targets, capacity, mode):
    """Each item, in order, into the bin with room that has the smallest
    (key, tokens, index); key by mode: 0 load - target, 1 tokens, 2 index."""
    n_bins = len(targets)
    load = [0.0] * n_bins
    tok = [0] * n_bins
    bin_of = [-1] * len(lengths)
    for item in order:
        best = None
        for b in range(n_bins):
            if tok[b] + lengths[item] > capacity:
                continue
            key = (load[b] - targets[b]) if mode == 0 else (float(tok[b]) if mode == 1 else float(b))
            cand = (key, tok[b], b)
            if best is None or cand < best:
                best = cand
        if best is None:
            return False, bin_of, load, tok
        b = best[2]
        bin_of[item] = b
        load[b] += costs[item]
        tok[b] += lengths[item]
    return True, bin_of, load, tok


def next_fit_reference(lengths, capacity):
    groups, current, used = [], [], 0
    for i, length in enumerate(lengths):
        if current and used + length > capacity:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += length
    if current:
        groups.append(current)
    return groups


def empty_reference(padded, origin, capacity, dp_size):
    """The ``empty`` plan: each replica's own positions next-fit in order, replica by
    replica; ``rounds[m][d]`` is replica ``d``'s ``m``-th group (empty past its last)."""
    per_replica = []
    for d in range(dp_size):
        mine = [i for i in range(len(padded)) if origin[i] == d]
        per_replica.append([[mine[j] for j in g] for g in next_fit_reference([padded[i] for i in mine], capacity)])
    rounds = max((len(groups) for groups in per_replica), default=0)
    return [[groups[m] if m < len(groups) else [] for groups in per_replica] for m in range(rounds)]


def megatron_groups_reference(padded, capacity, dp_size, multiple=1):
    """Megatron-LM's DpBalancedScheduler grouping, written from its description, with
    seqpack's documented continuation where Megatron asserts."""
    groups = next_fit_reference(padded, capacity)
    total = dp_size * multiple
    if len(groups) % total:
        to_move = total - len(groups) % total
        i = len(groups) - 1
        while to_move > 0:
            if i < 0:
                groups.append([])  # seqpack: empty microbatch instead of Megatron's assert
                to_move -= 1
                continue
            if len(groups[i]) > 1:
                groups.append([groups[i].pop()])
                to_move -= 1
            else:
                i -= 1
    return groups


def brute_force_optimum(costs, lengths, dp_size, num_rounds, capacity):
    """Best replica maximum and best sum of round maxima over every assignment of items to
    (round, replica) cells that respects capacity (tiny inputs only)."""
    cells = [(m, d) for m in range(num_rounds) for d in range(dp_size)]
    best_replica = best_rounds = float("inf")
    for choice in itertools.product(range(len(cells)), repeat=len(costs)):
        load = [[0.0] * dp_size for _ in range(num_rounds)]
        tok = [[0] * dp_size for _ in range(num_rounds)]
        ok = True
        for item, c in enumerate(choice):
            m, d = cells[c]
            tok[m][d] += lengths[item]
            if tok[m][d] > capacity:
                ok = False
                break
            load[m][d] += costs[item]
        if not ok:
            continue
        replica = max(sum(load[m][d] for m in range(num_rounds)) for d in range(dp_size))
        rounds = sum(max(row) for row in load)
        best_replica = min(best_replica, replica)
        best_rounds = min(best_rounds, rounds)
    return best_replica, best_rounds


def greedy_matching_reference(weights):
    """Every (row, column) pair with positive weight is a candidate, heaviest first (ties:
    row, then column), taken while both ends are free; leftover rows take the lowest free
    column, in row order."""
    n = len(weights)
    candidates = sorted((-weights[r][c], r, c) for r in range(n) for c in range(n) if weights[r][c] > 0)
    column_of_row = [-1] * n
    taken = set()
    for _, r, c in candidates:
        if column_of_row[r] < 0 and c not in taken:
            column_of_row[r] = c
            taken.add(c)
    for r in range(n):
        if column_of_row[r] < 0:
            best = min(c for c in range(n) if c not in taken)
            column_of_row[r] = best
            taken.add(best)
    return column_of_row


def grid_local_reference(order, lengths, values, targets, home_fill, token_share, capacity, origin, dp_size, slices=8):
    """Bin b belongs to replica b % dp_size; key = load - target. The order is cut into
    `slices` equal runs; in each, first every item goes to its own replica's bin with the
    smallest (key, tokens, index) if that keeps the bin within home_fill * target and within
    min(token_share, capacity) tokens; then the items left, in order, go to the bin with
    room that has the smallest (key, tokens, index) anywhere."""
    n_bins = len(targets)
    load = [0.0] * n_bins
    tok = [0] * n_bins
    bin_of = [-1] * len(lengths)
    home = [False] * len(lengths)

    def rank(b):
        return (load[b] - targets[b], tok[b], b)

    def put(item, b):
        bin_of[item] = b
        load[b] += values[item]
        tok[b] += lengths[item]

    n = len(order)
    for k in range(slices):
        part = order[n * k // slices : n * (k + 1) // slices]
        for item in part:
            mine = min((b for b in range(n_bins) if b % dp_size == origin[item]), key=rank)
            fits_share = tok[mine] + lengths[item] <= min(token_share, capacity)
            if fits_share and load[mine] + values[item] <= home_fill * targets[mine]:
                home[item] = True
                put(item, mine)
        for item in part:
            if home[item]:
                continue
            fits = [b for b in range(n_bins) if tok[b] + lengths[item] <= capacity]
            if not fits:
                return False, bin_of, home
            put(item, min(fits, key=rank))
    return True, bin_of, home


def min_bins_reference(sizes, capacity):
    """Fewest bins of ``capacity`` that hold ``sizes``: every assignment, bin by bin (item
    ``i`` goes into a bin already opened or the next new one), smallest count first."""
    sizes = [int(s) for s in sizes]
    if not sizes:
        return 0

    def fits(k):
        loads = []

        def place(i):
            if i == len(sizes):
                return True
            for b in range(len(loads)):
                if loads[b] + sizes[i] <= capacity:
                    loads[b] += sizes[i]
                    if place(i + 1):
                        return True
                    loads[b] -= sizes[i]
            if len(loads) < k:
                loads.append(sizes[i])
                if place(i + 1):
                    return True
                loads.pop()
            return False

        return place(0)

    k = 1
    while not fits(k):
        k += 1
    return k


def first_fit_decreasing_bins(sizes, capacity):
    """Bins first-fit decreasing opens (the greedy count an exact search improves on)."""
    loads = []
    for s in sorted((int(v) for v in sizes), reverse=True):
        for b, load in enumerate(loads):
            if load + s <= capacity:
                loads[b] += s
                break
        else:
            loads.append(s)
    return len(loads)


def home_swaps_reference(
    round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, passes
):
    """For each sequence x of ``order`` away from its home h = origin[x]: of moving x into a
    bin of h, or swapping it with any sequence y on h, keep the change that brings the most
    tokens home (x's, + y's if y lands home, - y's if y leaves home) while every bin stays
    within ``capacity`` tokens and ``round_cap`` cost and both replicas within
    ``replica_cap``; ties: a move (lowest round), then the lowest y. When nothing fits, the
    same with two sequences y1 < y2 that shared a bin of h of at most PAIR_BIN sequences when
    h's turn (its run in ``order``) began and have not moved since; ties: lowest (y1, y2).
    Sums are kept as the kernel keeps them (same float operations, same order). The swap
    partners of one x are judged all at once with numpy (elementwise, the same operations
    as one at a time), so thousands of sequences take a second, not minutes."""
    from itertools import combinations

    import numpy as np

    from seqpack.schedulers._kernels.locality_swaps import PAIR_BIN

    n = len(lengths)
    round_of = np.array(round_of, dtype=np.int64)
    replica_of = np.array(replica_of, dtype=np.int64)
    lengths = np.array(lengths, dtype=np.int64)
    costs = np.array(costs, dtype=np.float64)
    origin = np.array(origin, dtype=np.int64)
    round_cap = np.array(round_cap, dtype=np.float64)
    load, tok, total = np.zeros(rounds * dp), np.zeros(rounds * dp, dtype=np.int64), np.zeros(dp)
    for i in range(n):
        b = round_of[i] * dp + replica_of[i]
        load[b] += costs[i]
        tok[b] += lengths[i]
        total[replica_of[i]] += costs[i]
    moved_at, clock = [0] * n, 0

    def fits(a, ra, b, m, cx, tx, cy, ty, here, home):
        """Whether the bins a (round ra, on here) and b (round m, on home) and both replicas
        keep their caps once x (cx, tx) and what returns (cy, ty) trade places; elementwise
        over arrays b, m, cy, ty."""
        return (
            (load[a] - cx + cy <= round_cap[ra])
            & (load[b] - cy + cx <= round_cap[m])
            & (tok[a] - tx + ty <= capacity)
            & (tok[b] - ty + tx <= capacity)
            & (total[here] - cx + cy <= replica_cap)
            & (total[home] - cy + cx <= replica_cap)
        )

    def back(ys, here, home):  # tokens brought home by sending each of ys from home to here
        return np.where(origin[ys] == here, lengths[ys], np.where(origin[ys] == home, -lengths[ys], 0))

    changes = 0
    for _ in range(passes):
        made = 0
        turn_of = None
        for x in order:
            here, home = int(replica_of[x]), int(origin[x])
            if home != turn_of:  # h's turn begins: its pairs, and when
                turn_of, turn = home, clock
                in_bin = {}
                for y in range(n):
                    if replica_of[y] == home:
                        in_bin.setdefault(int(round_of[y]), []).append(y)
                pairs = [
                    (y1, y2, m) for m, ys in in_bin.items() if len(ys) <= PAIR_BIN for y1, y2 in combinations(ys, 2)
                ]
            if here == home:
                continue
            ra, cx, tx = int(round_of[x]), costs[x], int(lengths[x])
            a = ra * dp + here
            move = -1  # the lowest round x fits into
            if total[home] + cx <= replica_cap:
                for m in range(rounds):
                    b = m * dp + home
                    if load[b] + cx <= round_cap[m] and tok[b] + tx <= capacity:
                        move = m
                        break
            ys = np.flatnonzero(replica_of == home)  # ascending: the first of equal gains is the lowest y
            ms = round_of[ys]
            gains = tx + back(ys, here, home)
            ok = (gains > 0) & fits(a, ra, ms * dp + home, ms, cx, tx, costs[ys], lengths[ys], here, home)
            returning = []
            if move >= 0 and (not ok.any() or gains[ok].max() <= tx):
                m = move  # a move wins ties
            elif ok.any():
                best = int(np.flatnonzero(ok & (gains == gains[ok].max()))[0])
                returning, m = [int(ys[best])], int(ms[best])
            else:
                pair_options = []
                for y1, y2, m in pairs:
                    if moved_at[y1] > turn or moved_at[y2] > turn:
                        continue
                    two = np.array([y1, y2])
                    gain = tx + int(back(two, here, home).sum())
                    cy, ty = costs[y1] + costs[y2], int(lengths[y1] + lengths[y2])
                    if gain > 0 and fits(a, ra, m * dp + home, m, cx, tx, cy, ty, here, home):
                        pair_options.append((-gain, y1, y2, m))
                if not pair_options:
                    continue
                _, y1, y2, m = min(pair_options)
                returning = [y1, y2]
            clock += 1
            moved_at[x] = clock
            b = m * dp + home
            load[a] -= cx
            load[b] += cx
            tok[a] -= tx
            tok[b] += tx
            total[here] -= cx
            total[home] += cx
            round_of[x], replica_of[x] = m, home
            for y in returning:
                moved_at[y] = clock
                load[b] -= costs[y]
                load[a] += costs[y]
                tok[b] -= lengths[y]
                tok[a] += lengths[y]
                total[home] -= costs[y]
                total[here] += costs[y]
                round_of[y], replica_of[y] = ra, here
            made += 1
        changes += made
        if made == 0:
            break
    return round_of.tolist(), replica_of.tolist(), changes


def greedy_pairs_reference(rows, cols, n):
    """Pairs (rows[k], cols[k]) in the order given, each taken while both ends are free;
    leftover rows take the lowest free column, in row order."""
    column_of_row, taken = [-1] * n, set()
    for r, c in zip(rows, cols, strict=True):
        if column_of_row[r] < 0 and c not in taken:
            column_of_row[r] = c
            taken.add(c)
    for r in range(n):
        if column_of_row[r] < 0:
            column_of_row[r] = min(c for c in range(n) if c not in taken)
            taken.add(column_of_row[r])
    return column_of_row


def replica_first_reference(order, sizes, costs, dp, num_rounds, capacity):
    """Each sequence, in ``order``, to the replica with the lowest (total cost, index) among
    those with a bin it fits, into that replica's fullest such bin (ties: lower round).
    Returns (ok, round_of, replica_of)."""
    total = [0.0] * dp
    room = [[capacity] * num_rounds for _ in range(dp)]
    round_of, replica_of = [-1] * len(sizes), [-1] * len(sizes)
    for i in order:
        fitting = [d for d in range(dp) if max(room[d]) >= sizes[i]]
        if not fitting:
            return False, round_of, replica_of
        d = min(fitting, key=lambda d: (total[d], d))
        m = min((m for m in range(num_rounds) if room[d][m] >= sizes[i]), key=lambda m: (room[d][m], m))
        room[d][m] -= sizes[i]
        total[d] += costs[i]
        round_of[i], replica_of[i] = m, d
    return True, round_of, replica_of


def first_cost_above_reference(items, k, costs, value):
    """Position of the first of ``items[:k]`` costing more than ``value`` (``k`` if none)."""
    return next((i for i in range(k) if costs[items[i]] > value), k)


def walk_reference(items, k, costs, base, gap, right):
    """Every one of ``items[:k]`` with its gain, in the repair's walk order: the positions
    left of ``right`` (leftwards) and from ``right`` on (rightwards), merged by gain, ties to
    the left. A swap sends ``delta = base - cost``: the gain is ``gap - delta`` on the left
    and ``delta`` on the right."""

    def gain(i, on_left):
        delta = base - costs[items[i]]
        return gap - delta if on_left else delta

    lefts, rights, walk = list(range(right - 1, -1, -1)), list(range(right, k)), []
    while lefts or rights:
        take_left = bool(lefts) and (not rights or gain(lefts[0], True) >= gain(rights[0], False))
        i = lefts.pop(0) if take_left else rights.pop(0)
        walk.append((items[i], gain(i, take_left)))
    return walk
