"""The balanced plan as a composition of stages (docs/schedulers.md, steps 1-5):
:data:`DEFAULT` is the plan seqpack runs; ``benchmarks/ablation.py`` composes others to
measure what each stage buys."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from seqpack.schedulers.balanced.bins import Packed, cost_targets, exact_search, first_fit, worst_fit
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

__all__ = ["DEFAULT", "Stages"]

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
            (:mod:`seqpack.schedulers.balanced.bins`). None packs: ``M`` grows.
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
