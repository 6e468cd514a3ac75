"""Sample groups that stay together (GRPO responses of one prompt, DPO pairs): every
sequence of a group on one DP replica and, with ``together``, in one microbatch when the
group fits one. docs/rl.md ("Groups") describes the stages and measures what they cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from seqpack.cost import default_cost_model
from seqpack.errors import ConfigError, SampleError, ScheduleError
from seqpack.options import GroupSizes, OnOversize
from seqpack.schedulers.balanced import BalancedScheduler, relabel_replicas, round_position
from seqpack.schedulers.base import Scheduler, fit_sequence_slots, static_schedule
from seqpack.schedulers.group_sizes import allowed_group_sizes
from seqpack.schedulers.objective import step_objective
from seqpack.schedulers.request import Request, apply_static_oversize
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.shape_limits import refuse_dynamic
from seqpack.schedulers.step_time import predicted_step_time
from seqpack.thd import group_pad_multiple, group_padded_lengths, padded_lengths
from seqpack.validation import check_bool

__all__ = ["group_units", "join_plans", "pack_units", "schedule_groups"]


def schedule_groups(
    scheduler: Scheduler,
    request: Request,
    group_ids: np.ndarray,
    grouped: np.ndarray,
    *,
    together: bool = False,
    equal_counts: bool = False,
) -> Schedule:
    """A :class:`Schedule` of ``request`` keeping every group on one replica, planned by
    ``scheduler`` (a dynamic-CP one plans the sequences without a group).

    Args:
        group_ids: Group of every sequence (read where ``grouped``).
        grouped: The sequence carries a group id (else it is a group of one).
        together: Also keep every group that fits one microbatch in one microbatch.
        equal_counts: Every replica trains as many sequences (verl's ``equal_size``).

    Raises:
        ScheduleError: A group larger than a replica holds (fixed microbatch count), with
            ``together`` a replica's groups needing more than that count, or under
            ``equal_counts`` groups of different sizes or a count ``dp_size`` does not divide.
        SampleError: ``group_ids`` / ``grouped`` not one per length.
        ConfigError: ``together``, ``equal_counts`` or ``static_shapes`` under dynamic CP.
    """
    n = request.num_sequences
    group_ids = np.asarray(group_ids, dtype=np.int64).reshape(-1)
    grouped = np.asarray(grouped, dtype=bool).reshape(-1)
    if group_ids.shape[0] != n or grouped.shape[0] != n:
        raise SampleError(f"group_ids and grouped must hold one value per length ({n})")
    if scheduler.group_sizes == GroupSizes.STATIC:
        together, equal_counts = check_bool("together", together), check_bool("equal_counts", equal_counts)
        return _static_with_groups(scheduler, request, group_ids, grouped, together, equal_counts)
    refuse_dynamic(request.static_shapes, "schedule_groups under dynamic CP")
    for name, value in (("together", together), ("equal_counts", equal_counts)):
        if check_bool(name, value):
            raise ConfigError(
                f"{name}=True is not supported with dynamic CP: its plans place sequences on CP groups, not in "
                "a replica's microbatches (group_id works: a group stays on one replica's own CP ranks)"
            )
    return _dynamic_with_groups(scheduler, request, group_ids, grouped)


def _static_with_groups(
    scheduler: Scheduler, request: Request, group_ids: np.ndarray, grouped: np.ndarray, together: bool, equal: bool
) -> Schedule:
    """:func:`schedule_groups` under static CP (arguments checked by the caller)."""
    dp_size, cp_size, pad_multiple, capacity = request.dp_size, request.cp_size, request.pad_multiple, request.capacity
    effective, dropped, truncated = apply_static_oversize(request)
    active = np.flatnonzero(effective > 0).astype(np.int64)
    padded = padded_lengths(effective[active], pad_multiple)
    family = scheduler.resolve_cost(request.cost) or default_cost_model()
    model = family.at(cp_size)
    costs = model.cost(padded)
    if request.sample_cost is not None:  # groups weigh their samples' own costs too
        costs = costs + request.sample_cost[active]
    unit = group_units(group_ids[active], grouped[active])
    unit_tokens = np.bincount(unit, weights=padded).astype(np.int64) if active.size else np.zeros(0, np.int64)
    fixed = getattr(scheduler, "num_microbatches", None)
    budget = None if fixed is None else int(fixed) * capacity  # a fixed count: a replica holds at most this
    if budget is not None and unit_tokens.size and int(unit_tokens.max()) > budget:
        u = int(np.argmax(unit_tokens))
        members = active[unit == u]
        raise ScheduleError(
            f"group {int(group_ids[members[0]])} holds {int(unit_tokens[u])} padded tokens in {members.size} "
            f"sequence(s) (global ids {members[:8].tolist()}{'...' if members.size > 8 else ''}), more than one "
            f"replica holds this step: num_microbatches={fixed} x {capacity} tokens = {budget}. Raise "
            "max_tokens_per_rank or num_microbatches, or split the group"
        )
    unit_costs = np.bincount(unit, weights=costs) if active.size else np.zeros(0)
    sizes = np.bincount(unit) if active.size else np.zeros(0, np.int64)
    if equal and sizes.size and (sizes.min() != sizes.max() or sizes.size % dp_size):
        raise ScheduleError(
            f"equal_counts needs groups of one size, as many on every replica: got {sizes.size} groups of "
            f"{int(sizes.min())}..{int(sizes.max())} sequences for dp_size={dp_size}"
        )
    refined, alone = _assign(unit_costs, unit_tokens, dp_size, budget, equal)

    def final(per_replica: list[list[np.ndarray]]) -> Schedule:  # the plan ``per_replica`` ends as
        grid = [[np.sort(rounds[m]) for rounds in per_replica] for m in range(len(per_replica[0]))]
        if request.static_shapes is not None and grid:  # `together`'s packs, by tokens alone, need it
            on_group = None if request.cost is None else request.cost.at(cp_size)
            placed = dataclasses.replace(request, lengths=effective, cost=on_group)
            grid = fit_sequence_slots(scheduler, grid, placed, keep_replica=True, fixed_rounds=fixed)
        return static_schedule(request, grid, (effective, dropped, truncated))

    def measure(rows: list[list[np.ndarray]]) -> float:  # static shapes: the step time of the plan ``rows`` ends as
        try:
            return predicted_step_time(final(rows), family, sync=request.sync, static_shapes=request.static_shapes)
        except ScheduleError:  # that plan cannot be made (a forced count): never preferred
            return np.inf

    at_effective = dataclasses.replace(request, lengths=effective)
    planner = _ReplicaPlanner(scheduler, at_effective, together, active, unit, padded, costs, model.constant, measure)
    return final(planner.cheaper_placement(refined, alone))


@dataclasses.dataclass(frozen=True)
class _ReplicaPlanner:
    """Plans each replica's microbatches alone, all at one count (docs/rl.md, "Groups").
    ``active``: the global ids placed (``unit``, ``padded``, ``costs`` one each)."""

    scheduler: Scheduler
    request: Request
    together: bool
    active: np.ndarray
    unit: np.ndarray
    padded: np.ndarray
    costs: np.ndarray
    constant: float
    measure: Callable[[list[list[np.ndarray]]], float]  # static shapes: the step time of the plan it ends as
    cache: dict[tuple[int, bytes], list[np.ndarray]] = dataclasses.field(default_factory=dict)

    def cheaper_placement(self, refined: np.ndarray, alone: np.ndarray) -> list[list[np.ndarray]]:
        """:meth:`plan_all` at ``refined`` (replica of every unit), or at ``alone`` where that
        is faster or ``refined`` cannot be planned; raises ``refined``'s ScheduleError."""
        try:
            best, value = self.plan_all(refined)
        except ScheduleError as err:
            try:
                return self.plan_all(alone)[0]
            except ScheduleError:
                raise err from None
        if np.array_equal(alone, refined) or not _cheaper(self.lower_bound(alone), value):
            return best
        try:
            other, other_value = self.plan_all(alone)
        except ScheduleError:
            return best
        return other if _cheaper(other_value, value) else best

    def lower_bound(self, replica_of_unit: np.ndarray) -> float:
        """What no plan of the units at ``replica_of_unit`` beats under either sync."""
        dp, of = self.request.dp_size, replica_of_unit[self.unit]
        load, held = (np.bincount(of, weights=w, minlength=dp) for w in (self.costs, self.padded))
        forced = getattr(self.scheduler, "num_microbatches", None)
        count = int(forced) if forced is not None else -(-int(held.max()) // self.request.capacity)
        return float(load.max()) + count * self.constant

    def objective(self, per_replica: list[list[np.ndarray]]) -> float:
        """:func:`step_objective` of ``per_replica``, each microbatch plus ``constant`` (static shapes: ``measure``)."""
        if self.request.static_shapes is not None:
            return self.measure(per_replica)
        by_id = np.zeros(self.request.num_sequences)
        by_id[self.active] = self.costs
        load = np.array([[by_id[ids].sum() for ids in rounds] for rounds in per_replica])
        return step_objective(load.reshape(len(per_replica), -1).T + self.constant, self.request.sync)

    def plan_all(self, replica_of_unit: np.ndarray) -> tuple[list[list[np.ndarray]], float]:
        """(global ids of every microbatch of every replica at one count, its :meth:`objective`)
        with the units at ``replica_of_unit``, replicas renamed to the ranks holding their
        tokens; ScheduleError where ``together`` needs more than a forced count."""
        dp = self.request.dp_size
        replica = relabel_replicas(replica_of_unit[self.unit], self.request.origin[self.active], self.padded, dp)
        masks = [replica == d for d in range(dp)]
        rounds = [self.planned(0, m) for m in masks]
        count = max((len(r) for r in rounds), default=0)
        forced = getattr(self.scheduler, "num_microbatches", None)
        if forced is not None:
            if count > forced:  # only `together` packs its own count; a plan holds a forced one
                raise ScheduleError(
                    f"num_microbatches={forced} cannot hold a replica's groups whole (together / group_microbatch): "
                    f"they pack into {count} microbatches of {self.request.capacity} tokens. Raise num_microbatches "
                    f"to {count} or max_tokens_per_rank, or drop together (group_microbatch): a group then stays "
                    "on one replica only"
                )
            count = int(forced)
        filled = [r + [np.zeros(0, dtype=np.int64)] * (count - len(r)) for r in rounds]
        value = self.objective(filled)
        spreads = isinstance(self.scheduler, BalancedScheduler) and not self.together
        lighter = [d for d in range(dp) if 0 < len(rounds[d]) < count] if spreads else []
        if not lighter:
            return filled, value
        spread = [self.planned(count, masks[d]) if d in lighter else r for d, r in enumerate(filled)]
        spread_value = self.objective(spread)
        return (filled, value) if _cheaper(value, spread_value) else (spread, spread_value)

    def planned(self, count: int, mask: np.ndarray) -> list[np.ndarray]:
        """Global ids of each microbatch of the replica holding ``active[mask]``, planned by the
        scheduler (``count`` 0) or by ``balanced`` again at ``count``; cached."""
        ids, unit, padded, costs = self.active[mask], self.unit[mask], self.padded[mask], self.costs[mask]
        key = (count, ids.tobytes())
        if key in self.cache or not ids.size:
            return self.cache.get(key, [])
        scheduler, capacity = self.scheduler, self.request.capacity
        if count:
            assert isinstance(scheduler, BalancedScheduler)
            order, moves = scheduler.order, scheduler.max_repair_moves
            scheduler = BalancedScheduler(num_microbatches=count, locality=False, order=order, max_repair_moves=moves)
        if self.together:
            unit_tokens = np.bincount(unit, weights=padded)
            whole = np.where(unit_tokens[unit] <= capacity, unit, unit.max() + 1 + np.arange(unit.shape[0]))
            pack_order = getattr(scheduler, "order", "heavy_first")
            forced = getattr(scheduler, "num_microbatches", None)
            fewest = int(getattr(scheduler, "min_microbatches", 1)) if forced is None else int(forced)
            step = int(getattr(scheduler, "microbatch_multiple", 1)) if forced is None else 1
            packs = pack_units(whole, padded, costs, capacity, pack_order, fewest=fewest, step=step)
            rounds = [ids[pos] for pos in packs]
        else:
            home = np.zeros_like(ids)  # one replica
            alone = self.request.subset(ids, dp_size=1, origin=home, on_oversize=OnOversize.ERROR, bytes_per_token=None)
            rounds = [ids[row[0]] for row in scheduler.plan(alone).assignment]
        self.cache[key] = rounds
        return rounds


def _dynamic_with_groups(
    scheduler: Scheduler, request: Request, group_ids: np.ndarray, grouped: np.ndarray
) -> Schedule:
    """Groups under dynamic CP (docs/dynamic_cp.md): the grouped sequences as static CP by
    ``"balanced"`` on their replica's own CP ranks, then the others by ``scheduler``."""
    mode, original, cp, pad = scheduler.group_sizes, request.lengths, request.cp_size, request.pad_multiple
    mine, free = np.flatnonzero(grouped), np.flatnonzero(~grouped)
    if cp not in allowed_group_sizes(request.dp_size * cp, mode).tolist():
        raise ConfigError(f"group_id under dynamic CP needs cp_size={cp} a power of 2 or group_sizes='any'")
    over = np.flatnonzero(group_padded_lengths(original[mine], cp, pad) > cp * request.max_tokens_per_rank)
    if over.size:
        i, capacity = int(mine[over[0]]), request.max_tokens_per_rank
        raise ScheduleError(
            f"sample {i} carries a group_id and has {int(original[i])} tokens, more than its replica's {cp} rank(s) "
            f"hold ({cp} x max_tokens_per_rank={capacity}, padded to a multiple of {group_pad_multiple(cp, pad)}): "
            "under dynamic CP a group stays on one replica's own CP ranks"
        )
    chosen = request.cost if request.cost is not None else scheduler.resolve_cost(None)
    on_ranks = dict(pad_multiple=group_pad_multiple(cp, pad), on_oversize=OnOversize.ERROR, bytes_per_token=None)
    part = request.subset(mine, cost=None if chosen is None else chosen.at(cp), **on_ranks)
    static = schedule_groups(BalancedScheduler(), part, group_ids[mine], np.ones(mine.shape[0], dtype=bool))
    # The replicas' blocks are groups the dynamic plan may use, padded by its rule.
    parts, ids = [dataclasses.replace(static, group_sizes=mode, pad_multiple=pad)], [mine]
    if free.size:
        parts.append(scheduler.plan(request.subset(free)))
        ids.append(free)
    return join_plans(parts, ids, original)


def join_plans(parts: Sequence[Schedule], ids: Sequence[np.ndarray], original: np.ndarray) -> Schedule:
    """One plan running ``parts`` one after the other; ``ids[j]``: the global id of each of
    ``parts[j]``'s ids (``original``: every global id's length; ids in no part are dropped).
    Raises ScheduleError for parts made for different limits or group rules."""
    first = parts[0]
    for p in parts[1:]:
        if p.limits.to_array()[1:].tolist() != first.limits.to_array()[1:].tolist():
            raise ScheduleError(f"cannot join plans of different limits: {first.limits} and {p.limits}")
    rounds = np.cumsum([0, *(p.num_microbatches for p in parts)])

    def joined(name: str) -> np.ndarray:
        return np.concatenate([where[getattr(p, name)] for p, where in zip(parts, ids, strict=True)]).astype(np.int64)

    def scattered(name: str, dtype: type) -> np.ndarray:  # a part without the field gives zeros
        out: np.ndarray = np.zeros(original.shape[0], dtype=dtype)
        for p, where in zip(parts, ids, strict=True):
            out[where] = 0 if getattr(p, name) is None else getattr(p, name)
        return out

    return dataclasses.replace(  # the limits are the first part's
        first,
        num_microbatches=int(rounds[-1]),
        group_round=np.concatenate([p.group_round + r for p, r in zip(parts, rounds[:-1].tolist(), strict=True)]),
        group_start=np.concatenate([p.group_start for p in parts]),
        group_size=np.concatenate([p.group_size for p in parts]),
        group_counts=np.concatenate([p.group_counts for p in parts]),
        assigned=joined("assigned"),
        lengths=scattered("lengths", np.int64),
        original_lengths=original,
        deferred=np.sort(joined("deferred")),
        dropped=np.sort(joined("dropped")),
        truncated=np.sort(joined("truncated")),
        origin=scattered("origin", np.int64),
        sample_cost=None if all(p.sample_cost is None for p in parts) else scattered("sample_cost", np.float64),
    )


_REFINE_ROUNDS = 4  # refinement moves per unit at most
_TIE = 1e-9  # relative: step times closer than this are a tie (sums in another order)


def _cheaper(alternative: float, current: float) -> bool:
    """Whether ``alternative`` predicts a strictly faster step than ``current`` (not on a tie)."""
    return alternative < current - _TIE * abs(current)


def group_units(group_ids: np.ndarray, grouped: np.ndarray) -> np.ndarray:
    """Unit of every sequence: sequences with ``grouped`` set and equal ``group_ids`` share
    one; every other sequence is a unit of its own. Units are numbered by first appearance."""
    first = np.arange(group_ids.shape[0], dtype=np.int64)  # the first sequence of each one's unit
    where = np.flatnonzero(grouped)
    _, first_of, inverse = np.unique(group_ids[where], return_index=True, return_inverse=True)
    first[where] = where[first_of[inverse]]
    return np.cumsum(first == np.arange(first.shape[0]), dtype=np.int64)[first] - 1


def _assign(
    costs: np.ndarray, tokens: np.ndarray, dp_size: int, budget: int | None, equal: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(replica of every unit, LPT on ``costs`` then refined; by LPT alone). LPT places a unit
    only on a replica with room within ``budget`` tokens while one has it; ``equal`` deals
    units in rounds of ``dp_size`` (``dp_size`` divides their number), refined by swaps only."""
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
    else:
        for u in by_cost.tolist():
            room = np.flatnonzero(held + tokens[u] <= budget) if budget is not None else np.arange(dp_size)
            pool = room if room.size else np.arange(dp_size)
            d = int(pool[np.argmin(load[pool])])
            replica[u] = d
            load[d] += costs[u]
            held[d] += tokens[u]
    alone = replica.copy()
    # Refined: one unit moved, or two swapped, between the busiest replica and another
    # (lightest first) while the busier of the two gets lighter.
    limit = np.iinfo(np.int64).max if budget is None else budget
    state = (replica, costs, tokens, load, held)
    for _ in range(_REFINE_ROUNDS * n):
        hi = int(np.argmax(load))
        lows = np.argsort(load, kind="stable").tolist()
        if not any(lo != hi and _improve(state, hi, lo, limit, equal) for lo in lows):
            break
    return replica, alone


def _improve(state: tuple[np.ndarray, ...], hi: int, lo: int, limit: int, swaps_only: bool) -> bool:
    """Apply the move or swap from ``hi`` to ``lo`` that best evens the pair, if one lowers
    the larger of the two; whether one did. ``state``: replica, cost and tokens of every unit,
    cost and tokens of every replica (updated in place)."""
    replica, costs, tokens, load, held = state
    gap = load[hi] - load[lo]
    mine, theirs = np.flatnonzero(replica == hi), np.flatnonzero(replica == lo)
    # delta = cost moved from hi to lo; the pair's max drops iff 0 < delta < gap (never where gap <= 0).
    deltas = [] if swaps_only else [costs[mine]]
    pairs = [] if swaps_only else [np.stack([mine, np.full_like(mine, -1)], axis=1)]
    a, b = np.meshgrid(mine, theirs, indexing="ij")  # every swap (none where a replica holds no unit)
    deltas.append((costs[a] - costs[b]).ravel())
    pairs.append(np.stack([a.ravel(), b.ravel()], axis=1))
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
    unit_of: np.ndarray, padded: np.ndarray, costs: np.ndarray, capacity: int, order: str, *, fewest: int, step: int
) -> list[np.ndarray]:
    """Ascending positions of each microbatch: whole units (none over ``capacity``) by LPT into
    the fewest microbatches of ``capacity`` padded tokens that hold them, at least ``fewest``
    and a multiple of ``step``."""
    units, unit_index = np.unique(unit_of, return_inverse=True)
    tokens = np.bincount(unit_index, weights=padded, minlength=units.size).astype(np.int64)
    unit_cost = np.bincount(unit_index, weights=costs, minlength=units.size)
    by_cost = np.lexsort((np.arange(units.size), -tokens, -unit_cost)).tolist()
    count = -(-max(1, fewest, -(-int(tokens.sum()) // capacity)) // step) * step
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
        count += step
    position = round_position(load[:, None], order)
    where = position[bin_of[unit_index]]
    return [np.flatnonzero(where == m) for m in range(count)]
