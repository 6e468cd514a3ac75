"""Steps 1-4 of the balanced plan at a microbatch count, and the search over counts
(:func:`plan_balanced`).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from seqpack.errors import ConfigError, ScheduleError
from seqpack.options import Objective, Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced import exact as _exact
from seqpack.schedulers.balanced import stages
from seqpack.schedulers.balanced.repair import _repair
from seqpack.schedulers.balanced.replicas import keep_lighter
from seqpack.schedulers.balanced.rounds import (
    _BETTER_BY,
    _GAP_FOR_MORE,
    _MAX_EXTRA_ROUNDS,
    BalancedPlan,
    _arrange,
    _grid,
    _objective,
    _objective_bound,
    _placement_order,
    objective_for,
    repair_budget,
    round_targets,
)
from seqpack.schedulers.objective import round_sum_lower_bound
from seqpack.schedulers.static_limits import BucketPrice
from seqpack.validation import check_choice

logger = logging.getLogger(__name__)


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
    forced: bool = False,
    price: BucketPrice | None = None,
) -> BalancedPlan | None:
    """The plan with exactly ``num_rounds`` rounds, or None when neither a bin rule nor
    the exact search (:func:`seqpack.schedulers.balanced.exact.pack_bins`) packs the sequences.
    ``forced``: the count was given (no count search follows; :func:`keep_lighter`).
    ``price``: the objective includes each microbatch's bucket padding (``static_shapes``)."""
    packed = _bins(padded, costs, order, dp_size, capacity, num_rounds)
    if packed is None:
        return None
    mode, bin_of, bin_load = packed
    round_of_bin, replica_of_bin = _arrange(bin_load, dp_size, num_rounds)
    round_of = round_of_bin[bin_of]
    replica_of = replica_of_bin[bin_of]
    shape = (num_rounds, dp_size)
    load = _grid(costs, round_of, replica_of, shape)
    tokens = _grid(padded, round_of, replica_of, shape)
    moves = 0
    balances = bool(costs.size) and float(costs.max()) > 0  # CostModel(0, 0, c): nothing to balance
    if max_repair_moves > 0 and dp_size > 1 and balances:
        if stages.enabled("repair"):
            round_of, replica_of, load, tokens, moves = _repair(
                round_of, replica_of, load, tokens, padded, costs, order, dp_size, capacity, max_repair_moves, objective
            )
        # Heavy tails: partitioning replicas first may do better.
        if objective == Objective.REPLICAS and stages.enabled("replica_first"):
            round_of, replica_of, load, tokens, moves = keep_lighter(
                (round_of, replica_of, load, tokens, moves),
                padded,
                costs,
                order,
                dp_size,
                capacity,
                max_repair_moves,
                forced=forced,
            )
    gap = 0.0
    if balances and num_rounds:
        replica_bound = max(float(costs.sum()) / dp_size, float(costs.max()))
        round_bound = round_sum_lower_bound(padded, costs, dp_size, capacity, order=order)
        gap = max(float(load.sum(axis=0).max()) / replica_bound, float(load.max(axis=1).sum()) / round_bound) - 1.0
    priced = load if price is None else load + price.extra(tokens)
    return BalancedPlan(
        num_rounds, round_of, replica_of, load, tokens, mode, moves, _objective(priced, constant, sync), gap
    )


def _bins(
    padded: np.ndarray, costs: np.ndarray, order: np.ndarray, dp_size: int, capacity: int, num_rounds: int
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(rule, bin of each sequence, cost of each bin)``: the first bin rule that packs the
    sequences into ``dp_size * num_rounds`` microbatches, else the exact search; None when
    neither does."""
    if stages.enabled("round_targets"):
        targets = np.repeat(round_targets(costs[order], dp_size, num_rounds), dp_size)
    else:
        targets = np.full(dp_size * num_rounds, float(costs.sum()) / max(dp_size * num_rounds, 1))
    rules = [_kernels.MODE_COST]
    if stages.enabled("token_rules"):
        rules += [_kernels.MODE_TOKENS, _kernels.MODE_FIRST_FIT]
    for mode in rules:
        ok, bin_of, bin_load, _ = _kernels.grid_lpt(order, padded, costs, targets, capacity, mode)
        if ok:
            return mode, bin_of, bin_load
    # Greedy rules can miss a packing that exists (first-fit decreasing may need 11/9 of the
    # optimal bins): search exactly, within a bounded amount of work.
    if not stages.enabled("exact_search"):
        return None
    status, bin_of = _exact.pack_bins(padded, dp_size * num_rounds, capacity, found_only=True)
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
    return _exact.MODE_EXACT, bin_of, np.bincount(bin_of, weights=costs, minlength=dp_size * num_rounds)


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
    price: BucketPrice | None = None,
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
        price: Under ``static_shapes``, the bucket padding's cost
            (:class:`~seqpack.schedulers.static_limits.BucketPrice`): added to every
            microbatch's cost where counts are compared.

    Raises:
        ValueError: A sequence longer than ``capacity``, or ``num_microbatches`` too small
            to hold the sequences.
    """
    padded, costs = _checked(padded, costs, capacity)
    n = padded.shape[0]
    sync = None if sync is None else check_choice("sync", sync, Sync)
    objective = objective_for(check_choice("objective", objective, Objective), sync)
    repair = repair_budget(max_repair_moves, dp_size)
    order = _placement_order(padded, origin)
    bins_needed = _exact.bin_lower_bound(padded, capacity)
    fewest = -(-bins_needed // dp_size)
    if num_microbatches is not None:
        args = (padded, costs, order, dp_size, capacity, num_microbatches, constant, repair, objective, sync)
        plan = _plan_at(*args, forced=True, price=price)
        if plan is None:
            raise _cannot_hold(padded, dp_size, capacity, num_microbatches, bins_needed)
        return dataclasses.replace(plan, bin_lower_bound=fewest)
    if n == 0:
        return _plan_at(padded, costs, order, dp_size, capacity, 0, constant, 0, sync=sync)  # type: ignore[return-value]
    lower = max(fewest, min_microbatches, 1)
    m = -(-lower // microbatch_multiple) * microbatch_multiple
    while True:
        plan = _plan_at(padded, costs, order, dp_size, capacity, m, constant, repair, objective, sync, price=price)
        if plan is not None:
            break
        m += microbatch_multiple
    plan = _more_rounds(
        plan, padded, costs, order, dp_size, capacity, constant, repair, objective, sync, microbatch_multiple, price
    )
    return dataclasses.replace(plan, bin_lower_bound=fewest)


def _checked(padded: np.ndarray, costs: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``plan_balanced``'s lengths and costs as contiguous arrays, checked."""
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    if costs.shape != padded.shape:
        raise ConfigError(f"costs has shape {costs.shape}, lengths {padded.shape}")
    if padded.shape[0] and padded.max() > capacity:
        i = int(np.argmax(padded))
        raise ScheduleError(f"sequence {i} has {int(padded[i])} padded tokens > capacity {capacity}")
    return padded, costs


def _cannot_hold(
    padded: np.ndarray, dp_size: int, capacity: int, num_microbatches: int, bins_needed: int
) -> ScheduleError:
    """The error of a forced microbatch count no packing was found for, with the bound that
    proves it too small when one does."""
    fewest = -(-bins_needed // dp_size)
    need = -(-int(padded.sum()) // (dp_size * capacity))
    proof = (
        f"; at least {fewest} are needed: {bins_needed} microbatches of capacity {capacity} over {dp_size} "
        "replicas (Martello-Toth bin bound)"
        if fewest > num_microbatches
        else "; the exact search found no packing within its work limit"
    )
    return ScheduleError(
        f"num_microbatches={num_microbatches} cannot hold {padded.shape[0]} sequences of {int(padded.sum())} padded "
        f"tokens in {dp_size} replicas of capacity {capacity} (the token lower bound alone is {need}){proof}"
    )


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
    price: BucketPrice | None = None,
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
    if not costs.size or float(costs.max()) <= 0 or not stages.enabled("more_rounds"):
        return plan  # CostModel(0, 0, c): each microbatch only adds its constant
    if sync is None:
        fallback = plan.mode != _kernels.MODE_COST
        if not fallback and plan.gap <= _GAP_FOR_MORE:
            return plan
        more = _plan_at(
            padded,
            costs,
            order,
            dp_size,
            capacity,
            plan.num_microbatches + step,
            constant,
            repair,
            objective,
            price=price,
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
        candidate = _plan_at(padded, costs, order, dp_size, capacity, m, constant, repair, objective, sync, price=price)
        if candidate is None:
            break
        if candidate.objective < best.objective * (1.0 - _BETTER_BY if greedy else 1.0):
            best = candidate
        if candidate.objective >= previous.objective:
            break  # the prediction stopped dropping
        previous = candidate
    return best
