"""Where whole groups go (a group is a unit: every sequence of it together): the units of
the sequences (:func:`group_units`), the units' replicas by LPT on cost refined by moves and
swaps (:func:`assign_units`), and their microbatches by LPT into the fewest that hold them
(:func:`pack_units`). :func:`~seqpack.schedulers.sample_groups.schedule_groups` plans with
them.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers.balanced import round_position

__all__ = ["assign_units", "group_units", "pack_units"]

_REFINE_ROUNDS = 4  # refinement moves per unit at most


def group_units(group_ids: np.ndarray, grouped: np.ndarray) -> np.ndarray:
    """Unit of every sequence: sequences with ``grouped`` set and equal ``group_ids`` share
    one; every other sequence is a unit of its own. Units are numbered by first appearance."""
    n = group_ids.shape[0]
    key = np.where(grouped, group_ids, 0)
    unit = np.empty(n, dtype=np.int64)
    first: dict[int, int] = {}
    count = 0
    for i, (g, has) in enumerate(zip(key.tolist(), grouped.tolist(), strict=True)):
        if has and g in first:
            unit[i] = first[g]
            continue
        unit[i] = count
        if has:
            first[g] = count
        count += 1
    return unit


def assign_units(
    costs: np.ndarray, tokens: np.ndarray, dp_size: int, budget: int | None = None, *, equal: bool = False
) -> np.ndarray:
    """Replica of every unit: LPT on ``costs``, then refined (module docstring, step 1).

    ``budget``: padded tokens a replica may hold; LPT places a unit only on a replica with
    room while one has it (units no replica has room for go where the cost is least).
    ``equal``: every replica gets the same number of units (``dp_size`` divides it): the
    units are dealt in rounds of ``dp_size``, the costliest to the least loaded replica, and
    refined by swaps only.
    """
    n = costs.shape[0]
    replica = np.zeros(n, dtype=np.int64)
    load = np.zeros(dp_size, dtype=np.float64)
    held = np.zeros(dp_size, dtype=np.int64)
    by_cost = np.lexsort((np.arange(n), -tokens, -costs))
    if equal:
        for start in range(0, n, dp_size):
            chunk = by_cost[start : start + dp_size]
            targets = np.argsort(load, kind="stable")[: chunk.shape[0]]
            replica[chunk] = targets
            np.add.at(load, targets, costs[chunk])
            np.add.at(held, targets, tokens[chunk])
        if dp_size > 1:
            _refine(replica, costs, tokens, load, held, budget, swaps_only=True)
        return replica
    for u in by_cost.tolist():
        room = np.flatnonzero(held + tokens[u] <= budget) if budget is not None else np.arange(dp_size)
        pool = room if room.size else np.arange(dp_size)
        d = int(pool[np.argmin(load[pool])])
        replica[u] = d
        load[d] += costs[u]
        held[d] += tokens[u]
    if dp_size > 1:
        _refine(replica, costs, tokens, load, held, budget)
    return replica


def _refine(
    replica: np.ndarray,
    costs: np.ndarray,
    tokens: np.ndarray,
    load: np.ndarray,
    held: np.ndarray,
    budget: int | None,
    *,
    swaps_only: bool = False,
) -> None:
    """Move one unit, or swap two, between the busiest replica and another (lightest first)
    while the busier of the two gets lighter (in place)."""
    limit = np.iinfo(np.int64).max if budget is None else budget
    for _ in range(_REFINE_ROUNDS * replica.shape[0]):
        hi = int(np.argmax(load))
        for lo in np.argsort(load, kind="stable").tolist():
            if lo == hi or not _improve(replica, costs, tokens, load, held, hi, lo, limit, swaps_only):
                continue
            break
        else:
            return


def _improve(
    replica: np.ndarray,
    costs: np.ndarray,
    tokens: np.ndarray,
    load: np.ndarray,
    held: np.ndarray,
    hi: int,
    lo: int,
    limit: int,
    swaps_only: bool = False,
) -> bool:
    """Apply the move or swap from ``hi`` to ``lo`` that best evens the pair, if one lowers
    the larger of the two; whether one did."""
    gap = load[hi] - load[lo]
    if gap <= 0:
        return False
    mine, theirs = np.flatnonzero(replica == hi), np.flatnonzero(replica == lo)
    # delta = cost moved from hi to lo; the pair's max drops iff 0 < delta < gap.
    deltas = [] if swaps_only else [costs[mine]]
    pairs = [] if swaps_only else [np.stack([mine, np.full_like(mine, -1)], axis=1)]
    if theirs.size:
        a, b = np.meshgrid(mine, theirs, indexing="ij")
        deltas.append((costs[a] - costs[b]).ravel())
        pairs.append(np.stack([a.ravel(), b.ravel()], axis=1))
    if not deltas:
        return False
    delta, pair = np.concatenate(deltas), np.concatenate(pairs)
    moved_tokens = tokens[pair[:, 0]] - np.where(pair[:, 1] >= 0, tokens[np.maximum(pair[:, 1], 0)], 0)
    ok = (delta > 0) & (delta < gap) & (held[lo] + moved_tokens <= limit) & (held[hi] - moved_tokens <= limit)
    if not ok.any():
        return False
    best = int(np.flatnonzero(ok)[np.argmin(np.abs(gap / 2 - delta[ok]))])
    u, v = (int(x) for x in pair[best])
    replica[u] = lo
    if v >= 0:
        replica[v] = hi
    load[hi] -= delta[best]
    load[lo] += delta[best]
    held[hi] -= moved_tokens[best]
    held[lo] += moved_tokens[best]
    return True


def pack_units(
    unit_of: np.ndarray, padded: np.ndarray, costs: np.ndarray, capacity: int, order: str = "heavy_first"
) -> list[np.ndarray]:
    """Positions of each microbatch when whole units go into the fewest microbatches of
    ``capacity`` padded tokens that LPT fits them in (costliest unit first, each to the
    microbatch with the least cost that has room). A unit larger than ``capacity`` must have
    been split by the caller. Positions ascend inside each microbatch."""
    units, unit_index = np.unique(unit_of, return_inverse=True)
    tokens = np.bincount(unit_index, weights=padded, minlength=units.size).astype(np.int64)
    unit_cost = np.bincount(unit_index, weights=costs, minlength=units.size)
    by_cost = np.lexsort((np.arange(units.size), -tokens, -unit_cost)).tolist()
    count = max(1, -(-int(tokens.sum()) // capacity))
    while True:  # ends: one unit per microbatch always fits
        bin_of = np.full(units.size, -1, dtype=np.int64)
        load, held = np.zeros(count), np.zeros(count, dtype=np.int64)
        for u in by_cost:
            room = np.flatnonzero(held + tokens[u] <= capacity)
            if not room.size:
                break
            b = int(room[np.argmin(load[room])])
            bin_of[u], load[b], held[b] = b, load[b] + unit_cost[u], held[b] + tokens[u]
        else:
            break
        count += 1
    position = round_position(load[:, None], order)
    where = position[bin_of[unit_index]]
    return [np.flatnonzero(where == m) for m in range(count)]
