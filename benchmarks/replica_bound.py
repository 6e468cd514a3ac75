"""A capacity-aware lower bound on the busiest replica's cost, the yardstick of
benchmarks/heavy_tail.py and tests/schedulers/test_replica_bound.py (the planner does not use it)."""

from __future__ import annotations

import numpy as np


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
