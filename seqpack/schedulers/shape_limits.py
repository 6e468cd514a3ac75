"""What :class:`~seqpack.thd.StaticShapes` asks of a static plan (at most
``max_real_sequences`` sequences and the largest bucket's tokens a microbatch), the repairs
that keep a plan within it, and what bucket padding costs (docs/schedulers.md, static shapes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError, ScheduleError
from seqpack.options import INT32_MAX, Sync
from seqpack.thd.static_shapes import StaticShapes, as_static_shapes

__all__ = ["BucketPrice", "bucket_capacity", "fit_sequence_limit", "group_buckets", "resolved_buckets"]


def refuse_dynamic(static_shapes: object, what: str) -> None:
    """Raise ConfigError if ``static_shapes`` is given to a dynamic-CP plan (``what`` names it)."""
    if as_static_shapes(static_shapes) is not None:
        raise ConfigError(
            f"static_shapes is not supported by {what}: a dynamic-CP group's pack size depends on the group's size "
            "(its tokens are split over 1..dp*cp ranks), so no fixed token bucket fits every rank; use a static-CP "
            "scheduler ('balanced', 'dp_balanced', 'empty') with static_shapes"
        )


def resolved_buckets(static_shapes: StaticShapes, capacity: int) -> tuple[int, ...]:
    """The buckets at ``capacity`` tokens a microbatch (``"capacity"``: it, at most int32's largest)."""
    return static_shapes.buckets(min(capacity, INT32_MAX))


def bucket_capacity(static_shapes: StaticShapes, capacity: int) -> int:
    """The most padded tokens a microbatch may hold: ``capacity`` or the largest bucket."""
    return min(capacity, resolved_buckets(static_shapes, capacity)[-1])


def group_buckets(static_shapes: StaticShapes, tokens: np.ndarray, capacity: int) -> np.ndarray:
    """int64: the bucket of each microbatch of ``tokens`` padded tokens; ScheduleError naming
    a microbatch larger than the largest bucket (a plan made without these shapes)."""
    buckets = np.asarray(resolved_buckets(static_shapes, capacity), dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    index = np.searchsorted(buckets, tokens)
    over = np.flatnonzero(index == buckets.shape[0])
    if over.size:
        g = int(over[0])
        raise ScheduleError(
            f"microbatch (group) {g} holds {int(tokens[g])} padded tokens, more than the largest token bucket "
            f"{int(buckets[-1])}: the schedule was not made with these static_shapes (pass static_shapes= to "
            "schedule())"
        )
    return buckets[index]


@dataclasses.dataclass(frozen=True)
class BucketPrice:
    """The linear cost of the tokens a microbatch's bucket adds beyond its padded tokens:
    ``linear * (bucket - tokens)`` (an empty microbatch: its whole smallest bucket)."""

    buckets: np.ndarray
    linear: float

    @classmethod
    def of(cls, static_shapes: StaticShapes | None, capacity: int, linear: float) -> BucketPrice | None:
        """The price at ``capacity`` (None without shapes or when ``linear`` is 0)."""
        if static_shapes is None or linear <= 0:
            return None
        return cls(np.asarray(resolved_buckets(static_shapes, capacity), dtype=np.int64), float(linear))

    def extra(self, tokens: np.ndarray) -> np.ndarray:
        """float64: the bucket padding's cost of microbatches of ``tokens`` (0 past the largest)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        index = np.minimum(np.searchsorted(self.buckets, tokens), self.buckets.shape[0] - 1)
        return self.linear * np.maximum(self.buckets[index] - tokens, 0).astype(np.float64)


def fit_sequence_limit(
    rounds: Sequence[Sequence[np.ndarray]],
    padded: np.ndarray,
    weight: np.ndarray,
    *,
    limit: int,
    capacity: int,
    keep_replica: bool = False,
    round_multiple: int = 1,
    fixed_rounds: int | None = None,
) -> list[list[np.ndarray]]:
    """``rounds`` (``rounds[m][d]`` global ids) with at most ``limit`` ids per microbatch: the
    excess of an over-full microbatch (its shortest ids, ties the larger id) moves, longest
    first, to the least loaded (``weight``) microbatch with a slot and room within ``capacity``
    (docs/schedulers.md), rounds added in multiples of ``round_multiple``. ``padded`` and
    ``weight`` by global id. ScheduleError when the ids need more than ``fixed_rounds``."""
    grid = [[np.asarray(ids, dtype=np.int64) for ids in row] for row in rounds]
    if all(ids.shape[0] <= limit for row in grid for ids in row):
        return grid
    dp = len(grid[0])
    sizes = np.array([ids.shape[0] for row in grid for ids in row], dtype=np.int64)
    every = np.concatenate([ids for row in grid for ids in row])
    cell = np.repeat(np.arange(sizes.size), sizes)
    order = np.lexsort((-every, padded[every], cell))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0]) - starts[cell[order]]
    excess = rank < (sizes - limit)[cell]
    kept = ~excess
    shape = (len(grid), dp)
    counts = np.minimum(sizes, limit).reshape(shape)  # the kept ids
    tokens = np.bincount(cell[kept], weights=padded[every[kept]], minlength=sizes.size).astype(np.int64).reshape(shape)
    load = np.bincount(cell[kept], weights=weight[every[kept]], minlength=sizes.size).reshape(shape)
    touched: dict[tuple[int, int], list[int]] = {}  # the cells a move touched, as lists
    for c in np.unique(cell[excess]).tolist():
        m, d = divmod(c, dp)
        touched[m, d] = grid[m][d][kept[starts[c] : starts[c] + sizes[c]]].tolist()
    pending = every[excess]
    pending_cell = cell[excess]
    moving = np.lexsort((pending, -padded[pending]))  # longest first, ties the lower id
    for i, c in zip(pending[moving].tolist(), pending_cell[moving].tolist(), strict=True):
        m, d = divmod(c, dp)
        size = int(padded[i])
        room = (counts < limit) & (tokens + size <= capacity)
        if keep_replica:
            room[:, np.arange(dp) != d] = False
        found = _least_loaded(room, load, m)
        if found is None:
            if fixed_rounds is not None:
                needed = len(fit_sequence_limit(rounds, padded, weight, limit=limit, capacity=capacity,
                                                keep_replica=keep_replica, round_multiple=round_multiple))  # fmt: skip
                raise ScheduleError(
                    f"num_microbatches={fixed_rounds} cannot hold the step's sequences at most {limit} per "
                    f"microbatch (static_shapes' max_real_sequences) within {capacity} tokens: they take "
                    f"{needed} microbatches; raise num_microbatches to {needed} or max_sequences"
                )
            added = round_multiple
            counts, tokens, load = (np.vstack([a, np.zeros((added, dp), a.dtype)]) for a in (counts, tokens, load))
            grid.extend([np.zeros(0, np.int64)] * dp for _ in range(added))
            found = (counts.shape[0] - added) * dp + (d if keep_replica else 0)
        tm, td = divmod(found, dp)
        touched.setdefault((tm, td), grid[tm][td].tolist()).append(i)
        counts[tm, td] += 1
        tokens[tm, td] += size
        load[tm, td] += float(weight[i])
    for (m, d), ids in touched.items():
        grid[m][d] = np.sort(np.asarray(ids, dtype=np.int64))
    return grid


def _least_loaded(room: np.ndarray, load: np.ndarray, m: int) -> int | None:
    """The flat index (``round * dp + replica``) of the least loaded cell of ``room`` (ties:
    the lowest index), of round ``m`` first, then of any round; None without room."""
    dp = room.shape[1]
    for offset, where, cost in ((m * dp, room[m], load[m]), (0, room.reshape(-1), load.reshape(-1))):
        candidates = np.flatnonzero(where)
        if candidates.size:
            return offset + int(candidates[np.argmin(cost[candidates])])
    return None


def trim_to_buckets(
    rounds: Sequence[Sequence[np.ndarray]],
    padded: np.ndarray,
    weight: np.ndarray,
    *,
    price: BucketPrice,
    limit: int,
    capacity: int,
    constant: float,
    sync: str,
) -> list[list[np.ndarray]]:
    """``rounds`` with the microbatches that set the step's time and sit just past a bucket
    edge brought below it by moving one sequence where the step objective (``weight`` summed,
    plus ``constant`` and ``price``) drops (docs/schedulers.md): to another microbatch of the
    round with a slot and room within ``capacity`` (replica sync: also to another round of
    the replica). ``padded`` and ``weight`` by global id; untouched cells come back as given."""
    grid = [[np.asarray(ids, dtype=np.int64) for ids in row] for row in rounds]
    if not grid or not grid[0]:
        return grid
    shape = (len(grid), len(grid[0]))
    sizes = np.array([ids.shape[0] for row in grid for ids in row], dtype=np.int64)
    every = np.concatenate([ids for row in grid for ids in row])
    cell = np.repeat(np.arange(sizes.size), sizes)
    state = _TrimState(
        tokens=np.bincount(cell, weights=padded[every], minlength=sizes.size).astype(np.int64).reshape(shape),
        load=np.bincount(cell, weights=weight[every], minlength=sizes.size).reshape(shape) + constant,
        counts=sizes.reshape(shape).copy(),
        padded=padded,
        weight=weight,
        price=price,
        limit=limit,
        largest=min(capacity, int(price.buckets[-1])),
        lockstep=sync == Sync.LOCKSTEP,
    )
    members: dict[tuple[int, int], list[int]] = {}  # the cells a move touched, as lists

    def trim(m: int, d: int) -> bool:
        ids = members[m, d] if (m, d) in members else grid[m][d].tolist()
        shifts = (False,) if state.lockstep else (False, True)  # replica: a replica's rounds may trade too
        found = [move for move in (state.best_move(m, d, ids, shift) for shift in shifts) if move is not None]
        if not found:
            return False
        i, (tm, td), _ = max(found, key=lambda move: move[2])
        state.move((m, d), (tm, td), i)
        ids.remove(i)
        members[m, d] = ids
        members.setdefault((tm, td), grid[tm][td].tolist()).append(i)
        return True

    # Only a round's slowest microbatch can shorten a lockstep step, only the slowest
    # replica's a replica step; 8 moves a round at most (plan time).
    rounds_count = state.tokens.shape[0]
    if state.lockstep:
        for m in range(rounds_count):
            for _ in range(8):
                if not trim(m, int(np.argmax(state.times[m]))):
                    break
    else:
        for _ in range(8 * rounds_count):
            d = int(np.argmax(state.column))
            if not any(trim(m, d) for m in np.argsort(-state.times[:, d]).tolist()):
                break
    for (m, d), ids in members.items():
        grid[m][d] = np.sort(np.asarray(ids, dtype=np.int64))
    return grid


@dataclasses.dataclass
class _TrimState:
    """:func:`trim_to_buckets`' grid: tokens, costs (constant included), counts and times (bucket
    padding included) of every microbatch ``[M, dp]``, each replica's total time (``column``)."""

    tokens: np.ndarray
    load: np.ndarray
    counts: np.ndarray
    padded: np.ndarray
    weight: np.ndarray
    price: BucketPrice
    limit: int
    largest: int
    lockstep: bool  # else replica sync

    def __post_init__(self) -> None:
        self.times = self.load + self.price.extra(self.tokens)
        self.column = self.times.sum(axis=0)

    def move(self, source: tuple[int, int], target: tuple[int, int], i: int) -> None:
        size, cost = int(self.padded[i]), float(self.weight[i])
        for cell, sign in ((source, -1), (target, 1)):
            self.tokens[cell] += sign * size
            self.load[cell] += sign * cost
            self.counts[cell] += sign
        for m in {source[0], target[0]}:
            row = self.load[m] + self.price.extra(self.tokens[m])
            self.column += row - self.times[m]
            self.times[m] = row

    def _candidates(self, m: int, d: int, ids: list[int]) -> list[int]:
        """The 3 shortest ids of microbatch ``(m, d)`` whose leaving drops it a bucket."""
        t, edges, padded = int(self.tokens[m, d]), self.price.buckets, self.padded
        k = int(np.searchsorted(edges, t))
        if k == 0 or t == 0:
            return []
        need = t - int(edges[k - 1])
        return sorted((i for i in ids if int(padded[i]) >= need), key=lambda i: (int(padded[i]), i))[:3]

    def best_move(self, m: int, d: int, ids: list[int], shift: bool) -> tuple[int, tuple[int, int], float] | None:
        """``(id, target cell, gain)`` of the move out of microbatch ``(m, d)`` that lowers the
        objective most, or None: to another replica of round ``m``, or with ``shift`` (replica
        sync) to another round of replica ``d``."""
        line = (slice(None), d) if shift else (m, slice(None))  # the candidate targets
        own = m if shift else d  # the source's index on that line
        times, tokens = self.times[line], self.tokens[line]
        best, best_gain = None, 1e-9 * float((self.column if shift else times).max())
        for i in self._candidates(m, d, ids):
            size, cost = int(self.padded[i]), float(self.weight[i])
            after = tokens + size
            fits = (after <= self.largest) & (self.counts[line] < self.limit)
            fits[own] = False
            if not fits.any():
                continue
            source = self.load[m, d] - cost + float(self.price.extra(np.array([tokens[own] - size]))[0])
            target = self.load[line] + cost + self.price.extra(after)  # each cell of the line as the target
            if shift:  # replica d's new total with each target round; the others' largest
                total = self.column[d] + (source - times[m]) + (target - times)
                gain = float(self.column.max()) - np.maximum(float(_largest_but(self.column)[d]), total)
            else:
                new_row = times.copy()
                new_row[d] = source
                if self.lockstep:  # the round's new maximum with each target: the largest of the others
                    gain = float(times.max()) - np.maximum(_largest_but(new_row), target)
                else:  # the largest replica total with each target
                    column = self.column.copy()
                    column[d] += new_row[d] - times[d]
                    gain = float(self.column.max()) - np.maximum(_largest_but(column), column + target - times)
            gain[~fits] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] > best_gain:
                best, best_gain = (i, (j, d) if shift else (m, j), float(gain[j])), float(gain[j])
        return best


def _largest_but(values: np.ndarray) -> np.ndarray:
    """For every index, the largest of the other values (-inf alone)."""
    first = int(np.argmax(values))
    out = np.full(values.shape[0], float(values[first]))
    out[first] = float(np.delete(values, first).max(initial=-np.inf))
    return out
