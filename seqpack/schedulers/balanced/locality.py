"""Locality: plans that leave samples on the DP rank that read them, at no cost in step time
(:func:`plan_local`). docs/scale.md ("Locality") describes the candidates, what a plan keeps
of the reference and when ``locality="auto"`` turns it on (:func:`locality_pays`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from seqpack.options import SAMPLE_BYTES_PER_TOKEN, Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.replicas import _REPAIR_WORK, repair
from seqpack.schedulers.balanced.rounds import BalancedPlan, _grid, fill_order, laid_out, repair_budget, round_targets
from seqpack.schedulers.objective import step_objective

TOLERANCE = 1e-3  # a local plan may predict at most 0.1% more step time than the reference
AUTO = "auto"  # BalancedScheduler(locality=AUTO): on where locality_pays
LINK_BYTES_PER_SECOND = 25e9  # one rank's exchange bandwidth: 200 Gb/s InfiniBand
PLAN_SECONDS_PER_SEQUENCE = 1e-6  # plan time locality adds per sequence of the step (docs/scale.md)
KEPT_HOME = 0.5  # share of the step's tokens locality keeps home that the plain plan moves
_REPLICAS_FILL = 0.9  # home_fill of the per-replica layout
_REPAIR_WORK_FACTOR = 3  # local layouts start further from balance: 3x the repair's work budget
_SWAP_SLACK = 0.9  # home swaps may raise each cap by this share of the tolerance
_SWAPS_ABOVE = 1 / 3  # the home swaps are also tried when the per-replica layout moves more

__all__ = [
    "AUTO",
    "KEPT_HOME",
    "LINK_BYTES_PER_SECOND",
    "PLAN_SECONDS_PER_SEQUENCE",
    "TOLERANCE",
    "break_even_bytes_per_token",
    "home_swaps",
    "locality_pays",
    "per_replica",
    "plan_local",
]


def break_even_bytes_per_token(*, sequences: int, tokens: int, dp_size: int) -> float:
    """Bytes per token above which locality saves more exchange time than it costs plan
    time: where ``KEPT_HOME * tokens / dp_size * bytes_per_token / LINK_BYTES_PER_SECOND``
    exceeds ``PLAN_SECONDS_PER_SEQUENCE * sequences``; ``inf`` for one replica or no tokens."""
    if dp_size <= 1 or tokens <= 0:
        return float("inf")
    return PLAN_SECONDS_PER_SEQUENCE * sequences * dp_size * LINK_BYTES_PER_SECOND / (KEPT_HOME * tokens)


def locality_pays(bytes_per_token: float | None, *, sequences: int, tokens: int, dp_size: int) -> bool:
    """Whether ``bytes_per_token`` (None: :data:`~seqpack.stats.SAMPLE_BYTES_PER_TOKEN`) is
    above :func:`break_even_bytes_per_token` for the step."""
    payload = SAMPLE_BYTES_PER_TOKEN if bytes_per_token is None else bytes_per_token
    return payload > break_even_bytes_per_token(sequences=sequences, tokens=tokens, dp_size=dp_size)


Relabel = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
"""Plan replicas -> DP ranks (:func:`~seqpack.schedulers.balanced.relabel_replicas`)."""


@dataclasses.dataclass(frozen=True)
class Local:
    """One step as the locality stages see it; fields as for ``plan_balanced``, and:

    Attributes:
        origin: DP rank holding each sequence.
        reference: The plan made for balance alone, whose microbatch count and bin rule hold.
        reference_ranks: The DP rank of every sequence under ``reference``.
        tolerance: Largest relative increase of the predicted step time accepted.
        relabel: Renames a candidate's replicas.
    """

    padded: np.ndarray
    costs: np.ndarray
    origin: np.ndarray
    reference: BalancedPlan
    reference_ranks: np.ndarray
    dp_size: int
    capacity: int
    constant: float
    sync: str
    max_repair_moves: int | None
    tolerance: float
    relabel: Relabel


LocalStage = Callable[[Local], "tuple[BalancedPlan, np.ndarray] | None"]
"""A candidate plan that keeps samples home and the DP rank of every sequence under it, or None."""


def per_replica(step: Local) -> tuple[BalancedPlan, np.ndarray] | None:
    """The per-replica layout (docs/scale.md, "Locality") and its DP ranks, under ``sync="replica"``
    or at one or two microbatches; else None, as when it finds no packing."""
    padded, costs, dp_size, reference = step.padded, step.costs, step.dp_size, step.reference
    m_count = reference.num_microbatches
    if not (step.sync == Sync.REPLICA or m_count <= 2):
        return None
    order = fill_order(padded, None)
    if reference.mode == _kernels.MODE_COST:
        values = costs
        targets = np.repeat(round_targets(costs[order], dp_size, m_count), dp_size)
    else:  # the reference needed the token rules: balance tokens here too
        values = padded.astype(np.float64)
        targets = np.full(dp_size * m_count, float(padded.sum()) / (dp_size * m_count))
    share = int(np.ceil(float(padded.sum()) / (dp_size * m_count)))  # home placements' token fill
    ok, bin_of, _ = _kernels.grid_local(
        order, padded, values, targets, _REPLICAS_FILL, share, step.capacity, step.origin, dp_size
    )
    if not ok:
        return None
    grid = laid_out(padded, costs, bin_of // dp_size, bin_of % dp_size, (m_count, dp_size))
    moves = repair_budget(step.max_repair_moves, dp_size)
    if moves > 0 and step.sync == Sync.REPLICA:  # lockstep steps do not wait for replica totals
        # Down to the reference's busiest replica and no further: every repair move moves a sequence.
        stop_at = float(reference.load.sum(axis=0).max()) * (1 + step.tolerance * 0.5)
        grid = repair(grid, padded, costs, step.capacity, moves, stop_at, _REPAIR_WORK_FACTOR * _REPAIR_WORK)
    plan = BalancedPlan(m_count, *grid, reference.mode, step_objective(grid[2] + step.constant, step.sync))
    return plan, step.relabel(plan.replica_of, step.origin, padded, dp_size)


def home_swaps(step: Local) -> tuple[BalancedPlan, np.ndarray]:
    """The reference with its replicas renamed, then one pass of :func:`~seqpack.schedulers._kernels.home_swaps`
    (docs/scale.md, "Locality") within ``1 + _SWAP_SLACK * tolerance`` times the reference's caps."""
    padded, costs, origin, reference = step.padded, step.costs, step.origin, step.reference
    slack = step.tolerance * _SWAP_SLACK
    m_count, dp_size = reference.load.shape
    shape = (m_count, dp_size)
    round_of = reference.round_of.copy()
    ranks = np.array(step.reference_ranks, dtype=np.int64)  # a copy: the kernel updates it
    load = _grid(costs, round_of, ranks, shape)
    round_cap = np.full(m_count, np.inf) if step.sync == Sync.REPLICA else load.max(axis=1) * (1 + slack)
    replica_cap = float(load.sum(axis=0).max()) * (1 + slack)
    top = int(padded.max()) + 1  # sequences by home, then longest first, then index
    if dp_size * top < 2**62:  # one stable sort of a combined key: ~7x faster than lexsort
        order = np.argsort(origin.astype(np.int64) * top + (top - 1 - padded), kind="stable")
    else:
        order = np.lexsort((-padded, origin))
    _kernels.home_swaps(
        round_of, ranks, padded, costs, origin, dp_size, m_count, step.capacity, round_cap, replica_cap, order, 1
    )
    grid = laid_out(padded, costs, round_of, ranks, shape)
    plan = BalancedPlan(m_count, *grid, reference.mode, step_objective(grid[2], step.sync))
    return plan, plan.replica_of


def plan_local(
    step: Local, candidates: Sequence[LocalStage] = (per_replica, home_swaps)
) -> tuple[BalancedPlan, np.ndarray] | None:
    """Of the candidates that predict at most ``tolerance`` (relative) more step time, the one
    that moves the fewest tokens, fewer than the reference, and the DP rank of every sequence
    under it (None if none does); tried in turn, one moving at most a third of the tokens
    ends the search."""
    padded, origin, reference = step.padded, step.origin, step.reference
    if padded.shape[0] == 0 or reference.num_microbatches == 0 or step.dp_size == 1:
        return None
    limit = step_objective(reference.load + step.constant, step.sync) * (1 + step.tolerance)
    best = None
    to_beat = int(padded[step.reference_ranks != origin].sum())  # padded tokens off their rank
    for stage in candidates:
        found = stage(step)
        if found is None or step_objective(found[0].load + step.constant, step.sync) > limit:
            continue
        moved = int(padded[found[1] != origin].sum())
        if moved < to_beat:
            best, to_beat = found, moved
            if moved <= _SWAPS_ABOVE * float(padded.sum()):
                break
    return best
