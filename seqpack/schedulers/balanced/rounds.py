"""The balanced planner's data and grid helpers: :class:`Sequences` (what it plans),
:class:`BalancedPlan` (what it makes), and the stages that need nothing else: fill
order, round targets, bins dealt into rounds, the objective and its bounds, the count
search, replica renaming and round order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from seqpack.options import Order, Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.objective import round_sum_lower_bound, step_objective
from seqpack.schedulers.schedule import Grid
from seqpack.schedulers.shape_limits import BucketPrice
from seqpack.validation import check_choice

_GOOD_ENOUGH = 1e-3  # the repair stops within 0.1% of the replica bound
_SWAP_CANDIDATES = 4  # lightest replicas the repair tries swaps with
_GAP_FOR_MORE = 0.01  # a plan this far (1%) from its bounds tries one more microbatch...
_BETTER_BY = 0.01  # ... and keeps it when the estimated step cost drops by 1% or more
_REPAIR_WORK = 10_000_000  # candidate evaluations before the repair stops
_MAX_EXTRA_ROUNDS = 16  # microbatch counts tried beyond the first feasible one


@dataclasses.dataclass(frozen=True)
class Sequences:
    """One step's sequences as the balanced plan sees them: the arguments of
    :func:`~seqpack.schedulers.balanced.plan_balanced` (``max_repair_moves`` resolved), and
    ``fill_order``, the order the bin rules take the sequences (the ``fill_order`` stage's)."""

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
    """Where every sequence goes, before ids are turned into per-microbatch arrays.

    Attributes:
        num_microbatches: Rounds ``M``.
        round_of, replica_of: Per sequence (position in the input), its round and replica.
        load: Cost of every microbatch ``[M, dp]``, without the per-microbatch constant.
        tokens: Padded tokens of every microbatch ``[M, dp]``.
        mode: Bin rule that succeeded: 0 cost targets, 1 tokens (worst-fit), 2 first-fit,
            3 the exact search (:mod:`seqpack.schedulers.balanced.exact`).
        objective: Predicted step time (constants included) under the ``sync`` the plan was
            made for (:func:`step_objective`).
    """

    num_microbatches: int
    round_of: np.ndarray
    replica_of: np.ndarray
    load: np.ndarray
    tokens: np.ndarray
    mode: int
    objective: float


def fill_order(padded: np.ndarray, origin: np.ndarray | None) -> np.ndarray:
    """Longest first (cost grows with length). Equal lengths are interleaved by origin:
    the k-th sequence of every rank, rank by rank, then the (k+1)-th. Bins take equal items
    round-robin and are dealt to replicas in the same cyclic order, so equal sequences land
    on the replica that already holds them. Without origin, equal lengths keep input order."""
    n = padded.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(padded.max())
    index = np.arange(n, dtype=np.int64)
    if origin is None:
        if (top + 1) * n < 2**62:  # unique int64 keys: the fast (unstable) sort gives the stable order
            return np.argsort((top - padded) * n + index)
        return np.argsort(-padded, kind="stable")
    ranks = int(origin.max()) + 1
    if ranks * n >= 2**62 or (top + 1) * n * ranks >= 2**62:
        by_origin = np.argsort(origin, kind="stable")
    else:
        by_origin = np.argsort(origin * n + index)
    counts = np.bincount(origin, minlength=ranks)
    slot = np.empty(n, dtype=np.int64)
    slot[by_origin] = index - np.repeat(np.cumsum(counts) - counts, counts)
    if (top + 1) * n * ranks < 2**62:  # one unique int64 key sorts faster than lexsort
        return np.argsort((top - padded) * (n * ranks) + slot * ranks + origin)
    return np.lexsort((origin, slot, -padded))


def round_targets(sorted_costs: np.ndarray, dp_size: int, num_rounds: int) -> np.ndarray:
    """Per-round cost target of one microbatch of a ``[num_rounds, dp_size]`` grid, from the
    sequences' ``sorted_costs`` (costliest first; docs/schedulers.md, step 2)."""
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
    to the lightest replica so far (ties: lower bin index, lower replica index)."""
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
"""``(round_of, replica_of, load, tokens)``: every sequence's round and replica, and every
microbatch's cost and padded tokens ``[M, dp]``."""


def laid_out(
    padded: np.ndarray, costs: np.ndarray, round_of: np.ndarray, replica_of: np.ndarray, shape: tuple[int, int]
) -> Layout:
    """The :data:`Layout` of sequences placed at ``round_of`` and ``replica_of``."""
    return round_of, replica_of, _grid(costs, round_of, replica_of, shape), _grid(padded, round_of, replica_of, shape)


def _objective(load: np.ndarray, constant: float, sync: str) -> float:
    """:func:`step_objective` of a plan's ``load[M, dp]`` (costs without constants)."""
    return step_objective(load + constant, sync)


def repair_budget(max_repair_moves: int | None, dp_size: int) -> int:
    """Cap on repair moves: ``max_repair_moves``, by default ``8 * dp_size + 64``."""
    return 8 * dp_size + 64 if max_repair_moves is None else int(max_repair_moves)


def _rounds(ids: np.ndarray, cell: np.ndarray, m_count: int, dp_size: int) -> Grid:
    """``rounds[m][d]``: the ids whose ``cell`` is ``m * dp_size + d``, ascending (pack order
    inside a microbatch is dataloader order; ``ids`` ascend), as a :class:`Grid` (one sorted
    array and the count of every cell)."""
    n = ids.shape[0]
    cells = m_count * dp_size
    # Unique int64 keys (cell, position): the fast sort gives the stable order.
    by_cell = (
        np.argsort(cell * n + np.arange(n, dtype=np.int64)) if cells * n < 2**62 else np.argsort(cell, kind="stable")
    )
    counts = np.bincount(cell, minlength=cells) if n else np.zeros(cells, np.int64)
    return Grid(ids[by_cell], counts, dp_size)


def relabel_replicas(replica_of: np.ndarray, origin: np.ndarray, weight: np.ndarray, dp_size: int) -> np.ndarray:
    """The DP rank of every sequence once each plan replica runs on the rank already holding
    most of its tokens (greedy matching over the (replica, rank) pairs that share a sequence,
    heaviest overlap first; ties: lower replica, then lower rank). Changes no cost and no
    microbatch, only how many tokens cross the network; ``O(N log N + dp)``, never ``dp * dp``."""
    if replica_of.size == 0 or dp_size == 1:
        return replica_of
    replica_of = np.asarray(replica_of, dtype=np.int64)
    pair = replica_of * dp_size + np.asarray(origin, dtype=np.int64)  # < dp**2: exact in int64 for dp < 3e9
    by_pair = np.argsort(pair)  # groups equal pairs; order within a group does not matter
    sorted_pair = pair[by_pair]
    starts = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
    overlap = np.add.reduceat(np.asarray(weight, dtype=np.int64)[by_pair], starts)
    keys = sorted_pair[starts]  # ascending: (replica, rank) order
    rows, cols = keys // dp_size, keys % dp_size
    top = int(overlap.max())
    if (top + 1) * keys.shape[0] < 2**62:  # heaviest first, ties in (replica, rank) order
        best_first = np.argsort((top - overlap) * keys.shape[0] + np.arange(keys.shape[0]))
    else:
        best_first = np.lexsort((cols, rows, -overlap))
    rank_of_replica = _kernels.greedy_matching(rows[best_first], cols[best_first], dp_size)
    return rank_of_replica[replica_of]


def round_position(load: np.ndarray, order: str = "heavy_first") -> np.ndarray:
    """Position (microbatch index) of every round given ``load[M, dp]``.

    ``"heavy_first"``: by round maximum, heaviest first. ``"pipeline"``: lightest rounds at
    both ends, alternating (lightest first, second lightest last, ...), heaviest in the
    middle. Ties keep round order. ``"as_planned"``: the planner's round order.
    """
    order = check_choice("order", order, Order)
    m_count = load.shape[0]
    if m_count == 0 or order == Order.AS_PLANNED:
        return np.arange(m_count, dtype=np.int64)
    peak = load.max(axis=1)
    heavy_first = np.lexsort((np.arange(m_count), -peak))
    position = np.empty(m_count, dtype=np.int64)
    if order == Order.HEAVY_FIRST:
        position[heavy_first] = np.arange(m_count)
        return position
    k = np.arange(m_count)
    position[heavy_first[::-1]] = np.where(k % 2 == 0, k // 2, m_count - 1 - k // 2)
    return position


def more_rounds(
    plan: BalancedPlan, seqs: Sequences, step: int, plan_at: Callable[[int], BalancedPlan | None]
) -> BalancedPlan:
    """The count search: the microbatch count with the shortest predicted step, from ``plan``
    at the fewest that fit (docs/schedulers.md). ``plan_at(m)``: the plan at ``m`` rounds.

    Counts ``M + step, M + 2*step, ...`` are tried while the predicted step time drops; a
    larger count is kept only when it predicts a step at least 1% faster than the best
    smaller one (any faster while the best needed a fallback bin rule), and tried only while
    it could be (no plan at ``M'`` rounds predicts less than ``base + M' * constant``). At most
    ``_MAX_EXTRA_ROUNDS`` counts, never more than one sequence per microbatch of every replica.
    """
    padded, costs = seqs.padded, seqs.costs
    if not costs.size or float(costs.max()) <= 0:
        return plan  # CostModel(0, 0, c): each microbatch only adds its constant
    if seqs.sync == Sync.LOCKSTEP:  # base: the round bound, or under replica sync the replica bound
        # The fill order saves the bound's sort where it is a density order (the bound checks:
        # costliest first with a sample cost need not be, and would overstate the bound).
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
