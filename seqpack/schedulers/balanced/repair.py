"""The replica repair: moves and swaps of single sequences off the busiest replica, without
slowing the rounds under lockstep. The replica-first plan
(:mod:`~seqpack.schedulers.balanced.replicas`) and locality's per-replica layout repair their
grids with it.
"""

from __future__ import annotations

import numpy as np

from seqpack.options import Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.rounds import (
    _GOOD_ENOUGH,
    _REPAIR_WORK,
    _SWAP_CANDIDATES,
)

Repaired = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(round_of, replica_of, load, tokens) after the repair."""


def _repair(
    round_of: np.ndarray,
    replica_of: np.ndarray,
    load: np.ndarray,
    tokens: np.ndarray,
    padded: np.ndarray,
    costs: np.ndarray,
    dp_size: int,
    capacity: int,
    max_moves: int,
    sync: str,
    stop_at: float | None = None,
    max_work: int = _REPAIR_WORK,
) -> Repaired:
    """The repair (module docstring): repaired copies of the grid. ``stop_at``: busiest
    replica's cost at which to stop (default 0.1% above the bound); ``max_work``: candidate
    evaluations before it stops."""
    replica_bound = max(float(costs.sum()) / dp_size, float(costs.max()))
    if replica_bound <= 0:  # CostModel(0, 0, c): sequences cost nothing, there is nothing to balance
        return round_of, replica_of, load, tokens
    if stop_at is None:
        stop_at = (1 + _GOOD_ENOUGH) * replica_bound
    # How much slower the rounds may get: not at all under lockstep, freely for replicas.
    rounds_budget = np.inf if sync == Sync.REPLICA else 0.0
    state = (round_of.copy(), replica_of.copy(), load.copy(), tokens.copy())
    _kernels.repair_replicas(
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
        rounds_budget,
        max_work,
    )
    return state
