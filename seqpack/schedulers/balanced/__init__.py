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
   within capacity, whenever the pair's larger total drops. Under ``sync="lockstep"`` (the
   default: every round waits for its slowest replica) it never lets ``sum_m max_d`` grow;
   under ``"replica"`` only the replica totals count. The repair stops within 0.1% of the
   replica bound, or after a bounded amount of work.
Fewer bytes moved, at no cost in balance: equally long sequences are taken in an order
interleaved by the rank that holds them (``origin``), which keeps them on that rank (with
equal lengths nothing moves), and the finished replicas are renamed so that each runs on
the DP rank already holding most of its tokens (:func:`relabel_replicas`). With
``locality``, a plan at the same microbatch count that keeps more samples where they are
(built from each rank's own samples, or this one with sequences brought home by swaps of
equal cost) replaces this one when it predicts at most 0.1% more step time and moves fewer
tokens (:mod:`seqpack.schedulers.balanced.locality`). Its default, ``"auto"``, runs it only
where the bytes it keeps home are worth its plan time
(:func:`~seqpack.schedulers.balanced.locality.locality_pays`): for token-id samples (~20
bytes a token) only where the mean sequence is longer than ``2,500 * dp`` tokens (two
replicas of 5,000-token sequences). Pack order inside a microbatch is ascending global id.

**One replica.** At ``dp_size=1`` every round is one microbatch, so a step costs the same
for every packing at a count and only the count matters: ``balanced`` takes the single-rank
packer's packs (:func:`seqpack.packing.pack_lengths`) when they reach ``L2`` below and meet
``min_microbatches`` and ``microbatch_multiple`` (and ``num_microbatches`` is not given),
else runs the plan.

5. **Order.** Rounds run heaviest first (a memory peak shows up at the first microbatch),
   or with ``order="pipeline"`` light rounds at both ends and heavy ones in the middle,
   which shortens pipeline warm-up and cool-down bubbles.

**When M grows.** ``M`` starts at the fewest microbatches any packing needs (Martello-Toth's
bin bound ``L2``, at least the token bound). If no bin has room for a sequence at ``M`` (bins
fill unevenly because cost-balanced bins hold different token counts), the same ``M`` is
retried balancing tokens (worst-fit), then first-fit, then with a bounded exact search
(:mod:`seqpack.schedulers.balanced.exact`); only when all fail does ``M`` grow. Then
(:func:`~seqpack.schedulers.balanced.rounds.more_rounds`) ``balanced`` looks for the count
that minimises the predicted step time of the sync (:func:`step_objective`: ``"lockstep"``
``sum_m max_d``, ``"replica"`` ``max_d sum_m``), per-microbatch ``constant`` included:
``M+1, M+2, ...`` while the prediction keeps dropping, a larger count kept when at least 1%
faster. With FLOPs (no constant) extra microbatches are free in the model, so on a
launch-bound GPU pass a constant or calibrate (:mod:`seqpack.calibrate`).

**Stages.** The plan is the composition :data:`seqpack.schedulers.balanced.stages.DEFAULT`
(:class:`~seqpack.schedulers.balanced.stages.Stages`): each step above is one stage
function. ``benchmarks/ablation.py`` builds the composition without each stage to measure
what it buys; docs/schedulers.md has the table, and a stage stays where some workload's step
is at least 0.5% faster with it, or it guarantees capacity or the fewest microbatches, or it
keeps samples home.

Without a cost model, ``balanced`` balances the training FLOPs of a Llama-3-8B shaped
model (:func:`seqpack.cost.default_cost_model`). Pass the same cost model to
:meth:`seqpack.stats.StepStats.from_schedule` to account a schedule in the units it was
balanced in (``scheduler.resolve_cost(cost)`` returns it).

Modules: ``rounds`` (the plan's data, grid helpers, the count search, replica renaming,
round order), ``bins`` (the bin rules of step 2), ``exact`` (the bounded exact bin search),
``repair`` (step 4), ``replicas`` (the replica-first plan), ``locality`` (plans that keep
samples home, and when they pay), ``stages`` (the composition), ``plan`` (the stages at a
count, and from the fewest microbatches to the best count), ``scheduler``
(:class:`BalancedScheduler`).
"""

from __future__ import annotations

from seqpack.schedulers.balanced.plan import plan_balanced
from seqpack.schedulers.balanced.rounds import (
    ORDERS,
    BalancedPlan,
    objective_for,
    relabel_replicas,
    repair_budget,
    round_position,
    round_targets,
)
from seqpack.schedulers.balanced.scheduler import BalancedScheduler

__all__ = [
    "ORDERS",
    "BalancedPlan",
    "BalancedScheduler",
    "objective_for",
    "plan_balanced",
    "relabel_replicas",
    "repair_budget",
    "round_position",
    "round_targets",
]
