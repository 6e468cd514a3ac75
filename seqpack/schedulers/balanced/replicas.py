"""Replica-first planning (``sync="replica"``; docs/schedulers.md, step 4) and :func:`repair`,
which swaps sequences between the busiest replica and light ones (locality uses it too).
"""

from __future__ import annotations

import numpy as np

from seqpack.options import Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.rounds import _GAP_FOR_MORE, Layout, Sequences, laid_out

__all__ = ["LPT_WORK", "repair", "replica_first", "replica_first_stage"]

LPT_WORK = 50_000_000  # heap steps and bin scans before the replica-first pass gives up
_GOOD_ENOUGH = 1e-3  # the repair stops within 0.1% of the replica bound
_SWAP_CANDIDATES = 4  # lightest replicas the repair tries swaps with
_REPAIR_WORK = 10_000_000  # candidate evaluations before the repair stops


def repair(
    grid: Layout, padded: np.ndarray, costs: np.ndarray, capacity: int, max_moves: int, stop_at: float, max_work: int
) -> Layout:
    """A copy of ``grid`` repaired by :func:`~seqpack.schedulers._kernels.repair_replicas` (at most
    ``max_moves`` swaps and ``max_work`` checks; stops once the busiest replica is at most ``stop_at``)."""
    round_of, replica_of, load, tokens = (a.copy() for a in grid)
    _kernels.repair_replicas(
        round_of, replica_of, costs, padded, load, tokens, capacity, max_moves, 1e-9, stop_at,
        _SWAP_CANDIDATES, max_work,
    )  # fmt: skip
    return round_of, replica_of, load, tokens


def replica_first(
    padded: np.ndarray, costs: np.ndarray, order: np.ndarray, dp_size: int, capacity: int, num_rounds: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(round_of, replica_of)`` of the replica-first plan (:func:`~seqpack.schedulers._kernels.replica_lpt`)
    of ``padded`` taken in ``order`` (``num_rounds >= 1``), or None when a sequence fits no microbatch left."""
    ok, round_of, replica_of = _kernels.replica_lpt(order, padded, costs, dp_size, num_rounds, capacity, LPT_WORK)
    return (round_of, replica_of) if ok else None


def replica_first_stage(seqs: Sequences, grid: Layout, forced: bool) -> Layout:
    """``grid``, or under ``sync="replica"`` the repaired replica-first plan where
    docs/schedulers.md (step 4) takes it; with ``forced``, any lighter one."""
    if seqs.sync != Sync.REPLICA:
        return grid
    padded, costs, dp_size, capacity = seqs.padded, seqs.costs, seqs.dp_size, seqs.capacity
    load = grid[2]
    bound = max(float(costs.sum()) / dp_size, float(costs.max()))
    busiest = float(load.sum(axis=0).max())
    if busiest <= (1 + _GOOD_ENOUGH) * bound:
        return grid
    found = replica_first(padded, costs, seqs.fill_order, dp_size, capacity, load.shape[0])
    if found is None:
        return grid
    first = laid_out(padded, costs, *found, load.shape)
    candidate = repair(first, padded, costs, capacity, seqs.max_repair_moves, (1 + _GOOD_ENOUGH) * bound, _REPAIR_WORK)
    lighter = float(candidate[2].sum(axis=0).max())
    close = forced or lighter <= (1 + _GAP_FOR_MORE) * bound
    return candidate if lighter < busiest and close else grid
