"""numba's ``heapq`` against the hand-written heap of ``seqpack.schedulers._kernels``.

Issue 9 asks to use numba-supported ``heapq`` instead of hand-written heaps where it is not
slower. The heap in question is ``grid_lpt``'s: every placement raises the root bin's key and
sinks it (``heapreplace``), bins too full for the current item are parked in a second heap
(a max-heap on free room) until items get short enough. This script runs the same
placement with the kernel's heap and with a twin written on ``heapq`` (a typed list of
``(key, tokens, bin)`` tuples; ``(-room, bin)`` for the parked bins) and checks that both
place every item identically.

Workload: issue 12's 16K plan (lognormal lengths, mean 4096, 1024..8192, capacity 16,384,
cost ``24576*s + s**2``), at the token lower bound plus one microbatch (where the cost rule
succeeds), for each bin rule; CPU time, best of 3, numba compiled beforehand.

    python benchmarks/heaps.py [--sequences 1048576] [--replicas 16384]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import heapq  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from seqpack.cost import CostModel  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.schedulers import _kernels  # noqa: E402
from seqpack.schedulers.balanced.rounds import fill_order, round_targets  # noqa: E402

RULES = {_kernels.MODE_COST: "cost", _kernels.MODE_TOKENS: "tokens", _kernels.MODE_FIRST_FIT: "first-fit"}


@njit(cache=True)
def grid_lpt_heapq(lengths, costs, targets, capacity, mode):
    """``_kernels.grid._grid_lpt_sorted`` (from empty bins) with ``heapq`` for both heaps."""
    n_bins = targets.shape[0]
    n = lengths.shape[0]
    key = np.empty(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    load = np.zeros(n_bins, dtype=np.float64)
    room = np.full(n_bins, capacity, dtype=np.int64)
    bin_of = np.full(n, -1, dtype=np.int64)
    heap = [(0.0, 0, 0)]
    heap.pop()
    for b in range(n_bins):
        if mode == 0:
            key[b] = -targets[b]
        elif mode == 1:
            key[b] = 0.0
        else:
            key[b] = float(b)
        heap.append((key[b], 0, b))
    heapq.heapify(heap)
    park = [(0, 0)]
    park.pop()
    min_len = capacity
    for j in range(n):
        if lengths[j] < min_len:
            min_len = lengths[j]
    for j in range(n):
        p = lengths[j]
        while len(park) > 0 and -park[0][0] >= p:
            _, b = heapq.heappop(park)
            heapq.heappush(heap, (key[b], tok[b], b))
        placed = -1
        while len(heap) > 0:
            b = heap[0][2]
            if room[b] >= p:
                placed = b
                break
            heapq.heappop(heap)
            if room[b] >= min_len:
                heapq.heappush(park, (-room[b], b))
        if placed < 0:
            return False, bin_of
        bin_of[j] = placed
        load[placed] += costs[j]
        tok[placed] += p
        room[placed] -= p
        if mode == 0:
            key[placed] = load[placed] - targets[placed]
        elif mode == 1:
            key[placed] = float(tok[placed])
        if room[placed] < min_len:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (key[placed], tok[placed], placed))
    return True, bin_of


def best_cpu(fn, *args, repeat=3):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        out = fn(*args)
        best = min(best, time.process_time() - start)
    return best, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=1_048_576)
    parser.add_argument("--replicas", type=int, default=16_384)
    args = parser.parse_args()
    n, dp, capacity = args.sequences, args.replicas, 16384
    lengths = lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=0)
    costs = CostModel(24576.0, 1.0).cost(lengths)
    order = fill_order(lengths, None)
    rounds = -(-int(lengths.sum()) // (dp * capacity)) + 1
    targets = np.repeat(round_targets(costs[order], dp, rounds), dp)
    sorted_lengths, sorted_costs = lengths[order], costs[order]
    print(f"# {n:,} sequences into {dp:,} replicas x {rounds} microbatches ({dp * rounds:,} bins); CPU s, best of 3")
    print(f"{'rule':<10} {'hand-written':>12} {'numba heapq':>12} {'heapq / hand':>13}  same placement")
    for mode, name in RULES.items():
        zeros = (np.zeros(dp * rounds), np.zeros(dp * rounds, dtype=np.int64))
        _kernels.grid._grid_lpt_sorted(sorted_lengths[:8], sorted_costs[:8], targets, capacity, mode, *zeros)
        grid_lpt_heapq(sorted_lengths[:8], sorted_costs[:8], targets, capacity, mode)

        def hand(mode=mode):
            fresh = (np.zeros(dp * rounds), np.zeros(dp * rounds, dtype=np.int64))
            return _kernels.grid._grid_lpt_sorted(sorted_lengths, sorted_costs, targets, capacity, mode, *fresh)

        t_hand, (ok, bins, _, _) = best_cpu(hand)
        t_heapq, (ok_q, bins_q) = best_cpu(grid_lpt_heapq, sorted_lengths, sorted_costs, targets, capacity, mode)
        same = ok == ok_q and np.array_equal(bins, bins_q)
        print(f"{name:<10} {t_hand:>12.3f} {t_heapq:>12.3f} {t_heapq / t_hand:>12.2f}x  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
