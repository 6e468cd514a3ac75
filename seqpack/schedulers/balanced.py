"""``"balanced"``: FLOPs-aware packing that balances DP replicas and microbatch rounds.

A step's cost is what its slowest rank waits for. Two waits matter:

* DDP / ZeRO-1 / pipeline parallel: each replica runs its microbatches back to back and
  syncs gradients once, so the step waits for the replica with the largest total cost.
* FSDP: every microbatch ends with collectives over all replicas, so each round ``m`` waits
  for its slowest replica: the step costs ``sum_m max_d cost[m, d]``.

The plan, for the padded lengths ``p_i`` and costs ``c_i = cost(p_i)`` (attention's
quadratic term included):

1. **Microbatches.** Start at the token lower bound ``M = ceil(sum p / (dp * capacity))``
   (at least ``min_microbatches``, rounded up to ``microbatch_multiple``).
2. **Bins.** Fill ``dp * M`` bins of ``capacity`` tokens, longest sequence first, each into
   the bin furthest below its cost target (LPT with targets; ties: fewer tokens, then lower
   index). Bin targets are set per round: round ``m`` aims at
   ``max(cost of the (m*dp+1)-th costliest sequence, remaining cost / remaining rounds)``, so
   when a few sequences cost more than an average microbatch, every replica builds an
   equally heavy microbatch for that round instead of leaving one replica overloaded.
3. **Rounds.** Sort the bins by cost and deal them into rounds of ``dp`` (round 0 the
   heaviest): the grouping that minimizes ``sum_m max_d``. Inside each round, the heaviest
   bin goes to the replica with the least cost so far, which balances replica totals
   without touching any round's maximum.
4. **Repair.** Bins of equal target cost still add up to unequal replica totals (a replica
   holding a round-0 bin of one long sequence may get full bins in later rounds). The
   repair moves single sequences off the most loaded replica into any microbatch of a
   lighter one, or swaps one with a cheaper sequence of one of the 4 lightest replicas,
   within capacity, whenever the pair's larger total drops. What it may cost the rounds is
   the ``objective``: ``"rounds"`` never lets ``sum_m max_d`` grow; ``"replicas"`` ignores
   it; ``"both"`` (default) first repairs without slowing the rounds and, only if the
   busiest replica is then further from its bound than the rounds are from theirs
   (:func:`seqpack.stats.round_sum_lower_bound`), bisects on how much slower the rounds
   may get, keeping the plan whose worse ratio to its bound is lowest. That happens when
   a few sequences come close to a whole microbatch. The repair stops within 0.1% of the
   replica bound, or after a bounded amount of work. Then each replica's microbatches are
   sorted heaviest first, which only lowers ``sum_m max_d``.
Fewer bytes moved, at no cost in balance: equally long sequences are taken in an order
interleaved by the rank that holds them (``origin``), which keeps them on that rank (with
equal lengths nothing moves), and the finished replicas are renamed so that each runs on
the DP rank already holding most of its tokens (:func:`relabel_replicas`). With
``locality`` (default), a plan at the same microbatch count that keeps more samples where
they are (built from each rank's own samples, or this one with sequences brought home by
swaps of equal cost) replaces this one when it predicts at most 0.1% more step time and
moves fewer tokens (:mod:`seqpack.schedulers.locality`). Pack order inside a microbatch is
ascending global id.

5. **Order.** Rounds run heaviest first (a memory peak shows up at the first microbatch),
   or with ``order="pipeline"`` light rounds at both ends and heavy ones in the middle,
   which shortens pipeline warm-up and cool-down bubbles.

**When M grows.** ``M`` starts at the fewest microbatches any packing needs (Martello-Toth's
bin bound ``L2``, at least the token bound). If no bin has room for a sequence at ``M`` (bins
fill unevenly because cost-balanced bins hold different token counts), the same ``M`` is
retried balancing tokens (worst-fit), then first-fit, then with a bounded exact search
(:mod:`seqpack.schedulers._exact`); only when all fail does ``M`` grow. Then
(:func:`_more_rounds`):

* without a ``sync``, the plan at ``M`` is compared with the plan at ``M+1`` when it needed
  a fallback or ends more than 1% above its lower bounds (replica total or round sum), on
  the estimate ``max_d total_d + sum_m max_d cost[m, d]`` (constants included): ``M+1`` is
  kept after a fallback if it is cheaper at all, otherwise only if it is at least 1% cheaper;
* with a ``sync``, ``balanced`` looks for the count that minimises the predicted step time
  of that sync (:func:`step_objective`: ``"lockstep"`` ``sum_m max_d``, ``"replica"``
  ``max_d sum_m``), per-microbatch ``constant`` included: ``M+1, M+2, ...`` while the
  prediction keeps dropping, a larger count kept when at least 1% faster. With FLOPs (no
  constant) extra microbatches are free in the model, so on a launch-bound GPU pass a
  constant or calibrate (:mod:`seqpack.calibrate`). A given ``sync`` also sets the repair's
  objective (``"lockstep"``: rounds, ``"replica"``: replicas).

Without a cost model, ``balanced`` balances the training FLOPs of a Llama-3-8B shaped
model (:func:`seqpack.cost.default_cost_model`). Pass the same cost model to
:meth:`seqpack.stats.StepStats.from_schedule` to account a schedule in the units it was
balanced in (``scheduler.resolve_cost(cost)`` returns it).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import ConfigError, ScheduleError
from seqpack.options import Objective, Order, Sync
from seqpack.schedulers import _exact, _kernels
from seqpack.schedulers.base import Scheduler, check_microbatches
from seqpack.schedulers.locality import TOLERANCE, heaviest_first, plan_local
from seqpack.stats import round_sum_lower_bound, step_objective
from seqpack.thd import padded_lengths
from seqpack.validation import (
    INT64_MAX,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_optional_int,
    check_positive_int,
)

logger = logging.getLogger(__name__)

ORDERS = tuple(Order)
OBJECTIVES = tuple(Objective)
_GOOD_ENOUGH = 1e-3  # the repair stops within 0.1% of the replica bound
_SWAP_CANDIDATES = 4  # lightest replicas the repair tries swaps with
_GAP_FOR_MORE = 0.01  # a plan this far (1%) from its bounds tries one more microbatch...
_BETTER_BY = 0.01  # ... and keeps it when the estimated step cost drops by 1% or more
_BISECTION_STEPS = 4  # repair budgets tried when replica and round balance conflict
_REPAIR_WORK = 10_000_000  # candidate evaluations before the repair stops (~0.1-0.3 s)
_MAX_EXTRA_ROUNDS = 16  # microbatch counts tried beyond the first feasible one


@dataclasses.dataclass(frozen=True)
class BalancedPlan:
    """Where every sequence goes, before ids are turned into per-microbatch arrays.

    Attributes:
        num_microbatches: Rounds ``M``.
        round_of, replica_of: Per sequence (position in the input), its round and replica.
        load: Cost of every microbatch ``[M, dp]``, without the per-microbatch constant.
        tokens: Padded tokens of every microbatch ``[M, dp]``.
        mode: Bin rule that succeeded: 0 cost targets, 1 tokens (worst-fit), 2 first-fit,
            3 the exact search (:mod:`seqpack.schedulers._exact`).
        repair_moves: Sequences moved by the repair pass.
        objective: Predicted step time (constants included) under the ``sync`` the plan was
            made for (:func:`step_objective`).
        gap: How far the worse of replica total and round sum is from its lower bound
            (0.01 = 1% above).
        bin_lower_bound: Fewest microbatches any packing needs, per replica:
            ``ceil(L2 / dp)`` with Martello-Toth's bin bound ``L2`` (at least the token
            bound ``ceil(padded tokens / (dp * capacity))``).
    """

    num_microbatches: int
    round_of: np.ndarray
    replica_of: np.ndarray
    load: np.ndarray
    tokens: np.ndarray
    mode: int
    repair_moves: int
    objective: float
    gap: float = 0.0
    bin_lower_bound: int = 0


def _placement_order(padded: np.ndarray, origin: np.ndarray | None) -> np.ndarray:
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
    """Per-round cost target of one microbatch (see the module docstring, step 2).

    Args:
        sorted_costs: Sequence costs, costliest first.
        dp_size, num_rounds: Grid shape.
    """
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


def _objective(load: np.ndarray, constant: float, sync: str | None = None) -> float:
    """:func:`step_objective` of a plan's ``load[M, dp]`` (costs without constants)."""
    return step_objective(load + constant, sync)


def _objective_bound(
    padded: np.ndarray, costs: np.ndarray, order: np.ndarray, dp_size: int, capacity: int, sync: str | None
) -> tuple[float, int]:
    """``(base, per_round)``: no plan with ``M`` rounds predicts a step faster than
    ``base + per_round * M * constant`` (replica bound ``max(total / dp, costliest
    sequence)``, round bound :func:`round_sum_lower_bound`; every replica runs ``M``
    microbatches and every round waits ``constant`` at least)."""
    replica = max(float(costs.sum()) / dp_size, float(costs.max()))
    rounds = round_sum_lower_bound(padded, costs, dp_size, capacity, order=order)
    if sync == Sync.LOCKSTEP:
        return rounds, 1
    if sync == Sync.REPLICA:
        return replica, 1
    return replica + rounds, 2


def objective_for(objective: Objective, sync: str | None) -> Objective:
    """What to balance: with a ``sync`` the step waits for rounds (lockstep) or for replicas
    alone, and the plan is repaired for that; without one, ``objective``."""
    if sync is None:
        return objective
    return Objective.ROUNDS if check_choice("sync", sync, Sync) == Sync.LOCKSTEP else Objective.REPLICAS


def repair_budget(max_repair_moves: int | None, dp_size: int) -> int:
    """Cap on repair moves: ``max_repair_moves``, by default ``8 * dp_size + 64``."""
    return 8 * dp_size + 64 if max_repair_moves is None else int(max_repair_moves)


def _sorted_round_sum(load: np.ndarray) -> float:
    """``sum_m max_d`` once every replica's microbatches are sorted heaviest first."""
    return float((-np.sort(-load, axis=0)).max(axis=1).sum()) if load.size else 0.0


def _repair(
    round_of,
    replica_of,
    load,
    tokens,
    padded,
    costs,
    order,
    dp_size,
    capacity,
    max_moves,
    objective,
    stop_at=None,
    max_work=_REPAIR_WORK,
):
    """Step 4 of the module docstring. Returns the repaired (round_of, replica_of, load,
    tokens, moves). ``stop_at``: busiest replica's cost at which to stop (default 0.1%
    above the bound); ``max_work``: candidate evaluations before it stops."""
    replica_bound = max(float(costs.sum()) / dp_size, float(costs.max()))
    if replica_bound <= 0:  # CostModel(0, 0, c): sequences cost nothing, there is nothing to balance
        return round_of, replica_of, load, tokens, 0
    round_bound = round_sum_lower_bound(padded, costs, dp_size, capacity, order=order)
    if stop_at is None:
        stop_at = (1 + _GOOD_ENOUGH) * replica_bound

    def run(budget):
        state = (round_of.copy(), replica_of.copy(), load.copy(), tokens.copy())
        moves = _kernels.repair_replicas(
            state[0],
            state[1],
            costs,
            padded,
            state[2],
            state[3],
            capacity,
            max_moves,
            1e-9,
            stop_at,
            _SWAP_CANDIDATES,
            budget,
            max_work,
        )
        replica = float(state[2].sum(axis=0).max()) / replica_bound
        rounds = _sorted_round_sum(state[2]) / round_bound
        return (*state, int(moves)), replica, rounds

    if objective == Objective.REPLICAS:
        return run(np.inf)[0]
    strict, replica, rounds = run(0.0)
    if objective == Objective.ROUNDS or replica <= rounds + _GOOD_ENOUGH:
        return strict
    # The goals conflict: find how much slower the rounds may get so that both end the same
    # distance from their bounds (bisection on the budget of sum_m max_d, up to where the
    # rounds would be as far from their bound as the busiest replica is now).
    best, best_score = strict, max(replica, rounds)
    low, high = rounds * round_bound, replica * round_bound
    for _ in range(_BISECTION_STEPS):
        budget = (low + high) / 2
        candidate, c_replica, c_rounds = run(budget)
        if max(c_replica, c_rounds) < best_score:
            best, best_score = candidate, max(c_replica, c_rounds)
        if c_replica > c_rounds:
            low = budget
        else:
            high = budget
    return best


def _plan_at(
    padded: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    dp_size: int,
    capacity: int,
    num_rounds: int,
    constant: float,
    max_repair_moves: int,
    objective: str = "both",
    sync: str | None = None,
) -> BalancedPlan | None:
    """The plan with exactly ``num_rounds`` rounds, or None when neither a bin rule nor
    the exact search (:func:`seqpack.schedulers._exact.pack_bins`) packs the sequences."""
    targets = np.repeat(round_targets(costs[order], dp_size, num_rounds), dp_size)
    for mode in (_kernels.MODE_COST, _kernels.MODE_TOKENS, _kernels.MODE_FIRST_FIT):
        ok, bin_of, bin_load, _ = _kernels.grid_lpt(order, padded, costs, targets, capacity, mode)
        if ok:
            break
    else:
        # Greedy rules can miss a packing that exists (first-fit decreasing may need 11/9
        # of the optimal bins): search exactly, within a bounded amount of work.
        status, bin_of = _exact.pack_bins(padded, dp_size * num_rounds, capacity)
        if status != _exact.FOUND:
            return None
        logger.debug(
            "exact search packed %d sequences of %d tokens into %d x %d microbatches of %d tokens (greedy failed)",
            padded.shape[0],
            int(padded.sum()),
            num_rounds,
            dp_size,
            capacity,
        )
        mode = _exact.MODE_EXACT
        bin_load = np.bincount(bin_of, weights=costs, minlength=dp_size * num_rounds)
    round_of_bin, replica_of_bin = _arrange(bin_load, dp_size, num_rounds)
    round_of = round_of_bin[bin_of]
    replica_of = replica_of_bin[bin_of]
    shape = (num_rounds, dp_size)
    load = _grid(costs, round_of, replica_of, shape)
    tokens = _grid(padded, round_of, replica_of, shape)
    moves = 0
    balances = bool(costs.size) and float(costs.max()) > 0  # CostModel(0, 0, c): nothing to balance
    if max_repair_moves > 0 and dp_size > 1 and balances:
        round_of, replica_of, load, tokens, moves = _repair(
            round_of, replica_of, load, tokens, padded, costs, order, dp_size, capacity, max_repair_moves, objective
        )
    # Each replica's microbatches heaviest first: the alignment that minimizes sum_m max_d.
    round_of, load, tokens = heaviest_first(round_of, replica_of, load, tokens)
    gap = 0.0
    if balances and num_rounds:
        replica_bound = max(float(costs.sum()) / dp_size, float(costs.max()))
        round_bound = round_sum_lower_bound(padded, costs, dp_size, capacity, order=order)
        gap = max(float(load.sum(axis=0).max()) / replica_bound, float(load.max(axis=1).sum()) / round_bound) - 1.0
    return BalancedPlan(
        num_rounds, round_of, replica_of, load, tokens, mode, moves, _objective(load, constant, sync), gap
    )


def plan_balanced(
    padded: np.ndarray,
    costs: np.ndarray,
    *,
    dp_size: int,
    capacity: int,
    constant: float = 0.0,
    min_microbatches: int = 1,
    microbatch_multiple: int = 1,
    num_microbatches: int | None = None,
    max_repair_moves: int | None = None,
    objective: str = "both",
    origin: np.ndarray | None = None,
    sync: str | None = None,
) -> BalancedPlan:
    """Assign sequences to ``[rounds, replicas]`` (module docstring, steps 1-4).

    Args:
        padded: int64 padded lengths, each at most ``capacity``.
        costs: float64 cost of each sequence (without the per-microbatch constant).
        dp_size, capacity: Replicas and padded tokens per microbatch.
        constant: Per-microbatch cost, used when comparing microbatch counts.
        min_microbatches: Lower limit on ``M`` (e.g. pipeline stages).
        microbatch_multiple: ``M`` is a multiple of this (e.g. Megatron's
            ``microbatch_group_size_per_vp_stage`` under interleaved pipelines).
        num_microbatches: Use exactly this ``M``.
        max_repair_moves: Cap on repair moves (default ``8 * dp_size + 64``).
        objective: What the repair trades (module docstring, step 4): ``"both"``,
            ``"rounds"`` or ``"replicas"``; used when ``sync`` is ``None``.
        origin: DP rank holding each sequence. Only breaks ties between equally long
            sequences, so that they stay where they are when that costs nothing: with
            equal lengths, no sample moves.
        sync: The step time ``M`` is chosen for (:func:`step_objective`):
            ``"lockstep"``, ``"replica"``, or ``None`` (their sum). A given sync also sets
            the repair: ``"lockstep"`` repairs as ``objective="rounds"``, ``"replica"``
            as ``"replicas"``.

    Raises:
        ValueError: A sequence longer than ``capacity``, or ``num_microbatches`` too small
            to hold the sequences.
    """
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    n = padded.shape[0]
    if costs.shape != padded.shape:
        raise ConfigError(f"costs has shape {costs.shape}, lengths {padded.shape}")
    if n and padded.max() > capacity:
        i = int(np.argmax(padded))
        raise ScheduleError(f"sequence {i} has {int(padded[i])} padded tokens > capacity {capacity}")
    sync = None if sync is None else check_choice("sync", sync, Sync)
    objective = objective_for(check_choice("objective", objective, Objective), sync)
    repair = repair_budget(max_repair_moves, dp_size)
    order = _placement_order(padded, origin)
    bins_needed = _exact.bin_lower_bound(padded, capacity)
    fewest = -(-bins_needed // dp_size)
    if num_microbatches is not None:
        plan = _plan_at(padded, costs, order, dp_size, capacity, num_microbatches, constant, repair, objective, sync)
        if plan is None:
            need = -(-int(padded.sum()) // (dp_size * capacity))
            proof = (
                f"; at least {fewest} are needed: {bins_needed} microbatches of capacity {capacity} over {dp_size} "
                "replicas (Martello-Toth bin bound)"
                if fewest > num_microbatches
                else "; the exact search found no packing within its work limit"
            )
            raise ScheduleError(
                f"num_microbatches={num_microbatches} cannot hold {n} sequences of {int(padded.sum())} padded tokens "
                f"in {dp_size} replicas of capacity {capacity} (the token lower bound alone is {need}){proof}"
            )
        return dataclasses.replace(plan, bin_lower_bound=fewest)
    if n == 0:
        return _plan_at(padded, costs, order, dp_size, capacity, 0, constant, 0, sync=sync)  # type: ignore[return-value]
    lower = max(fewest, min_microbatches, 1)
    m = -(-lower // microbatch_multiple) * microbatch_multiple
    while True:
        plan = _plan_at(padded, costs, order, dp_size, capacity, m, constant, repair, objective, sync)
        if plan is not None:
            break
        m += microbatch_multiple
    plan = _more_rounds(
        plan, padded, costs, order, dp_size, capacity, constant, repair, objective, sync, microbatch_multiple
    )
    return dataclasses.replace(plan, bin_lower_bound=fewest)


def _more_rounds(
    plan: BalancedPlan,
    padded: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    dp_size: int,
    capacity: int,
    constant: float,
    repair: int,
    objective: str,
    sync: str | None,
    step: int,
) -> BalancedPlan:
    """The microbatch count with the shortest predicted step (module docstring).

    Without a ``sync`` (the behaviour before sync existed): ``M + step`` is tried once, when
    the plan needed a fallback bin rule or ends more than 1% above its bounds, and kept when
    its estimate (the sum of both step times) is at least 1% lower (any lower after a
    fallback).

    With a ``sync``: counts ``M + step, M + 2*step, ...`` are tried while the predicted step
    time keeps dropping, and the best kept, a larger count only when it predicts a step at
    least 1% faster than the best smaller one (any faster while the best needed a fallback
    bin rule). A count is tried only when it could be 1% faster: no plan with ``M'`` rounds
    predicts less than ``base + per_round * M' * constant`` (:func:`_objective_bound`), which
    grows with ``M'``, so the search stops for good once the best plan is within 1% of the
    next count's bound (right away for most batches). At most ``_MAX_EXTRA_ROUNDS`` counts,
    never more than one sequence per microbatch of every replica.
    """
    if not costs.size or float(costs.max()) <= 0:
        return plan  # CostModel(0, 0, c): each microbatch only adds its constant
    if sync is None:
        fallback = plan.mode != _kernels.MODE_COST
        if not fallback and plan.gap <= _GAP_FOR_MORE:
            return plan
        more = _plan_at(
            padded, costs, order, dp_size, capacity, plan.num_microbatches + step, constant, repair, objective
        )
        if more is None:
            return plan
        return more if more.objective < plan.objective * (1.0 if fallback else 1.0 - _BETTER_BY) else plan
    base, per_round = _objective_bound(padded, costs, order, dp_size, capacity, sync)
    limit = max(plan.num_microbatches, -(-padded.shape[0] // dp_size))
    best = previous = plan
    for _ in range(_MAX_EXTRA_ROUNDS):
        m = previous.num_microbatches + step
        greedy = best.mode == _kernels.MODE_COST
        if m > limit or (greedy and best.objective <= (base + per_round * m * constant) * (1 + _GAP_FOR_MORE)):
            break
        candidate = _plan_at(padded, costs, order, dp_size, capacity, m, constant, repair, objective, sync)
        if candidate is None:
            break
        if candidate.objective < best.objective * (1.0 - _BETTER_BY if greedy else 1.0):
            best = candidate
        if candidate.objective >= previous.objective:
            break  # the prediction stopped dropping
        previous = candidate
    return best


class BalancedScheduler(Scheduler):
    """FLOPs-aware scheduler balancing replica totals and per-round maxima (module docs).

    Args:
        order: ``"heavy_first"`` (default) or ``"pipeline"`` (light microbatches at both
            ends, heavy ones in the middle).
        min_microbatches: At least this many microbatches (e.g. pipeline stages).
        microbatch_multiple: Microbatch count is a multiple of this.
        num_microbatches: Force exactly this many microbatches.
        max_repair_moves: Cap on the repair pass (default ``8 * dp + 64``; 0 disables it).
        objective: ``"both"`` (default): balance replica totals and per-round maxima;
            where they conflict, keep both equally close to their lower bounds.
            ``"rounds"`` (FSDP): never make the rounds slower. ``"replicas"`` (DDP,
            ZeRO-1, pipeline parallel: rounds do not sync): balance replica totals only.
        locality: Keep sequences on the DP rank that read them where that predicts at
            most ``locality_tolerance`` more step time, at the same microbatch count
            (:mod:`seqpack.schedulers.locality`; default on). ``False``: plan for balance
            alone, then only rename replicas.
        locality_tolerance: Relative step-time increase a local plan may cost (default
            0.001, i.e. 0.1%).
    """

    name = "balanced"

    def __init__(
        self,
        *,
        order: str = "heavy_first",
        min_microbatches: int = 1,
        microbatch_multiple: int = 1,
        num_microbatches: int | None = None,
        max_repair_moves: int | None = None,
        objective: str = "both",
        locality: bool = True,
        locality_tolerance: float = TOLERANCE,
    ) -> None:
        order = check_choice("order", order, Order)
        objective = check_choice("objective", objective, Objective)
        check_int("min_microbatches", min_microbatches, minimum=0)
        check_positive_int("microbatch_multiple", microbatch_multiple)
        check_optional_int("num_microbatches", num_microbatches, minimum=0)
        check_optional_int("max_repair_moves", max_repair_moves, minimum=0, maximum=INT64_MAX)
        self.order = order
        self.min_microbatches = int(min_microbatches)
        self.microbatch_multiple = int(microbatch_multiple)
        self.num_microbatches = None if num_microbatches is None else int(num_microbatches)
        self.max_repair_moves = None if max_repair_moves is None else int(max_repair_moves)
        self.objective = objective
        self.locality = check_bool("locality", locality)
        self.locality_tolerance = check_number("locality_tolerance", locality_tolerance, minimum=0.0)

    def resolve_cost(self, cost: CostModel | None) -> CostModel:
        """The cost model this scheduler balances: ``cost``, or the default model's FLOPs."""
        return default_cost_model() if cost is None else cost

    uses_sync = True

    def _plan(self, ids, lengths, *, dp_size, capacity, pad_multiple, cost, origin, sync=None):
        model = self.resolve_cost(cost)
        if ids.size or self.num_microbatches:
            check_microbatches(
                dp_size,
                min_microbatches=self.min_microbatches,
                microbatch_multiple=self.microbatch_multiple,
                num_microbatches=self.num_microbatches,
            )
        padded = padded_lengths(lengths, pad_multiple)
        costs = model.cost(padded)
        with np.errstate(over="ignore"):
            step_cost = float(costs.sum()) + model.constant * max(dp_size, 1)
        if not np.isfinite(step_cost):
            raise ConfigError(f"the step's total cost under {model!r} is past float64: scale the coefficients down")
        plan = plan_balanced(
            padded,
            costs,
            dp_size=dp_size,
            capacity=capacity,
            constant=model.constant,
            min_microbatches=self.min_microbatches,
            microbatch_multiple=self.microbatch_multiple,
            num_microbatches=self.num_microbatches,
            max_repair_moves=self.max_repair_moves,
            objective=self.objective,
            origin=origin,
            sync=sync,
        )
        replica = relabel_replicas(plan.replica_of, origin, padded, dp_size)
        # Locality is judged by the step time the plan was made for: the sync's when given.
        objective = objective_for(self.objective, sync)
        if self.locality and dp_size > 1:
            local = plan_local(
                padded,
                costs,
                origin,
                plan,
                dp_size=dp_size,
                capacity=capacity,
                constant=model.constant,
                objective=objective,
                max_repair_moves=self.max_repair_moves,
                tolerance=self.locality_tolerance,
                reference_ranks=replica,
            )
            if local is not None:
                plan, replica = local
        m_count = plan.num_microbatches
        position = round_position(plan.load, self.order)
        return _rounds(ids, position[plan.round_of] * dp_size + replica, m_count, dp_size), np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"BalancedScheduler(order={self.order!r}, objective={self.objective!r}, "
            f"min_microbatches={self.min_microbatches}, microbatch_multiple={self.microbatch_multiple}, "
            f"num_microbatches={self.num_microbatches}, max_repair_moves={self.max_repair_moves}, "
            f"locality={self.locality}, locality_tolerance={self.locality_tolerance})"
        )


def _rounds(ids: np.ndarray, cell: np.ndarray, m_count: int, dp_size: int) -> list[list[np.ndarray]]:
    """``rounds[m][d]``: the ids whose ``cell`` is ``m * dp_size + d``, ascending (pack order
    inside a microbatch is dataloader order; ``ids`` ascend). Views of one sorted array."""
    n = ids.shape[0]
    cells = m_count * dp_size
    # Unique int64 keys (cell, position): the fast sort gives the stable order.
    by_cell = (
        np.argsort(cell * n + np.arange(n, dtype=np.int64)) if cells * n < 2**62 else np.argsort(cell, kind="stable")
    )
    ends = np.cumsum(np.bincount(cell, minlength=cells) if n else np.zeros(cells, np.int64)).tolist()
    sorted_ids = ids[by_cell]
    starts = [0, *ends[:-1]] if ends else []
    pieces = [sorted_ids[a:b] for a, b in zip(starts, ends, strict=True)]  # np.split is 10x slower
    return [pieces[m * dp_size : (m + 1) * dp_size] for m in range(m_count)]


def relabel_replicas(replica_of: np.ndarray, origin: np.ndarray, weight: np.ndarray, dp_size: int) -> np.ndarray:
    """Rename replicas so that each plan replica runs on the DP rank already holding most of
    its tokens (greedy matching over the (replica, rank) pairs that share tokens, heaviest
    overlap first; ties: lower replica, then lower rank).

    Renaming replicas changes no cost, no balance figure and no microbatch: only which rank
    runs which replica's work, so fewer tokens cross the network in the exchange. Only
    pairs that share a sequence are candidates (at most one per sequence): time and memory
    are ``O(N log N + dp)``, never ``dp * dp``.

    Returns:
        The DP rank of every sequence.
    """
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
    middle. Ties keep round order.
    """
    order = check_choice("order", order, Order)
    m_count = load.shape[0]
    if m_count == 0:
        return np.zeros(0, dtype=np.int64)
    peak = load.max(axis=1)
    heavy_first = np.lexsort((np.arange(m_count), -peak))
    position = np.empty(m_count, dtype=np.int64)
    if order == Order.HEAVY_FIRST:
        position[heavy_first] = np.arange(m_count)
        return position
    light_first = heavy_first[::-1]
    left, right = 0, m_count - 1
    for k, r in enumerate(light_first):
        if k % 2 == 0:
            position[r] = left
            left += 1
        else:
            position[r] = right
            right -= 1
    return position
