"""The balanced planner's data (:class:`Sequences` in, :class:`BalancedPlan` out) and the
stages that need nothing else (docs/schedulers.md, "balanced").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from seqpack.options import Order, Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.objective import round_sum_lower_bound
from seqpack.schedulers.schedule import Grid
from seqpack.schedulers.shape_limits import BucketPrice
from seqpack.validation import check_choice

_GAP_FOR_MORE = 0.01  # a plan this far (1%) from its bounds tries one more microbatch...
_BETTER_BY = 0.01  # ... and keeps it when the estimated step cost drops by 1% or more
_MAX_EXTRA_ROUNDS = 16  # microbatch counts tried beyond the first feasible one


@dataclasses.dataclass(frozen=True)
class Sequences:
    """The arguments of :func:`~seqpack.schedulers.balanced.plan_balanced` (``max_repair_moves``
    resolved) and ``fill_order``, the order the bin rules take the sequences."""

    padded: np.ndarray
    costs: np.ndarray
    fill_order: np.ndarray
    dp_size: int
    capacity: int
    constant: float
    max_repair_moves: int
    sync: str
    price: BucketPrice | None = None


@dataclasses.dataclass(frozen=True)
class BalancedPlan:
    """Where every sequence goes: ``round_of``, ``replica_of`` per sequence, ``load`` (cost
    without constants) and ``tokens`` of every microbatch ``[M, dp]``, the bin rule that
    packed it (``mode``: 0 cost targets, 1 worst-fit, 2 first-fit, 3 exact search) and its
    predicted step time under the plan's ``sync`` (``objective``, constants included)."""

    num_microbatches: int
    round_of: np.ndarray
    replica_of: np.ndarray
    load: np.ndarray
    tokens: np.ndarray
    mode: int
    objective: float


def fill_order(padded: np.ndarray, origin: np.ndarray | None) -> np.ndarray:
    """Longest first; equal lengths interleaved by origin (the k-th sequence of every rank,
    rank by rank, then the (k+1)-th), so that they land on the replica holding them; without
    origin, in input order."""
    n = padded.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(padded.max())
    if origin is None:
        return _stable_argsort(top - padded, top)
    ranks = int(origin.max()) + 1
    counts = np.bincount(origin, minlength=ranks)
    slot = np.empty(n, dtype=np.int64)
    slot[_stable_argsort(origin, ranks - 1)] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    if (top + 1) * n * ranks < 2**62:  # one unique int64 key sorts faster than lexsort
        return np.argsort((top - padded) * (n * ranks) + slot * ranks + origin)
    return np.lexsort((origin, slot, -padded))


def _stable_argsort(key: np.ndarray, top: int) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of int64 ``key`` in ``[0, top]``, by one unique key where it fits."""
    n = key.shape[0]
    if (top + 1) * n < 2**62:
        return np.argsort(key * n + np.arange(n, dtype=np.int64))
    return np.argsort(key, kind="stable")


def round_targets(sorted_costs: np.ndarray, dp_size: int, num_rounds: int) -> np.ndarray:
    """Cost target of one microbatch of each round, from ``sorted_costs`` (costliest first;
    docs/schedulers.md, step 2)."""
    targets = np.zeros(num_rounds, dtype=np.float64)
    remaining = float(sorted_costs.sum()) / dp_size
    n = sorted_costs.shape[0]
    for m in range(num_rounds):
        forced = float(sorted_costs[m * dp_size]) if m * dp_size < n else 0.0
        target = min(max(forced, remaining / (num_rounds - m)), remaining)
        targets[m] = max(target, 0.0)
        remaining -= targets[m]
    return targets


def _arrange(load: np.ndarray, dp_size: int, num_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Round and replica of every bin: sorted bins dealt into rounds, heaviest bin of a round
    to the lightest replica so far (ties by index)."""
    n_bins = dp_size * num_rounds
    by_cost = np.lexsort((np.arange(n_bins), -load))
    round_of_bin = np.empty(n_bins, dtype=np.int64)
    replica_of_bin = np.empty(n_bins, dtype=np.int64)
    totals = np.zeros(dp_size, dtype=np.float64)
    for m in range(num_rounds):
        bins = by_cost[m * dp_size : (m + 1) * dp_size]
        replicas = np.argsort(totals, kind="stable")
        round_of_bin[bins] = m
        replica_of_bin[bins] = replicas
        totals[replicas] += load[bins]
    return round_of_bin, replica_of_bin


def _grid(values: np.ndarray, round_of: np.ndarray, replica_of: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Sum of ``values`` per (round, replica) cell, in ``values``' dtype."""
    sums = np.bincount(round_of * shape[1] + replica_of, weights=values, minlength=shape[0] * shape[1])
    # Token sums stay far below 2**53, so the float64 bincount is exact for them.
    return sums.astype(values.dtype).reshape(shape)


Layout = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``(round_of, replica_of, load, tokens)``: per sequence, then per microbatch ``[M, dp]``."""


def laid_out(
    padded: np.ndarray, costs: np.ndarray, round_of: np.ndarray, replica_of: np.ndarray, shape: tuple[int, int]
) -> Layout:
    """The :data:`Layout` of sequences placed at ``round_of`` and ``replica_of``."""
    return round_of, replica_of, _grid(costs, round_of, replica_of, shape), _grid(padded, round_of, replica_of, shape)


def repair_budget(max_repair_moves: int | None, dp_size: int) -> int:
    """Cap on repair moves: ``max_repair_moves``, by default ``8 * dp_size + 64``."""
    return 8 * dp_size + 64 if max_repair_moves is None else int(max_repair_moves)


def _rounds(cell: np.ndarray, m_count: int, dp_size: int) -> Grid:
    """The :class:`Grid` whose cell ``m * dp_size + d`` holds the (ascending) sequences whose ``cell`` is that."""
    cells = m_count * dp_size
    return Grid(_stable_argsort(cell, cells - 1), np.bincount(cell, minlength=cells), dp_size)


def relabel_replicas(replica_of: np.ndarray, origin: np.ndarray, weight: np.ndarray, dp_size: int) -> np.ndarray:
    """The DP rank of every sequence once each plan replica runs on the rank already holding
    most of its tokens (greedy matching, heaviest overlap first; ties by replica, then rank)."""
    if replica_of.size == 0 or dp_size == 1:
        return replica_of
    replica_of = np.asarray(replica_of, dtype=np.int64)
    pair = replica_of * dp_size + np.asarray(origin, dtype=np.int64)  # < dp**2: exact in int64 for dp < 3e9
    by_pair = np.argsort(pair)  # groups equal pairs; order within a group does not matter
    sorted_pair = pair[by_pair]
    starts = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
    overlap = np.add.reduceat(np.asarray(weight, dtype=np.int64)[by_pair], starts)
    keys = sorted_pair[starts]  # ascending: (replica, rank) order
    top = int(overlap.max())
    best_first = keys[_stable_argsort(top - overlap, top)]  # heaviest first, ties in (replica, rank) order
    rank_of_replica = _kernels.greedy_matching(best_first // dp_size, best_first % dp_size, dp_size)
    return rank_of_replica[replica_of]


def round_position(load: np.ndarray, order: str = "heavy_first") -> np.ndarray:
    """Position (microbatch index) of every round given ``load[M, dp]``: ``"heavy_first"`` by
    round maximum, heaviest first; ``"pipeline"`` lightest first, second lightest last, ...,
    heaviest in the middle (ties keep round order); ``"as_planned"`` in round order."""
    order = check_choice("order", order, Order)
    k = np.arange(load.shape[0], dtype=np.int64)
    if k.size == 0 or order == Order.AS_PLANNED:
        return k
    heavy_first = np.lexsort((k, -load.max(axis=1)))
    position = np.empty_like(k)
    if order == Order.HEAVY_FIRST:
        position[heavy_first] = k
    else:
        position[heavy_first[::-1]] = np.where(k % 2 == 0, k // 2, k.size - 1 - k // 2)
    return position


def more_rounds(
    plan: BalancedPlan, seqs: Sequences, step: int, plan_at: Callable[[int], BalancedPlan | None]
) -> BalancedPlan:
    """The count search (docs/schedulers.md, "How many microbatches"): the plan of the count
    with the shortest predicted step, from ``plan`` at the fewest that fit, trying counts
    ``step`` apart (``plan_at(m)``: the plan at ``m`` rounds)."""
    padded, costs = seqs.padded, seqs.costs
    if not costs.size or float(costs.max()) <= 0:
        return plan  # CostModel(0, 0, c): each microbatch only adds its constant
    if seqs.sync == Sync.LOCKSTEP:  # base: the round bound, or under replica sync the replica bound
        base = round_sum_lower_bound(padded, costs, seqs.dp_size, seqs.capacity, order=seqs.fill_order)
    else:
        base = max(float(costs.sum()) / seqs.dp_size, float(costs.max()))
    limit = max(plan.num_microbatches, -(-padded.shape[0] // seqs.dp_size))
    best = previous = plan
    for _ in range(_MAX_EXTRA_ROUNDS):
        m = previous.num_microbatches + step
        greedy = best.mode == _kernels.MODE_COST
        if m > limit or (greedy and best.objective <= (base + m * seqs.constant) * (1 + _GAP_FOR_MORE)):
            break
        candidate = plan_at(m)
        if candidate is None:
            break
        if candidate.objective < best.objective * (1.0 - _BETTER_BY if greedy else 1.0):
            best = candidate
        if candidate.objective >= previous.objective:
            break  # the prediction stopped dropping
        previous = candidate
    return best
