"""Steps 1-4 of the balanced plan (:func:`plan_balanced`): the stages of
:class:`~seqpack.schedulers.balanced.stages.Stages` at a microbatch count, and the search
over counts."""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.options import Sync
from seqpack.schedulers.balanced import exact as _exact
from seqpack.schedulers.balanced.rounds import (
    BalancedPlan,
    Sequences,
    _arrange,
    _objective,
    laid_out,
    repair_budget,
)
from seqpack.schedulers.balanced.stages import DEFAULT, Stages
from seqpack.schedulers.shape_limits import BucketPrice


def _plan_at(seqs: Sequences, num_rounds: int, stages: Stages, forced: bool = False) -> BalancedPlan | None:
    """The plan with exactly ``num_rounds`` rounds, or None when no bin rule packs the
    sequences. ``forced``: the count was given (no count search follows; the refine stages
    may take any lighter plan)."""
    padded, costs, dp_size = seqs.padded, seqs.costs, seqs.dp_size
    targets = np.repeat(stages.targets(costs[seqs.fill_order], dp_size, num_rounds), dp_size)
    for rule in stages.bin_rules:
        packed = rule(seqs, targets, num_rounds)
        if packed is not None:
            break
    else:
        return None
    mode, bin_of, bin_load = packed
    round_of_bin, replica_of_bin = _arrange(bin_load, dp_size, num_rounds)
    grid = laid_out(padded, costs, round_of_bin[bin_of], replica_of_bin[bin_of], (num_rounds, dp_size))
    balances = bool(costs.size) and float(costs.max()) > 0  # CostModel(0, 0, c): nothing to balance
    if seqs.max_repair_moves > 0 and dp_size > 1 and balances:
        for refine in stages.refine:
            grid = refine(seqs, grid, forced)
    load, tokens = grid[2], grid[3]
    priced = load if seqs.price is None else load + seqs.price.extra(tokens)
    return BalancedPlan(num_rounds, *grid, mode, _objective(priced, seqs.constant, seqs.sync))


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
    origin: np.ndarray | None = None,
    sync: str = Sync.LOCKSTEP,
    price: BucketPrice | None = None,
    stages: Stages = DEFAULT,
) -> BalancedPlan:
    """Assign sequences to ``[rounds, replicas]`` (docs/schedulers.md, steps 1-4).

    Args:
        padded: int64 padded lengths, each at most ``capacity`` (trusted).
        costs: float64 cost of each sequence (without the per-microbatch constant).
        dp_size, capacity: Replicas and padded tokens per microbatch.
        constant: Per-microbatch cost, used when comparing microbatch counts.
        min_microbatches: Lower limit on ``M`` (e.g. pipeline stages).
        microbatch_multiple: ``M`` is a multiple of this (e.g. Megatron's
            ``microbatch_group_size_per_vp_stage`` under interleaved pipelines).
        num_microbatches: Use exactly this ``M``.
        max_repair_moves: Cap on repair moves (default ``8 * dp_size + 64``).
        origin: DP rank holding each sequence; breaks ties between equally long sequences
            so that they stay where they are (with equal lengths, no sample moves).
        sync: The step time the plan is made for (:func:`step_objective`).
        price: Under ``static_shapes``, the bucket padding's cost
            (:class:`~seqpack.schedulers.shape_limits.BucketPrice`), added to every
            microbatch's cost where counts are compared.
        stages: The stages the plan runs.

    Raises:
        ScheduleError: ``num_microbatches`` too small to hold the sequences (the caller
            checked each length against ``capacity`` and ``sync``).
    """
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    n = padded.shape[0]
    seqs = Sequences(
        padded, costs, stages.fill_order(padded, origin), dp_size, capacity, constant,
        repair_budget(max_repair_moves, dp_size), sync, price,
    )  # fmt: skip
    bins_needed = _exact.bin_lower_bound(padded, capacity)
    fewest = -(-bins_needed // dp_size)
    if num_microbatches is not None:
        plan = _plan_at(seqs, num_microbatches, stages, forced=True)
        if plan is None:
            raise _cannot_hold(padded, dp_size, capacity, num_microbatches, bins_needed)
        return plan
    if n == 0:
        plan = _plan_at(dataclasses.replace(seqs, max_repair_moves=0), 0, stages)
        assert plan is not None  # no sequences: every rule packs them
        return plan
    m = -(-max(fewest, min_microbatches, 1) // microbatch_multiple) * microbatch_multiple
    while (plan := _plan_at(seqs, m, stages)) is None:
        m += microbatch_multiple
    return stages.count_search(plan, seqs, microbatch_multiple, lambda rounds: _plan_at(seqs, rounds, stages))


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
