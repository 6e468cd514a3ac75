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


def deal_local_reference(by_cost, load, dp):
    """Round m takes the m-th run of dp bins of by_cost; in it, bins (heaviest first) go to
    their own replica (bin % dp) while it is free; the rest, heaviest first, to the free
    replicas with the least total so far (ties: lower replica)."""
    n_bins = len(by_cost)
    round_of = [0] * n_bins
    replica_of = [0] * n_bins
    totals = [0.0] * dp
    for m in range(n_bins // dp):
        bins = by_cost[m * dp : (m + 1) * dp]
        taken, left = set(), []
        for b in bins:
            round_of[b] = m
            if b % dp not in taken:
                taken.add(b % dp)
                replica_of[b] = b % dp
            else:
                left.append(b)
        free = sorted((d for d in range(dp) if d not in taken), key=lambda d: (totals[d], d))
        for b, d in zip(left, free, strict=True):
            replica_of[b] = d
        for b in bins:
            totals[replica_of[b]] += load[b]
    return round_of, replica_of
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
