"""Prototype (issue 12, not in the library): the round repair of ``round_repair.py`` as a
numba kernel, and how it would plug into ``seqpack.schedulers.locality.plan_local``.

Used by :mod:`seqpack.schedulers.locality` for lockstep objectives: the per-replica layout
keeps nearly every sequence on the rank that read it, but its rounds (each replica's
microbatches heaviest first) end 1-2% slower than a plan made for balance alone, because a
microbatch of a few sequences from one rank cannot hit a common cost closely. This pass fixes
the rounds one sequence at a time:

1. Take the round whose heaviest microbatch ``a`` is furthest above the round's mean (rounds
   set aside are skipped).
2. Candidates ``b``: the ``CANDIDATES`` lightest microbatches of the same round on other
   replicas, and every microbatch of ``a``'s own replica in other rounds (a swap there moves
   no token between ranks).
3. For each candidate, every ``x`` of ``a`` against every ``y`` of ``b`` or nothing: after the
   swap both must fit ``capacity``, ``b`` must end lighter than ``a`` was (and, in another
   round, no heavier than that round's heaviest; across replicas, ``b``'s replica no heavier
   than ``replica_cap``), and the round's maximum must drop. The swap with the largest drop
   per newly moved token (tokens leaving their home rank minus tokens returning home, plus
   ``PER_SWAP_TOKENS``) is made.
4. A round with no such swap is set aside until another swap is made; stop once the sum of
   the rounds' maxima is at most ``goal``, every round is set aside, or after ``max_steps``.

Candidates also include round k's microbatches holding sequences of ``a``'s replica and the
home replicas of ``a``'s visitors (swaps that bring sequences home). Rounds are fixed within a
pass; :func:`repair_plan` renumbers each replica's microbatches heaviest first between passes.
Per-round lazy heaps (heaviest and lightest first) keep a step independent of ``dp``.

Measured (this session, issue 12's workload, per-replica layout at home fill 1.0, then
:func:`repair_plan`; "over limit" is the predicted step time against the reference's + 0.1%):

| dp | seed | objective | CANDIDATES | over limit | moved | time |
| ---: | ---: | --- | ---: | --- | --- | --- |
| 64 | 1 | rounds | 16 | +0.005% | 16.8% | 0.02 s |
| 64 | 1 | rounds | 64 | -0.004% | 17.5% | 0.04 s |
| 64 | 3 | rounds | 64 | +0.019% | 17.8% | 0.04 s |
| 256 | 1 | rounds | 64 | -0.0001% | 17.2% | 0.19 s |
| 64 | 1 / 3 | both | 64 | -0.001% / +0.008% | 16.8% / 16.8% | 0.04 s |
| 256 | 1 / 2 | both | 64 | -0.0001% / +0.024% | 16.9% / 17.3% | 0.17 s |
| 4,096 | 1 | rounds | 64 | over (fell back to the dealt layout, 55.3%) | | 2.3 s for the plan |

So it lands on the 0.1% line at dp <= 256 (half the steps just over it) with ~17% moved, but
at dp = 4,096 it neither reaches the limit nor stays within the plan's time budget. The
Python prototype (``round_repair.py``), which scans every microbatch of the round and
realigns after every swap, reaches the limit at dp = 64 and 256: the kernel's narrower
candidate set and per-pass alignment are what is left to close. At dp = 1,024 the per-replica
start is +4.4% over the limit and the kernel stops at +0.88%; adding the 4 lightest
microbatches of every other round as partners only reaches +0.77%: the worst microbatches
need more than one-sequence swaps.

    python benchmarks/prototypes/round_repair_kernel.py DP [SEED] [rounds|both]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from numba import njit

__all__ = ["CANDIDATES", "PER_SWAP_TOKENS", "repair_plan", "repair_rounds"]

CANDIDATES = 64  # lightest microbatches of the round tried per step
PER_SWAP_TOKENS = 1000.0  # added to the moved tokens of a swap when scoring it


@njit(cache=True)
def _push(keys, bins, sizes, r, key, b, sign):
    """Push ``b`` with ``key`` on round ``r``'s heap (max-heap of ``sign * key``)."""
    i = sizes[r]
    sizes[r] = i + 1
    keys[r, i] = sign * key
    bins[r, i] = b
    while i > 0:
        parent = (i - 1) // 2
        if keys[r, i] > keys[r, parent] or (keys[r, i] == keys[r, parent] and bins[r, i] < bins[r, parent]):
            keys[r, i], keys[r, parent] = keys[r, parent], keys[r, i]
            bins[r, i], bins[r, parent] = bins[r, parent], bins[r, i]
            i = parent
        else:
            return


@njit(cache=True)
def _pop(keys, bins, sizes, r):
    """Remove the top of round ``r``'s heap."""
    n = sizes[r] - 1
    sizes[r] = n
    keys[r, 0], bins[r, 0] = keys[r, n], bins[r, n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        c = left
        right = left + 1
        if right < n and (
            keys[r, right] > keys[r, left] or (keys[r, right] == keys[r, left] and bins[r, right] < bins[r, left])
        ):
            c = right
        if keys[r, c] > keys[r, i] or (keys[r, c] == keys[r, i] and bins[r, c] < bins[r, i]):
            keys[r, i], keys[r, c] = keys[r, c], keys[r, i]
            bins[r, i], bins[r, c] = bins[r, c], bins[r, i]
            i = c
        else:
            return


@njit(cache=True)
def _top(keys, bins, sizes, r, load, sign):
    """The valid top of round ``r``'s heap (stale entries dropped), or -1."""
    while sizes[r] > 0:
        b = bins[r, 0]
        if sign * keys[r, 0] == load[b]:
            return b
        _pop(keys, bins, sizes, r)
    return -1


@njit(cache=True)
def _rebuild(keys, bins, sizes, r, load, dp, sign):
    """Round ``r``'s heap from the current loads (drops every stale entry)."""
    sizes[r] = 0
    for d in range(dp):
        _push(keys, bins, sizes, r, load[r * dp + d], r * dp + d, sign)


@njit(cache=True)
def _relink(item, src, dst, head, nxt, prv, load, tok, total, round_of, replica_of, padded, costs, dp):
    """Move ``item`` from microbatch ``src`` to ``dst`` (lists and sums)."""
    if prv[item] >= 0:
        nxt[prv[item]] = nxt[item]
    else:
        head[src] = nxt[item]
    if nxt[item] >= 0:
        prv[nxt[item]] = prv[item]
    prv[item] = -1
    nxt[item] = head[dst]
    if head[dst] >= 0:
        prv[head[dst]] = item
    head[dst] = item
    load[src] -= costs[item]
    load[dst] += costs[item]
    tok[src] -= padded[item]
    tok[dst] += padded[item]
    total[src % dp] -= costs[item]
    total[dst % dp] += costs[item]
    round_of[item] = dst // dp
    replica_of[item] = dst % dp


@njit(cache=True)
def _level(load, dp, r):
    top = -np.inf
    total = 0.0
    for d in range(dp):
        v = load[r * dp + d]
        total += v
        if v > top:
            top = v
    return top, total


@njit(cache=True)
def repair_rounds(round_of, replica_of, padded, costs, origin, dp, rounds, capacity, goal, replica_cap, max_steps):
    """Swap sequences between microbatches to lower the sum of the rounds' maxima (module
    docstring). Updates ``round_of`` / ``replica_of`` in place.

    Returns:
        (steps, swaps, within): steps taken, swaps made, and those inside one replica.
    """
    n = padded.shape[0]
    n_bins = rounds * dp
    load = np.zeros(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    total = np.zeros(dp, dtype=np.float64)
    head = np.full(n_bins, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    prv = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        b = round_of[i] * dp + replica_of[i]
        load[b] += costs[i]
        tok[b] += padded[i]
        total[replica_of[i]] += costs[i]
        nxt[i] = head[b]
        if head[b] >= 0:
            prv[head[b]] = i
        head[b] = i
    by_origin = np.argsort(origin, kind="mergesort")
    by_origin_start = np.zeros(dp + 1, dtype=np.int64)
    for i in range(n):
        by_origin_start[origin[i] + 1] += 1
    for d in range(dp):
        by_origin_start[d + 1] += by_origin_start[d]
    width = 4 * dp + 8
    hi_keys = np.empty((rounds, width), dtype=np.float64)
    hi_bins = np.empty((rounds, width), dtype=np.int64)
    hi_size = np.zeros(rounds, dtype=np.int64)
    lo_keys = np.empty((rounds, width), dtype=np.float64)
    lo_bins = np.empty((rounds, width), dtype=np.int64)
    lo_size = np.zeros(rounds, dtype=np.int64)
    level_max = np.empty(rounds, dtype=np.float64)
    level_sum = np.empty(rounds, dtype=np.float64)
    for r in range(rounds):
        _rebuild(hi_keys, hi_bins, hi_size, r, load, dp, 1.0)
        _rebuild(lo_keys, lo_bins, lo_size, r, load, dp, -1.0)
        level_max[r], level_sum[r] = _level(load, dp, r)
    aside = np.zeros(rounds, dtype=np.bool_)
    cand = np.empty(CANDIDATES + rounds + 2 * n, dtype=np.int64)
    popped = np.empty(width, dtype=np.int64)
    seen = np.zeros(n_bins, dtype=np.bool_)
    members_a = np.empty(n, dtype=np.int64)
    steps = swaps = within = 0
    while steps < max_steps:
        if level_max.sum() <= goal:
            break
        k = -1
        worst = 0.0
        for r in range(rounds):
            gap = level_max[r] - level_sum[r] / dp
            if not aside[r] and gap > worst:
                worst, k = gap, r
        if k < 0:
            break
        steps += 1
        a = _top(hi_keys, hi_bins, hi_size, k, load, 1.0)
        da = a % dp
        la = load[a]
        # The round's second largest: pop a, read the next valid top, push a back.
        _pop(hi_keys, hi_bins, hi_size, k)
        s_bin = _top(hi_keys, hi_bins, hi_size, k, load, 1.0)
        second = load[s_bin] if s_bin >= 0 else -np.inf
        _push(hi_keys, hi_bins, hi_size, k, la, a, 1.0)
        # Candidates: the lightest of round k elsewhere, then a's replica in other rounds.
        n_cand = 0
        n_popped = 0
        while n_cand < CANDIDATES and lo_size[k] > 0:
            b = _top(lo_keys, lo_bins, lo_size, k, load, -1.0)
            if b < 0:
                break
            _pop(lo_keys, lo_bins, lo_size, k)
            popped[n_popped] = b
            n_popped += 1
            if b != a and not seen[b]:
                seen[b] = True
                cand[n_cand] = b
                n_cand += 1
        for i in range(n_popped):  # back on the heap (valid entries only: they were)
            _push(lo_keys, lo_bins, lo_size, k, load[popped[i]], popped[i], -1.0)
        # Swaps that bring sequences home: round k's microbatches holding sequences of a's
        # replica, and the home replicas of a's visitors.
        for j in range(by_origin_start[da], by_origin_start[da + 1]):
            i = by_origin[j]
            b = round_of[i] * dp + replica_of[i]
            if round_of[i] == k and b != a and not seen[b]:
                seen[b] = True
                cand[n_cand] = b
                n_cand += 1
        x = head[a]
        while x >= 0:
            b = k * dp + origin[x]
            if b != a and not seen[b]:
                seen[b] = True
                cand[n_cand] = b
                n_cand += 1
            x = nxt[x]
        for i in range(n_cand):
            seen[cand[i]] = False
        for r in range(rounds):
            if r != k:
                cand[n_cand] = r * dp + da
                n_cand += 1
        m_a = 0
        x = head[a]
        while x >= 0:
            members_a[m_a] = x
            m_a += 1
            x = nxt[x]
        best_score = 0.0
        best_x = best_y = best_b = -1
        for ci in range(n_cand):
            b = cand[ci]
            db = b % dp
            lb = load[b]
            rb = b // dp
            ceiling = la if rb == k else level_max[rb]
            for xi in range(m_a):
                x = members_a[xi]
                y = head[b]
                while True:  # y = -1 last: a move instead of a swap
                    cy = costs[y] if y >= 0 else 0.0
                    ty = padded[y] if y >= 0 else 0
                    na = la - costs[x] + cy
                    nb = lb - cy + costs[x]
                    ok = tok[a] - padded[x] + ty <= capacity and tok[b] - ty + padded[x] <= capacity
                    ok = ok and nb < la and nb <= ceiling
                    if ok and db != da:
                        ok = total[db] - cy + costs[x] <= replica_cap
                    if ok:
                        top = na
                        if nb > top:
                            top = nb
                        if second > top:
                            top = second
                        gain = la - top
                        if gain > 0:
                            moved = 0.0
                            if db != da:
                                if origin[x] == da:
                                    moved += padded[x]
                                elif origin[x] == db:
                                    moved -= padded[x]
                                if y >= 0:
                                    if origin[y] == db:
                                        moved += padded[y]
                                    elif origin[y] == da:
                                        moved -= padded[y]
                            if moved < 0:
                                moved = 0.0
                            score = gain / (moved + PER_SWAP_TOKENS)
                            if score > best_score:
                                best_score, best_x, best_y, best_b = score, x, y, b
                    if y < 0:
                        break
                    y = nxt[y]
        if best_x < 0:
            aside[k] = True
            continue
        aside[:] = False
        b, x, y = best_b, best_x, best_y
        db = b % dp
        rb = b // dp
        old_a, old_b = load[a], load[b]
        _relink(x, a, b, head, nxt, prv, load, tok, total, round_of, replica_of, padded, costs, dp)
        if y >= 0:
            _relink(y, b, a, head, nxt, prv, load, tok, total, round_of, replica_of, padded, costs, dp)
        level_sum[k] += load[a] - old_a
        level_sum[rb] += load[b] - old_b
        swaps += 1
        if db == da:
            within += 1
        for r in (k, rb):
            if hi_size[r] + 2 > width:
                _rebuild(hi_keys, hi_bins, hi_size, r, load, dp, 1.0)
            if lo_size[r] + 2 + CANDIDATES > width:
                _rebuild(lo_keys, lo_bins, lo_size, r, load, dp, -1.0)
        _push(hi_keys, hi_bins, hi_size, k, load[a], a, 1.0)
        _push(lo_keys, lo_bins, lo_size, k, load[a], a, -1.0)
        _push(hi_keys, hi_bins, hi_size, rb, load[b], b, 1.0)
        _push(lo_keys, lo_bins, lo_size, rb, load[b], b, -1.0)
        level_max[k] = load[_top(hi_keys, hi_bins, hi_size, k, load, 1.0)]
        level_max[rb] = load[_top(hi_keys, hi_bins, hi_size, rb, load, 1.0)]
    return steps, swaps, within


def repair_plan(plan, padded, costs, origin, dp_size, capacity, constant, objective, limit, passes=8):
    """``plan`` (the per-replica layout, a ``BalancedPlan``) with its rounds repaired until its
    predicted step time is ``limit``; between passes each replica's microbatches are
    renumbered heaviest first."""
    from seqpack.config import Objective
    from seqpack.schedulers.balanced import BalancedPlan, _grid
    from seqpack.schedulers.locality import heaviest_first, step_time

    m_count = plan.num_microbatches
    busiest = float(plan.load.sum(axis=0).max())
    if objective == Objective.ROUNDS:
        goal = limit - m_count * constant
        replica_cap = max(busiest, float(costs.sum()) / dp_size * 1.004)  # keeps replicas <= 1.005x
    else:  # "both": the busiest replica may not get busier
        goal = limit - busiest - 2 * m_count * constant
        replica_cap = busiest
    round_of, replica_of = plan.round_of.copy(), plan.replica_of.copy()
    shape = (m_count, dp_size)
    swaps = 0
    load, tokens = plan.load, plan.tokens
    for _ in range(passes):
        _, made, _ = repair_rounds(
            round_of,
            replica_of,
            padded,
            costs,
            origin,
            dp_size,
            m_count,
            capacity,
            goal,
            replica_cap,
            8 * dp_size * m_count + 1000,
        )
        swaps += made
        load = _grid(costs, round_of, replica_of, shape)
        tokens = _grid(padded, round_of, replica_of, shape)
        round_of, load, tokens = heaviest_first(round_of, replica_of, load, tokens)
        if made == 0 or float(load.max(axis=1).sum()) <= goal:
            break
    both = step_time(load, constant, Objective.BOTH)
    return BalancedPlan(m_count, round_of, replica_of, load, tokens, plan.mode, plan.repair_moves + swaps, both)


def main() -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import scale  # benchmarks/scale.py: the workload

    from seqpack.schedulers import locality
    from seqpack.schedulers.balanced import plan_balanced

    dp = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    objective = sys.argv[3] if len(sys.argv) > 3 else "rounds"
    lengths = scale.lengths_for(dp * scale.PER_REPLICA, seed=seed)
    padded = lengths.astype(np.int64)
    costs = scale.COST.cost(padded)
    origin = np.repeat(np.arange(dp), scale.PER_REPLICA)
    ref = plan_balanced(padded, costs, dp_size=dp, capacity=scale.CAPACITY, objective=objective)
    limit = locality.step_time(ref.load, 0.0, objective) * 1.001
    start = locality._candidate(padded, costs, origin, ref, dp, scale.CAPACITY, 0.0, objective, None, 1e-3, 1.0, False)
    if start is None:
        print("no per-replica layout at home fill 1.0")
        return 1
    tick = time.process_time()
    plan = repair_plan(start, padded, costs, origin, dp, scale.CAPACITY, 0.0, objective, limit)
    took = time.process_time() - tick

    def moved(p) -> float:
        return float(padded[p.replica_of != origin].sum() / padded.sum())

    before = locality.step_time(start.load, 0.0, objective) / limit - 1
    after = locality.step_time(plan.load, 0.0, objective) / limit - 1
    print(
        f"dp={dp} seed={seed} {objective}: start {before:+.4%} over the limit, moved {moved(start):.1%}; "
        f"repaired {after:+.4%}, "
        f"moved {moved(plan):.1%}, {plan.repair_moves} moves, {took:.2f} s CPU (numba compile on a first run)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
