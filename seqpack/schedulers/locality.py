"""Locality: plans that leave samples on the DP rank that read them, at no cost in step time.

Every DP rank reads its own samples; whatever the schedule places elsewhere crosses the
network in the step's all-to-all. ``balanced`` packs for balance alone and then renames
replicas (:func:`~seqpack.schedulers.balanced.relabel_replicas`), which keeps only what
happens to overlap: at scale nearly all of the payload moves. Each rank's samples are close
to a fair share in expectation, so a plan that starts from where samples are only needs to
move the difference.

:func:`plan_local` builds such plans at the microbatch count of the reference plan (the one
``balanced`` made for balance alone) and keeps the first whose predicted step time
(:func:`step_time`, under the objective the plan is made for) is within ``tolerance``
(0.1%) of the reference's; otherwise the reference stands. Locality never changes which
sequences a step holds or how many microbatches it runs, only where sequences run.

Both candidates start from :func:`seqpack.schedulers._kernels.grid_local`: microbatch
``(m, d)`` belongs to replica ``d``; sequences, longest first, go to their own rank's
emptiest microbatch while it stays within ``home_fill`` of its cost target and within the
mean tokens, otherwise to the emptiest microbatch anywhere (LPT). That hands each rank's
excess to ranks below their share, and the last sequences even out the microbatches.

* Per-replica layout (tried first for ``"replicas"``: DDP, ZeRO-1, pipeline, where the step
  waits for the busiest replica): every microbatch stays on its replica (``home_fill``
  0.9: the last tenth of every microbatch is filled by LPT from anywhere, which is what
  evens out totals); the replica repair evens out the rest, until the busiest replica is
  within half the tolerance of the reference's; each replica runs its microbatches
  heaviest first. About a fifth to a third of the tokens move.
* Dealt layout (``"rounds"`` and ``"both"``, FSDP lockstep, where every round waits for its
  slowest replica, from three microbatches on; also the fallback for ``"replicas"``): a replica's own microbatches, a
  few sequences each, cannot all match the other replicas' within 0.1%. The reference
  gets even rounds by sorting all microbatches by cost and dealing each run of ``dp`` as a
  round, so this layout does the same with the local microbatches
  (:func:`~seqpack.schedulers._kernels.deal_local`): in each round a microbatch goes to
  its own replica when that one is free, else to the least loaded replica left; then the
  repair, which may not slow the rounds. A replica's microbatches collide in a round about
  half of the time, so about half of the tokens still move, against nearly all in the
  reference; with few replicas the rounds end further from even and the reference stays.

docs/scale.md has the measurements.
"""

from __future__ import annotations

import numpy as np

from seqpack.config import Objective
from seqpack.schedulers import _kernels

TOLERANCE = 1e-3  # a local plan may predict at most 0.1% more step time than the reference
_REPLICAS_FILL = 0.9  # home_fill of the per-replica layout
_ROUNDS_FILL = 1.0  # home_fill for "rounds": dealing moves whole microbatches anyway
_DEALT_REPAIR = 0.25  # the dealt layout's repair stops within this share of the tolerance
_REPAIR_WORK_FACTOR = 3  # local layouts start further from balance: 3x the repair's work budget

__all__ = ["TOLERANCE", "heaviest_first", "moved_tokens", "plan_local", "step_time"]


def step_time(load: np.ndarray, constant: float, objective: str) -> float:
    """Predicted step time of a plan's microbatch costs ``load[M, dp]``.

    ``"replicas"``: the busiest replica's total (DDP, ZeRO-1, pipeline); ``"rounds"``: the
    sum over rounds of the slowest replica (FSDP lockstep); ``"both"``: their sum.
    ``constant`` is added per microbatch.
    """
    if load.size == 0:
        return 0.0
    m_count = load.shape[0]
    replicas = float(load.sum(axis=0).max()) + m_count * constant
    rounds = float(load.max(axis=1).sum()) + m_count * constant
    if objective == Objective.REPLICAS:
        return replicas
    if objective == Objective.ROUNDS:
        return rounds
    return replicas + rounds


def plan_local(
    padded: np.ndarray,
    costs: np.ndarray,
    origin: np.ndarray,
    reference,
    *,
    dp_size: int,
    capacity: int,
    constant: float = 0.0,
    objective: str = "both",
    max_repair_moves: int | None = None,
    tolerance: float = TOLERANCE,
    reference_ranks: np.ndarray | None = None,
):
    """A plan at ``reference``'s microbatch count that keeps sequences on their rank, or
    None when no candidate predicts at most ``tolerance`` (relative) more step time or
    moves fewer tokens than the reference.

    Args:
        padded, costs: Padded lengths and costs of the sequences (as for ``plan_balanced``).
        origin: DP rank holding each sequence.
        reference: The :class:`~seqpack.schedulers.balanced.BalancedPlan` made for balance
            alone; its microbatch count and bin rule are reused.
        dp_size, capacity, constant: As for ``plan_balanced``.
        objective: What the step waits for (:func:`step_time`): ``"replicas"`` tries the
            per-replica layout first, ``"rounds"`` and ``"both"`` the dealt one (with one
            or two microbatches the per-replica layout first; module docs).
        max_repair_moves: Cap on repair moves (default ``8 * dp_size + 64``).
        tolerance: Largest relative increase of the predicted step time accepted.
        reference_ranks: The DP rank of every sequence under ``reference`` once its
            replicas are renamed (computed when not given).

    Returns:
        (plan, the DP rank of every sequence once the plan's replicas are renamed), or None.
    """
    if padded.shape[0] == 0 or reference.num_microbatches == 0 or dp_size == 1:
        return None
    from seqpack.schedulers.balanced import relabel_replicas

    limit = step_time(reference.load, constant, objective) * (1 + tolerance)
    if reference_ranks is None:
        reference_ranks = relabel_replicas(reference.replica_of, origin, padded, dp_size)
    to_beat = moved_tokens(reference_ranks, origin, padded)  # a candidate must move less
    m_count = reference.num_microbatches
    if objective == Objective.REPLICAS:
        tries = [(_REPLICAS_FILL, False), (_ROUNDS_FILL, True)]
    elif m_count <= 2:  # one or two rounds: dealing gains little over the replica layout
        tries = [(_REPLICAS_FILL, False)] + ([(_ROUNDS_FILL, True)] if m_count == 2 else [])
    else:
        tries = [(_ROUNDS_FILL, True)]
    for fill, deal in tries:
        plan = _candidate(
            padded,
            costs,
            origin,
            reference,
            dp_size,
            capacity,
            constant,
            objective,
            max_repair_moves,
            tolerance,
            fill,
            deal,
        )
        if plan is None or step_time(plan.load, constant, objective) > limit:
            continue
        ranks = relabel_replicas(plan.replica_of, origin, padded, dp_size)
        if moved_tokens(ranks, origin, padded) < to_beat:
            return plan, ranks
    return None


def moved_tokens(replica_of: np.ndarray, origin: np.ndarray, padded: np.ndarray) -> int:
    """Padded tokens of the sequences placed on another replica than the one holding them."""
    return int(padded[replica_of != origin].sum())


def _candidate(
    padded, costs, origin, reference, dp_size, capacity, constant, objective, max_repair_moves, tolerance, fill, deal
):
    from seqpack.schedulers.balanced import (
        _REPAIR_WORK,
        BalancedPlan,
        _grid,
        _placement_order,
        _repair,
        repair_budget,
        round_targets,
    )

    m_count = reference.num_microbatches
    order = _placement_order(padded, None)
    if reference.mode == _kernels.MODE_COST:
        values = costs
        targets = np.repeat(round_targets(costs[order], dp_size, m_count), dp_size)
    else:  # the reference needed the token rules: balance tokens here too
        values = padded.astype(np.float64)
        targets = np.full(dp_size * m_count, float(padded.sum()) / (dp_size * m_count))
    # Home placements fill a microbatch up to the mean tokens, so a rank of short (cheap per
    # token) sequences leaves room for the cost its microbatches still lack.
    share = int(np.ceil(float(padded.sum()) / (dp_size * m_count)))
    ok, bin_of, _ = _kernels.grid_local(order, padded, values, targets, fill, share, capacity, origin, dp_size)
    if not ok:
        return None
    if deal:
        bin_load = np.bincount(bin_of, weights=costs, minlength=dp_size * m_count)
        top = float(bin_load.max()) if bin_load.size else 0.0
        by_cost = np.lexsort((np.arange(bin_load.shape[0]), top - bin_load))
        round_of_bin, replica_of_bin = _kernels.deal_local(by_cost, bin_load, dp_size)
        round_of, replica_of = round_of_bin[bin_of], replica_of_bin[bin_of]
    else:
        round_of, replica_of = bin_of // dp_size, bin_of % dp_size
    shape = (m_count, dp_size)
    load = _grid(costs, round_of, replica_of, shape)
    tokens = _grid(padded, round_of, replica_of, shape)
    moves = 0
    repair = repair_budget(max_repair_moves, dp_size)
    if repair > 0:
        # Close to the reference's busiest replica, and no closer: every repair move moves a
        # sequence. The dealt layout leaves half of that margin to the rounds.
        stop_at = float(reference.load.sum(axis=0).max()) * (1 + tolerance * (_DEALT_REPAIR if deal else 0.5))
        round_of, replica_of, load, tokens, moves = _repair(
            round_of,
            replica_of,
            load,
            tokens,
            padded,
            costs,
            order,
            dp_size,
            capacity,
            repair,
            objective,
            stop_at,
            _REPAIR_WORK_FACTOR * _REPAIR_WORK,
        )
    round_of, load, tokens = heaviest_first(round_of, replica_of, load, tokens)
    both = step_time(load, constant, Objective.BOTH)
    return BalancedPlan(m_count, round_of, replica_of, load, tokens, reference.mode, moves, both)


def heaviest_first(
    round_of: np.ndarray, replica_of: np.ndarray, load: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renumber each replica's microbatches heaviest first (ties: round order): the
    alignment that minimises ``sum_m max_d load``. Returns (round_of, load, tokens)."""
    m_count, dp_size = load.shape
    rank = np.argsort(-load, axis=0, kind="stable")  # [position, replica] -> old round
    new_round = np.empty_like(rank)
    new_round[rank, np.arange(dp_size)[None, :]] = np.arange(m_count)[:, None]
    return (
        new_round[round_of, replica_of],
        np.take_along_axis(load, rank, axis=0),
        np.take_along_axis(tokens, rank, axis=0),
    )
