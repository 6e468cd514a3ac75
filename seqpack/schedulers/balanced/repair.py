"""Step 4 of the balanced plan: the replica repair (moves and swaps of single sequences
off the busiest replica), bisecting between replica and round balance where they conflict.
"""

from __future__ import annotations

import numpy as np

from seqpack.options import Objective
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.rounds import (
    _BISECTION_STEPS,
    _GOOD_ENOUGH,
    _REPAIR_WORK,
    _SWAP_CANDIDATES,
    Sequences,
    _round_sum,
)
from seqpack.schedulers.objective import round_sum_lower_bound

Repaired = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]
"""(round_of, replica_of, load, tokens, moves) after the repair."""


def _repair(
    round_of: np.ndarray,
    replica_of: np.ndarray,
    load: np.ndarray,
    tokens: np.ndarray,
    padded: np.ndarray,
    costs: np.ndarray,
    order: np.ndarray,
    dp_size: int,
    capacity: int,
    max_moves: int,
    objective: str,
    stop_at: float | None = None,
    max_work: int = _REPAIR_WORK,
) -> Repaired:
    """Step 4 of the module docstring. Returns the repaired (round_of, replica_of, load,
    tokens, moves). ``stop_at``: busiest replica's cost at which to stop (default 0.1%
    above the bound); ``max_work``: candidate evaluations before it stops."""
    replica_bound = max(float(costs.sum()) / dp_size, float(costs.max()))
    if replica_bound <= 0:  # CostModel(0, 0, c): sequences cost nothing, there is nothing to balance
        return round_of, replica_of, load, tokens, 0
    round_bound = round_sum_lower_bound(padded, costs, dp_size, capacity, order=order)
    if stop_at is None:
        stop_at = (1 + _GOOD_ENOUGH) * replica_bound

    def run(budget: float) -> tuple[Repaired, float, float]:
        state = (round_of.copy(), replica_of.copy(), load.copy(), tokens.copy())
        moves = _kernels.repair_replicas(
            state[0],
            state[1],
            costs,
            padded,
            state[2],
            state[3],
            capacity,
            max_moves,
            1e-9,
            stop_at,
            _SWAP_CANDIDATES,
            budget,
            max_work,
        )
        replica = float(state[2].sum(axis=0).max()) / replica_bound
        rounds = _round_sum(state[2]) / round_bound
        return (*state, int(moves)), replica, rounds

    if objective == Objective.REPLICAS:
        return run(np.inf)[0]
    strict, replica, rounds = run(0.0)
    if objective == Objective.ROUNDS or replica <= rounds + _GOOD_ENOUGH:
        return strict
    # The goals conflict: find how much slower the rounds may get so that both end the same
    # distance from their bounds (bisection on the budget of sum_m max_d, up to where the
    # rounds would be as far from their bound as the busiest replica is now).
    best, best_score = strict, max(replica, rounds)
    low, high = rounds * round_bound, replica * round_bound
    for _ in range(_BISECTION_STEPS):
        budget = (low + high) / 2
        candidate, c_replica, c_rounds = run(budget)
        if max(c_replica, c_rounds) < best_score:
            best, best_score = candidate, max(c_replica, c_rounds)
        if c_replica > c_rounds:
            low = budget
        else:
            high = budget
    return best


def repair(seqs: Sequences, grid: Repaired, forced: bool) -> Repaired:
    """The repair as a stage of the plan: :func:`_repair` of the dealt grid under the step's
    objective and move budget (``forced`` does not change it)."""
    round_of, replica_of, load, tokens, _ = grid
    return _repair(
        round_of,
        replica_of,
        load,
        tokens,
        seqs.padded,
        seqs.costs,
        seqs.order,
        seqs.dp_size,
        seqs.capacity,
        seqs.max_repair_moves,
        seqs.objective,
    )
