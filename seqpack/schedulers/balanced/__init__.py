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
   (:func:`seqpack.schedulers.objective.round_sum_lower_bound`), bisects on how much slower the rounds
   may get, keeping the plan whose worse ratio to its bound is lowest. That happens when
   a few sequences come close to a whole microbatch. The repair stops within 0.1% of the
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
else runs the plan (``benchmarks/packing.py``, 1M lognormal lengths on a loaded 2-core VM:
118,620 microbatches, the bound, in 3.0 s, where the plan took 26 s for 118,621).

5. **Order.** Rounds run heaviest first (a memory peak shows up at the first microbatch),
   or with ``order="pipeline"`` light rounds at both ends and heavy ones in the middle,
   which shortens pipeline warm-up and cool-down bubbles.

**When M grows.** ``M`` starts at the fewest microbatches any packing needs (Martello-Toth's
bin bound ``L2``, at least the token bound). If no bin has room for a sequence at ``M`` (bins
fill unevenly because cost-balanced bins hold different token counts), the same ``M`` is
retried balancing tokens (worst-fit), then first-fit, then with a bounded exact search
(:mod:`seqpack.schedulers.balanced.exact`); only when all fail does ``M`` grow. Then
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

**What each stage buys** (``benchmarks/ablation.py``, ``benchmarks/results/ablation.txt``:
each stage switched off with :func:`seqpack.schedulers.balanced.stages.disabled` on the
workloads of ``benchmarks/schedulers.py`` under each sync, the heavy tail and verl batches of
``benchmarks/heavy_tail.py`` and the shapes of ``benchmarks/scale.py``; predicted step time
without it, mean over a workload's steps; docs/schedulers.md has the table). A stage stays
when it makes some workload's step at least 0.5% faster or guarantees capacity or the
fewest microbatches, or, for those that keep samples home, by the tokens it keeps:

* round targets (step 2): pretrain-pareto under lockstep +10.6% without them,
  rl-bimodal-32k +6.7%, sft-long-tail +5.0% (and one more microbatch in one step of three);
* worst-fit / first-fit bins: 1,048,576 sequences into 1,024 replicas need 211
  microbatches without them, 205 with (the exact search gives up at that size);
* the exact search: 1,116 of 2,000 verl-like batches get more microbatches than the
  fewest that hold them without it; bin completion inside it: 12 of 2,000;
* the repair: pretrain-pareto +3.2% (``objective="both"``), sft-long-tail +2.9%,
  rl-bimodal-32k +1.7%; its bisection alone: +3.1%, +2.9%, +0.8%;
* replica-first (``sync="replica"``): the heavy tail +0.50-0.55% at 2-6 microbatches
  (worst step 1.0166x its bound without, 1.0015x with);
* more microbatches than the fewest: sft-long-tail under ``sync="replica"`` +1.0%;
* origin order and renaming replicas (no step-time effect; measured with locality off):
  equal lengths move 93.8% of their tokens without the origin order, none with it;
  renaming keeps 14-26 points of the tokens home (sft-lognormal: 99.8% -> 85.6% moved);
* locality's per-replica layout: 45% -> 33% of the tokens moved (sft-lognormal,
  ``sync="replica"``); its home swaps: 86% -> 46% (sft-lognormal), 99% -> 42% (1,048,576
  into 1,024).

Renumbering each replica's microbatches heaviest first after the repair (to lower
``sum_m max_d``) changed no workload's predicted step by more than 0.01% (300 verl-like
batches at dp=2: 0.002% on average) and was removed.

Without a cost model, ``balanced`` balances the training FLOPs of a Llama-3-8B shaped
model (:func:`seqpack.cost.default_cost_model`). Pass the same cost model to
:meth:`seqpack.stats.StepStats.from_schedule` to account a schedule in the units it was
balanced in (``scheduler.resolve_cost(cost)`` returns it).

Modules: ``rounds`` (the plan's data, grid helpers, replica renaming, round order),
``plan`` (steps 1-4 at a count, the search over counts), ``repair`` (step 4), ``exact``
(the bounded exact bin search), ``replicas`` (the replica-first plan and the
capacity-aware replica bound), ``locality`` (plans that keep samples home, and when they
pay), ``stages`` (the ablation's switches), ``scheduler`` (:class:`BalancedScheduler`).
"""

from __future__ import annotations

from seqpack.schedulers.balanced.plan import plan_balanced
from seqpack.schedulers.balanced.rounds import (
    OBJECTIVES,
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
    "OBJECTIVES",
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
