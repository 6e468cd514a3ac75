"""The balanced plan as a composition of stages (docs/schedulers.md, steps 1-5):
:func:`plan_balanced` runs a :class:`Stages` at each microbatch count of its search. The bin
rules (step 2) are here: each packs the sequences into ``dp * M`` bins (:data:`Packed`) or returns None.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.options import Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced import exact as _exact
from seqpack.schedulers.balanced.locality import LocalStage, Relabel, home_swaps, per_replica
from seqpack.schedulers.balanced.replicas import replica_first_stage
from seqpack.schedulers.balanced.rounds import (
    BalancedPlan,
    Layout,
    Sequences,
    _arrange,
    fill_order,
    laid_out,
    more_rounds,
    relabel_replicas,
    repair_budget,
    round_targets,
)
from seqpack.schedulers.objective import step_objective
from seqpack.schedulers.shape_limits import BucketPrice

__all__ = ["DEFAULT", "Packed", "Stages", "cost_targets", "exact_search", "first_fit", "plan_balanced", "worst_fit"]

logger = logging.getLogger(__name__)

Packed = tuple[int, np.ndarray, np.ndarray]
"""(rule, bin of each sequence, cost of each bin) of a bin rule that packed the sequences."""


def _greedy(seqs: Sequences, targets: np.ndarray, mode: int) -> Packed | None:
    ok, bin_of, bin_load, _ = _kernels.grid_lpt(seqs.fill_order, seqs.padded, seqs.costs, targets, seqs.capacity, mode)
    return (mode, bin_of, bin_load) if ok else None


def cost_targets(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """LPT: each sequence into the bin furthest below its cost target."""
    return _greedy(seqs, targets, _kernels.MODE_COST)


def worst_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Each sequence into the bin with the fewest tokens."""
    return _greedy(seqs, targets, _kernels.MODE_TOKENS)


def first_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Each sequence into the first bin with room."""
    return _greedy(seqs, targets, _kernels.MODE_FIRST_FIT)


def exact_search(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """The bounded exact search (:func:`seqpack.schedulers.balanced.exact.pack_bins`)."""
    padded, bins = seqs.padded, seqs.dp_size * num_rounds
    status, bin_of = _exact.pack_bins(padded, bins, seqs.capacity, found_only=True)
    if status != _exact.FOUND:
        return None
    logger.debug("exact search packed %d sequences into %d microbatches (greedy failed)", padded.shape[0], bins)
    return _exact.MODE_EXACT, bin_of, np.bincount(bin_of, weights=seqs.costs, minlength=bins)


BinRule = Callable[[Sequences, np.ndarray, int], "Packed | None"]
Refine = Callable[[Sequences, Layout, bool], Layout]
CountSearch = Callable[[BalancedPlan, Sequences, int, Callable[[int], "BalancedPlan | None"]], BalancedPlan]


@dataclasses.dataclass(frozen=True)
class Stages:
    """The functions the balanced plan runs, in the order it runs them.

    Attributes:
        fill_order: ``(padded, origin) -> order``: the order the bin rules take the sequences.
        targets: ``(sorted costs, dp, M) -> target[M]``: one bin's cost target in each round.
        bin_rules: Tried in turn at a microbatch count; the first that packs wins (none: ``M`` grows).
        refine: Applied in turn to the grid dealt into rounds (step 4).
        count_search: From the plan at the fewest microbatches to the best count.
        relabel: Plan replicas to DP ranks.
        locality: Candidate plans that keep samples home, tried in turn where locality runs.
    """

    fill_order: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    targets: Callable[[np.ndarray, int, int], np.ndarray]
    bin_rules: tuple[BinRule, ...]
    refine: tuple[Refine, ...]
    count_search: CountSearch
    relabel: Relabel
    locality: tuple[LocalStage, ...]


DEFAULT = Stages(
    fill_order=fill_order,
    targets=round_targets,
    bin_rules=(cost_targets, worst_fit, first_fit, exact_search),
    refine=(replica_first_stage,),
    count_search=more_rounds,
    relabel=relabel_replicas,
    locality=(per_replica, home_swaps),
)
"""The plan seqpack runs."""


def _plan_at(seqs: Sequences, num_rounds: int, stages: Stages, forced: bool = False) -> BalancedPlan | None:
    """The plan with exactly ``num_rounds`` rounds, or None when no bin rule packs the
    sequences. ``forced``: the count was given (no count search follows)."""
    padded, costs, dp_size = seqs.padded, seqs.costs, seqs.dp_size
    targets = np.repeat(stages.targets(costs[seqs.fill_order], dp_size, num_rounds), dp_size)
    packed = next(filter(None, (rule(seqs, targets, num_rounds) for rule in stages.bin_rules)), None)
    if packed is None:
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
    return BalancedPlan(num_rounds, *grid, mode, step_objective(priced + seqs.constant, seqs.sync))


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
        padded: Padded lengths, each at most ``capacity`` (trusted).
        costs: Cost of each sequence, without the per-microbatch ``constant``.
        origin: DP rank holding each sequence (ties between equal lengths keep it home).
        price: Under ``static_shapes``, the bucket padding's cost, added where counts are compared.

    Raises:
        ScheduleError: ``num_microbatches`` too small to hold the sequences.
    """
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    costs = np.ascontiguousarray(costs, dtype=np.float64)
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
    if padded.size == 0:
        plan = _plan_at(seqs, 0, stages)
        assert plan is not None  # no sequences: every rule packs them
        return plan
    m = -(-max(fewest, min_microbatches, 1) // microbatch_multiple) * microbatch_multiple
    while (plan := _plan_at(seqs, m, stages)) is None:
        m += microbatch_multiple
    return stages.count_search(plan, seqs, microbatch_multiple, lambda rounds: _plan_at(seqs, rounds, stages))


def _cannot_hold(
    padded: np.ndarray, dp_size: int, capacity: int, num_microbatches: int, bins_needed: int
) -> ScheduleError:
    """The error of a forced microbatch count no packing was found for."""
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
