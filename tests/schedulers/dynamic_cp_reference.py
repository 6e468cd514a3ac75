"""Slow, obvious twins of the dynamic-CP kernels and planner pieces, and a brute-force
optimum for tiny steps (tests/schedulers/test_dynamic_cp_*.py check the fast paths
against these)."""

from __future__ import annotations

import itertools

import numpy as np

from seqpack.cost import CostModel
from seqpack.schedulers import Request, Schedule
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp


def padded(length, size, pad_multiple):
    multiple = 2 * size * pad_multiple if size > 1 else pad_multiple
    return -(-length // multiple) * multiple


def pack_time(size, s, ss, spans, coef):
    """Cost of one microbatch (the formula of seqpack.cost.ring)."""
    t = coef[0] + (coef[1] * s + coef[2] * ss) / size
    if size > 1:
        t += (size - 1) * coef[3] + (size - 1) * (coef[5] if spans else coef[4]) / size * s
    return t


def choose_sizes_reference(lengths, sizes, coef, ranks_per_node, capacity, pad_multiple, height):
    size_of, time_of = [], []
    for s in lengths:
        fitting = [
            (c, pack_time(c, float(padded(s, c, pad_multiple)), float(padded(s, c, pad_multiple)) ** 2,
                          c > ranks_per_node, coef))
            for c in sizes
            if padded(s, c, pad_multiple) <= c * capacity
        ]  # fmt: skip
        within = [(c, t) for c, t in fitting if t <= height]
        if within:
            c, t = within[0]
        elif fitting:
            c, t = min(fitting, key=lambda ct: (ct[1], ct[0]))
        else:
            c, t = -1, 0.0
        size_of.append(c)
        time_of.append(t)
    return size_of, time_of


def shelf_reference(widths, num_ranks):
    used, round_of = [], []
    for w in widths:
        m = next((i for i, u in enumerate(used) if u + w <= num_ranks), len(used))
        if m == len(used):
            used.append(0)
        used[m] += w
        round_of.append(m)
    return round_of, used


def widen_reference(round_of, size_of, time_of, lengths, used, sizes, coef, rpn, capacity, pad_multiple, ranks):
    size_of, time_of, used = list(size_of), list(time_of), list(used)
    for m in range(len(used)):
        while used[m] < ranks:
            members = [i for i in range(len(round_of)) if round_of[i] == m]
            top = max(members, key=lambda i: (time_of[i], -i))
            for c in sizes:
                if c <= size_of[top] or c - size_of[top] > ranks - used[m]:
                    continue
                p = padded(lengths[top], c, pad_multiple)
                t = pack_time(c, float(p), float(p) * float(p), c > rpn, coef)
                if p <= c * capacity and t < time_of[top]:
                    used[m] += c - size_of[top]
                    size_of[top], time_of[top] = c, t
                    break
            else:
                break
    return size_of, time_of, used


def lpt_reference(lengths, size, room, load, floor, tokens, s, ss, coef, rpn, pad_multiple):
    """Every sequence, longest first, into the bin with the largest ``floor - load`` (ties:
    fewer tokens, lower index) among those with room; bins that cannot take the current
    sequence wait until a shorter one comes; bins with less room than the shortest
    sequence are done. Lists in, (ok, bin_of, updated lists) out."""
    size, room, load, tokens, s, ss = (list(v) for v in (size, room, load, tokens, s, ss))
    bin_of = [-1] * len(lengths)
    if not lengths:
        return True, bin_of, (room, load, tokens, s, ss)
    smallest = padded(lengths[-1], 1, pad_multiple)
    active = {b for b in range(len(size)) if room[b] >= smallest}
    parked = set()
    for j, length in enumerate(lengths):
        alone = padded(length, 1, pad_multiple)
        for b in [b for b in parked if room[b] >= alone]:
            parked.discard(b)
            active.add(b)
        while active and bin_of[j] < 0:
            b = min(active, key=lambda b: (-(floor[b] - load[b]), tokens[b], b))
            active.discard(b)
            p = padded(length, size[b], pad_multiple)
            if p <= room[b]:
                fp, c = float(p), size[b]
                ring = (c - 1) * (coef[5] if c > rpn else coef[4]) / c if c > 1 else 0.0
                load[b] += (coef[1] * fp + coef[2] * fp * fp) / c + ring * fp
                s[b] += fp
                ss[b] += fp * fp
                room[b] -= p
                tokens[b] += p
                bin_of[j] = b
                if room[b] >= smallest:
                    active.add(b)
            elif room[b] >= smallest:
                parked.add(b)
        if bin_of[j] < 0:
            return False, bin_of, (room, load, tokens, s, ss)
    return True, bin_of, (room, load, tokens, s, ss)


def rounds_within(groups, ranks):
    """``(bin_round, bin_size)`` of the drawn ``(round, size)`` groups that fit their round's
    ``ranks``, in draw order: rounds as the planner forms them."""
    used, rnd, size = {}, [], []
    for m, c in groups:
        if used.get(m, 0) + c <= ranks:
            used[m] = used.get(m, 0) + c
            rnd.append(m)
            size.append(c)
    return rnd, size


def layout_reference(bin_round, bin_size):
    """Per round, bins by size descending (ties: index) left to right."""
    start = [0] * len(bin_size)
    for m in sorted(set(bin_round)):
        cursor = 0
        for b in sorted((b for b in range(len(bin_size)) if bin_round[b] == m), key=lambda b: (-bin_size[b], b)):
            start[b] = cursor
            cursor += bin_size[b]
    return start


def layout_in_nodes_reference(bin_round, bin_size, rpn, ranks):
    """Per round: bins of two ranks and a node or more left to right; smaller ones into the
    first node (from the end of the big ones) with room after what it already holds; singles
    (whatever ``rpn``) into the free ranks in order; a round where a small bin finds no node
    is laid out plainly."""
    start = layout_reference(bin_round, bin_size)
    for m in sorted(set(bin_round)):
        members = sorted((b for b in range(len(bin_size)) if bin_round[b] == m), key=lambda b: (-bin_size[b], b))
        trial, taken, cursor, ok = {}, [False] * ranks, 0, True
        nodes = -(-ranks // rpn)
        fill = [0] * nodes
        for b in members:
            c = bin_size[b]
            if c == 1:  # a single rank, even a whole node of one, waits for the free ranks
                continue
            if c >= rpn:
                trial[b] = cursor
                cursor += c
            else:
                for node in range(cursor // rpn, nodes):
                    seg = max(node * rpn, cursor)
                    if seg + fill[node] + c <= min((node + 1) * rpn, ranks):
                        trial[b] = seg + fill[node]
                        fill[node] += c
                        break
                else:
                    ok = False
                    break
        if not ok:
            continue
        for b, lo in trial.items():
            for r in range(lo, lo + bin_size[b]):
                taken[r] = True
        free = iter(r for r in range(ranks) if not taken[r])
        for b in members:
            if bin_size[b] == 1:
                trial[b] = next(free)
        for b, lo in trial.items():
            start[b] = lo
    return start


def step_time_reference(plan: Schedule, cost: CostModel, sync: str) -> float:
    """The step time, group by group and rank by rank."""
    coef = cost.group_coefficients(plan.cp_size)
    ranks = plan.dp_size * plan.cp_size
    finish = [0.0] * ranks
    total = 0.0
    for m in range(plan.num_microbatches):
        height = -np.inf
        for g in range(plan.num_groups):
            if plan.group_round[g] != m:
                continue
            start, size = int(plan.group_start[g]), int(plan.group_size[g])
            ids = plan.assigned[plan.offsets[g] : plan.offsets[g + 1]]
            lens = [padded(int(plan.lengths[i]), size, plan.pad_multiple) for i in ids]
            spans = start // cost.ranks_per_node != (start + size - 1) // cost.ranks_per_node
            t = pack_time(size, float(sum(lens)), float(sum(x * x for x in lens)), spans, coef)
            if not lens:  # an idle group runs a padding-only filler
                t = coef[0]
            height = max(height, t)
            ready = max(finish[start : start + size])
            finish[start : start + size] = [ready + t] * size
        total += height
    return total if sync == "lockstep" else max(finish, default=0.0)


def static_reference(lengths, ranks, capacity, pad_multiple, cost, sizes):
    """Static CP the obvious way: every round cut into groups of the smallest allowed size
    holding the longest sequence (the rest of the ranks single), rounds added until
    :func:`lpt_reference` places every sequence (longest first) into them."""
    coef, lengths = cost.group_coefficients(1), [int(x) for x in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    longest = lengths[order[0]] if order else 1
    c = next(c for c in sizes if padded(longest, c, pad_multiple) <= c * capacity)
    groups, singles = (ranks // c, ranks % c) if c > 1 else (0, ranks)
    total = sum(padded(lengths[i], c, pad_multiple) for i in order)
    rounds = max(0, -(-total // ((ranks // c) * c * capacity)))
    while True:
        # bin order as the planner builds them: the groups of every round, then the singles
        size = [c] * (groups * rounds) + [1] * (singles * rounds)
        rnd = [m for m in range(rounds) for _ in range(groups)] + [m for m in range(rounds) for _ in range(singles)]
        load = [(x - 1) * coef[3] if x > 1 else 0.0 for x in size]
        ok, bin_of, _ = lpt_reference(
            [lengths[i] for i in order], size, [x * capacity for x in size], load, [0.0] * len(size),
            [0] * len(size), [0.0] * len(size), [0.0] * len(size), coef, cost.ranks_per_node, pad_multiple,
        )  # fmt: skip
        if ok:
            break
        rounds += 1
    return _plan_from_bins(order, bin_of, rnd, size, lengths, ranks, capacity, pad_multiple)


def _plan_from_bins(order, bin_of, rnd, size, lengths, ranks, capacity, pad_multiple):
    start = layout_reference(rnd, size)
    groups = sorted(range(len(size)), key=lambda b: (rnd[b], start[b]))
    members = {b: [order[j] for j in range(len(order)) if bin_of[j] == b] for b in groups}
    arr = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return Schedule(
        num_microbatches=max(rnd, default=-1) + 1,
        group_round=arr([rnd[b] for b in groups]), group_start=arr([start[b] for b in groups]),
        group_size=arr([size[b] for b in groups]), group_counts=arr([len(members[b]) for b in groups]),
        assigned=arr([i for b in groups for i in members[b]]), lengths=arr(lengths), original_lengths=arr(lengths),
        dp_size=ranks, cp_size=1, max_tokens_per_rank=capacity, pad_multiple=pad_multiple,
    )  # fmt: skip


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first, *part[k]]] + part[k + 1 :]
        yield [[first], *part]


def longest_held(capacity, sizes):
    """The longest sequence (pad_multiple 1) some group of ``sizes`` holds: ``c * capacity``
    rounded down to the group's padding multiple (``2c`` under CP)."""
    return max(c * capacity // (2 * c if c > 1 else 1) * (2 * c if c > 1 else 1) for c in sizes)


def brute_force_lockstep(lengths, ranks, capacity, pad_multiple, cost, sizes):
    """The least lockstep step time of any plan on aligned power-of-2 groups: every
    partition of the sequences into microbatches, every allowed size of each, every
    partition of those into rounds of at most ``ranks`` ranks (tiny steps only)."""
    coef, rpn = cost.group_coefficients(1), cost.ranks_per_node
    best = np.inf
    for bins in _set_partitions(list(range(len(lengths)))):
        options = []
        for members in bins:
            fits = []
            for c in sizes:
                p = [padded(int(lengths[i]), c, pad_multiple) for i in members]
                if sum(p) <= c * capacity:
                    fits.append((c, pack_time(c, float(sum(p)), float(sum(x * x for x in p)), c > rpn, coef)))
            options.append(fits)
        for choice in itertools.product(*options):
            for rounds in _set_partitions(list(range(len(choice)))):
                if all(sum(choice[b][0] for b in r) <= ranks for r in rounds):
                    best = min(best, sum(max(choice[b][1] for b in r) for r in rounds))
    return best if lengths else 0.0


def place_blocks_reference(widths, times, ranks):
    load, depth, start, rounds = [0.0] * ranks, [0] * ranks, [], []
    for c, t in zip(widths, times, strict=True):
        lo = min(range(0, ranks - c + 1, c), key=lambda lo: (max(load[lo : lo + c]), lo))
        busy, m = max(load[lo : lo + c]), max(depth[lo : lo + c])
        load[lo : lo + c] = [busy + t] * c
        depth[lo : lo + c] = [m + 1] * c
        start.append(lo)
        rounds.append(m)
    return start, rounds, load, depth


def lpt_ranks_reference(lengths, load, capacity, pad_multiple, coef, depth):
    """Each sequence (longest first) to the least busy rank (ties: lower rank) that can hold
    it: first fit into its microbatches, else a new one (``constant`` more) while it has
    fewer than ``depth``. Ranks that cannot wait for a shorter sequence; ranks with less
    room than the shortest sequence are done."""
    ranks, load = len(load), list(load)
    room = [[capacity] * depth for _ in range(ranks)]
    count = [0] * ranks
    rank_of, slot_of = [-1] * len(lengths), [-1] * len(lengths)
    smallest = padded(lengths[-1], 1, pad_multiple) if lengths else 0
    free = lambda b: capacity if count[b] < depth else max(room[b])  # noqa: E731
    active, parked = set(range(ranks)), set()
    for j, length in enumerate(lengths):
        p = padded(length, 1, pad_multiple)
        for b in [b for b in parked if free(b) >= p]:
            parked.discard(b)
            active.add(b)
        chosen = None
        for b in sorted(active, key=lambda b: (load[b], b)):
            fp = float(p)
            extra = coef[1] * fp + coef[2] * fp * fp
            k = next((k for k in range(count[b]) if room[b][k] >= p), count[b] if count[b] < depth else -1)
            if k >= 0:
                chosen = (load[b] + extra + (coef[0] if k == count[b] else 0.0), b, k)
                break
            active.discard(b)
            if free(b) >= smallest:
                parked.add(b)
        if chosen is None:
            return False, rank_of, slot_of, count
        t, b, k = chosen
        count[b] = max(count[b], k + 1)
        room[b][k] -= p
        load[b] = t
        rank_of[j], slot_of[j] = b, k
    return True, rank_of, slot_of, count


def check_plan_reference(plan, lengths, ranks, capacity, pad_multiple, aligned):
    """The plan's invariants, checked the obvious way (asserts)."""
    seen = {}
    for m in range(plan.num_microbatches):
        covered = [0] * ranks
        for g in range(plan.num_groups):
            if plan.group_round[g] != m:
                continue
            start, size = int(plan.group_start[g]), int(plan.group_size[g])
            for r in range(start, start + size):
                covered[r] += 1
            if aligned and size != ranks:
                assert size & (size - 1) == 0 and start % size == 0, (m, start, size)
            ids = plan.assigned[plan.offsets[g] : plan.offsets[g + 1]].tolist()
            assert sum(padded(int(plan.lengths[i]), size, pad_multiple) for i in ids) <= size * capacity
            for i in ids:
                seen[i] = seen.get(i, 0) + 1
        assert covered == [1] * ranks, f"round {m} does not cover every rank once: {covered}"
    for i in plan.dropped.tolist():
        seen[i] = seen.get(i, 0) + 1
    assert seen == {i: 1 for i in range(len(lengths))}


def bin_times_reference(bin_size, bin_start, bin_count, bin_s, bin_ss, coef, rpn):
    """Each bin's microbatch time on its block of ranks (``constant`` when it holds nothing)."""
    times = []
    for c, lo, count, s, ss in zip(bin_size, bin_start, bin_count, bin_s, bin_ss, strict=True):
        spans = lo // rpn != (lo + c - 1) // rpn
        times.append(pack_time(c, s, ss, spans, coef) if count > 0 else coef[0])
    return times


def replica_finish_reference(order, bin_start, bin_size, times, ranks):
    """When the last rank finishes if each group, in ``order``, starts once all its ranks
    are free."""
    finish = [0.0] * ranks
    for b in order:
        block = range(bin_start[b], bin_start[b] + bin_size[b])
        ready = max((finish[r] for r in block), default=0.0)
        for r in block:
            finish[r] = ready + times[b]
    return max(finish, default=0.0)


def plan_dcp(lengths, *, group_sizes="pow2", **request):
    """``plan_dynamic_cp`` of ``Request.of(lengths, **request)``: one plan from the
    scheduler's keywords (the tests' shorthand)."""
    return plan_dynamic_cp(Request.of(lengths, **request), group_sizes=group_sizes)
