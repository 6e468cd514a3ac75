"""Replica-first planning for ``objective="replicas"`` (``sync="replica"``): when the
grid plan (bins first, then replicas, then the repair) leaves the busiest replica above
its bound, partition the sequences into replicas first and pack each replica's
microbatches as it goes, and keep it when its busiest replica is lighter and within 1% of
the bound (:func:`keep_lighter`).

Why: the grid deals whole bins to replicas, and the repair then moves single sequences off
the busiest replica within a bounded number of moves. Under heavy tails (a few sequences
that fill a microbatch and cost as much as a whole replica's share) each replica holding
one of them also gets full bins in its other rounds, and the repair must move hundreds of
short sequences one at a time; it stops at its move budget ~10% above the bound.
Longest-processing-time over replicas (each sequence, costliest first, to the lightest
replica with a microbatch it fits, best fit inside) reaches the bound there directly.
"""

from __future__ import annotations

import numpy as np

from seqpack._lazy import lazy_module
from seqpack.options import Objective
from seqpack.schedulers.balanced.repair import Repaired, _repair
from seqpack.schedulers.balanced.rounds import _GAP_FOR_MORE, _GOOD_ENOUGH, _grid

_kernel = lazy_module("seqpack.schedulers._kernels.replica_repair")  # numba: imported on first use

__all__ = ["LPT_WORK", "capacity_replica_bound", "keep_lighter", "replica_first"]

LPT_WORK = 50_000_000  # heap steps and bin scans before the replica-first pass gives up


def replica_first(
    padded: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    dp_size: int,
    capacity: int,
    num_rounds: int,
    *,
    max_work: int = LPT_WORK,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(round_of, replica_of)`` of the replica-first plan at ``num_rounds`` microbatches per
    replica, or None when a sequence fits no microbatch left (or the work ran out).

    Args:
        padded: int64 padded lengths, each at most ``capacity``.
        costs: float64 cost of each sequence.
        order: Placement order, costliest first (longest first: cost grows with length).
        dp_size, capacity, num_rounds: Replicas, tokens per microbatch, microbatches each.
        max_work: Heap steps and bin scans before giving up.
    """
    if num_rounds <= 0 or dp_size <= 0 or padded.shape[0] == 0:
        return None
    ok, round_of, replica_of = _kernel.replica_lpt(
        np.ascontiguousarray(order, dtype=np.int64),
        np.ascontiguousarray(padded, dtype=np.int64),
        np.ascontiguousarray(costs, dtype=np.float64),
        int(dp_size),
        int(num_rounds),
        int(capacity),
        int(max_work),
    )
    return (round_of, replica_of) if ok else None


def keep_lighter(
    grid: Repaired,
    padded: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    dp_size: int,
    capacity: int,
    max_moves: int,
    *,
    forced: bool = False,
) -> Repaired:
    """The repaired grid plan ``grid``, or the replica-first plan (repaired the same way)
    when its busiest replica is lighter and within 1% of the bound ``max(total / dp,
    costliest sequence)``. Tried only when the grid's busiest replica is more than 0.1%
    above the bound.

    Within 1%: no larger microbatch count can then predict a step 1% faster, so the count
    search (:func:`seqpack.schedulers.balanced.plan._more_rounds`) ends where it would have
    ended with a plan at the bound. A replica-first plan further off (capacity binds: its
    microbatches are nearly full) is not taken, so that the search still tries more
    microbatches, where the grid or the replica-first plan gets closer. With ``forced``
    (``num_microbatches`` given: there is no count search), any lighter plan is taken.
    """
    round_of, replica_of, load, _, _ = grid
    bound = max(float(costs.sum()) / dp_size, float(costs.max()))
    busiest = float(load.sum(axis=0).max())
    if busiest <= (1 + _GOOD_ENOUGH) * bound:
        return grid
    found = replica_first(padded, costs, order, dp_size, capacity, load.shape[0])
    if found is None:
        return grid
    new_round, new_replica = found
    shape = load.shape
    new_load = _grid(costs, new_round, new_replica, shape)
    new_tokens = _grid(padded, new_round, new_replica, shape)
    candidate = _repair(
        new_round,
        new_replica,
        new_load,
        new_tokens,
        padded,
        costs,
        order,
        dp_size,
        capacity,
        max_moves,
        Objective.REPLICAS,
    )
    lighter = float(candidate[2].sum(axis=0).max())
    close = forced or lighter <= (1 + _GAP_FOR_MORE) * bound
    return candidate if lighter < busiest and close else grid


def _holds(padded: np.ndarray, costs: np.ndarray, dp_size: int, room: int, target: float) -> bool:
    """False only when no plan keeps every replica at most ``target`` with ``room`` tokens
    per replica (:func:`capacity_replica_bound`'s relaxation)."""
    if float(costs.max()) > target or dp_size * target < float(costs.sum()):
        return False
    anchor = costs > target / 2  # two of them exceed the target together: one replica each
    k = int(anchor.sum())
    if k > dp_size:
        return False
    small = ~anchor & (padded > 0)
    # Each small sequence's cost splits into rho tokens' worth and a token-free rest, both
    # divisible: a relaxation in which the rest only needs the total-cost check above.
    rho = float((costs[small] / padded[small]).min()) if small.any() else 0.0
    tokens = np.full(dp_size, float(room))  # anchors in replicas 0..k-1, one each
    budget = np.full(dp_size, target)
    tokens[:k] -= padded[anchor]
    budget[:k] -= costs[anchor]
    takes = np.minimum(tokens, budget / rho) if rho > 0 else tokens
    return float(takes.sum()) >= float(padded[~anchor].sum())


def capacity_replica_bound(
    padded: np.ndarray, costs: np.ndarray, dp_size: int, capacity: int, num_rounds: int, *, rel_tol: float = 1e-5
) -> float:
    """A lower bound on the busiest replica's cost over every plan with ``num_rounds``
    microbatches of ``capacity`` tokens per replica: at least ``max(total / dp, costliest
    sequence)``, larger where capacity binds (``inf`` when the tokens do not fit).

    Certificate: a target ``B`` is impossible when the sequences costing more than ``B/2``
    (one per replica at most) leave the other replicas too little room. Relaxed: each
    replica holds at most ``num_rounds * capacity`` tokens (microbatch boundaries ignored),
    and each other sequence is divisible, its cost split into ``rho`` per token (``rho``
    the lowest cost per token among them) and a token-free rest. A replica with anchor cost
    ``a`` and ``t`` anchor tokens then takes at most ``min(room - t, (B - a) / rho)`` of
    the other tokens. Bisection keeps its lower end at a target so proven impossible (or
    the plain bound), so the result is a bound whether or not the test is monotone in ``B``.

    Args:
        padded: int64 padded lengths. costs: float64 cost of each sequence.
        dp_size, capacity, num_rounds: Replicas, tokens per microbatch, microbatches each.
        rel_tol: Bisection stops when its ends are this close (relative).
    """
    padded = np.asarray(padded, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    if padded.size == 0:
        return 0.0
    room = int(num_rounds) * int(capacity)
    if int(padded.sum()) > dp_size * room or int(padded.max()) > capacity:
        return float("inf")
    lo = max(float(costs.sum()) / dp_size, float(costs.max()))
    hi = max(lo, 1e-300)
    while not _holds(padded, costs, dp_size, room, hi):
        lo, hi = hi, 2 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if _holds(padded, costs, dp_size, room, mid):
            hi = mid
        else:
            lo = mid
    return lo
