"""The balanced plan as a composition of stages (docs/schedulers.md, steps 1-5):
:data:`DEFAULT` is the plan seqpack runs; ``benchmarks/ablation.py`` composes others to
measure what each stage buys.

The bin rules (step 2) are here; the other stages live beside the data they work on. A bin
rule takes the step's :class:`~seqpack.schedulers.balanced.rounds.Sequences`, the cost target
of every bin and ``M``, and packs the sequences into ``dp * M`` bins of ``capacity`` tokens:
``(rule, bin of each sequence, cost of each bin)``, or None. The greedy rules are one kernel
(:func:`~seqpack.schedulers._kernels.grid_lpt`) and can miss a packing that exists;
:func:`exact_search` searches exactly, within a bounded amount of work.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced import exact as _exact
from seqpack.schedulers.balanced.locality import LocalStage, Relabel, home_swaps, per_replica
from seqpack.schedulers.balanced.replicas import replica_first_stage
from seqpack.schedulers.balanced.rounds import (
    BalancedPlan,
    Layout,
    Sequences,
    fill_order,
    more_rounds,
    relabel_replicas,
    round_targets,
)

__all__ = ["DEFAULT", "Packed", "Stages", "cost_targets", "exact_search", "first_fit", "worst_fit"]

logger = logging.getLogger(__name__)

Packed = tuple[int, np.ndarray, np.ndarray]
"""(rule, bin of each sequence, cost of each bin) of a bin rule that packed the sequences."""


def _greedy(seqs: Sequences, targets: np.ndarray, mode: int) -> Packed | None:
    ok, bin_of, bin_load, _ = _kernels.grid_lpt(seqs.fill_order, seqs.padded, seqs.costs, targets, seqs.capacity, mode)
    return (mode, bin_of, bin_load) if ok else None


def cost_targets(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """LPT with targets: each sequence into the bin furthest below its cost target."""
    return _greedy(seqs, targets, _kernels.MODE_COST)


def worst_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Balance tokens: each sequence into the bin with the fewest tokens."""
    return _greedy(seqs, targets, _kernels.MODE_TOKENS)


def first_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Each sequence into the first bin with room."""
    return _greedy(seqs, targets, _kernels.MODE_FIRST_FIT)


def exact_search(
    seqs: Sequences, targets: np.ndarray, num_rounds: int, *, bin_completion: bool = True
) -> Packed | None:
    """The bounded exact search (:func:`seqpack.schedulers.balanced.exact.pack_bins`, with
    bin completion where there are few sequences per bin)."""
    padded, dp_size, capacity = seqs.padded, seqs.dp_size, seqs.capacity
    status, bin_of = _exact.pack_bins(
        padded, dp_size * num_rounds, capacity, found_only=True, bin_completion=bin_completion
    )
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
    return _exact.MODE_EXACT, bin_of, np.bincount(bin_of, weights=seqs.costs, minlength=dp_size * num_rounds)


BinRule = Callable[[Sequences, np.ndarray, int], "Packed | None"]
Refine = Callable[[Sequences, Layout, bool], Layout]
CountSearch = Callable[[BalancedPlan, Sequences, int, Callable[[int], "BalancedPlan | None"]], BalancedPlan]


@dataclasses.dataclass(frozen=True)
class Stages:
    """The functions the balanced plan runs, in the order it runs them.

    Attributes:
        fill_order: ``(padded, origin) -> order``: the order the bin rules take the
            sequences, costliest first (equally long ones interleaved by the rank holding them).
        targets: ``(sorted costs, dp, M) -> target[M]``: the cost target of one bin of each
            round (step 2).
        bin_rules: Tried in turn at a microbatch count; the first that packs wins
            (the bin rules above). None packs: ``M`` grows.
        refine: Applied in turn to the grid dealt into rounds (step 4): replica-first where
            the step waits for replicas.
        count_search: From the plan at the fewest microbatches to the best count
            (:func:`~seqpack.schedulers.balanced.rounds.more_rounds`).
        relabel: Plan replicas to DP ranks (the rank holding most of each one's tokens).
        locality: Candidate plans that keep samples home, tried in turn where locality
            runs (:func:`~seqpack.schedulers.balanced.locality.plan_local`).
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
"""The plan seqpack runs: every stage that ``benchmarks/ablation.py`` shows buys something."""
