"""What :class:`~seqpack.thd.StaticShapes` asks of a static plan: at most
``max_real_sequences`` sequences and at most the largest token bucket in every microbatch
(hard limits, like the token capacity), and what its bucket padding costs.

Every static-CP scheduler (:class:`~seqpack.schedulers.base.GridScheduler`) plans at the
capacity ``min(capacity, largest bucket)`` and then :func:`fit_sequence_limit` repairs its
plan: the excess sequences of an over-full microbatch (its shortest ones) move into the
least loaded microbatch of the same round with room for them (a free slot and the tokens),
else of any round, else into added rounds. ``balanced`` also starts its count search at
``ceil(N / (dp * max_real_sequences))`` and compares counts on the bucket-inclusive cost
(:class:`BucketPrice`), so it seldom leaves anything to repair, and then trims the
microbatches that set the step's time to the buckets (:func:`trim_to_buckets`).

:func:`static_shapes_by_cost` chooses the buckets: the least-padding ladder of sample plans
(:func:`ladder_for`, exact), improved for their predicted step time (:class:`FixedPlans`),
re-planned, and kept by the mean predicted step time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.cost import CostModel, GroupCost, as_group_cost, default_cost_model
from seqpack.errors import ConfigError, ScheduleError, SeqpackTypeError
from seqpack.options import INT32_MAX, Sync, TailPadding
from seqpack.schedulers.request import as_lengths
from seqpack.thd.static_shapes import StaticShapes
from seqpack.validation import check_choice, check_int, check_positive_int

if TYPE_CHECKING:
    from seqpack.schedulers.base import Scheduler
    from seqpack.schedulers.schedule import Schedule

logger = logging.getLogger(__name__)

__all__ = [
    "BucketPrice",
    "as_static_shapes",
    "bucket_capacity",
    "fit_sequence_limit",
    "group_buckets",
    "resolved_buckets",
    "ladder_for",
    "static_shapes_by_cost",
]


def as_static_shapes(value: object) -> StaticShapes | None:
    """``value`` when a :class:`~seqpack.thd.StaticShapes` or None.

    Raises:
        SeqpackTypeError: Anything else.
    """
    if value is None or isinstance(value, StaticShapes):
        return value
    raise SeqpackTypeError(f"static_shapes must be a seqpack.StaticShapes or None, got {type(value).__name__}")


def refuse_dynamic(static_shapes: object, what: str) -> None:
    """Refuse ``static_shapes`` for a dynamic-CP plan (``what`` names the caller).

    Raises:
        ConfigError: ``static_shapes`` given.
    """
    if as_static_shapes(static_shapes) is not None:
        raise ConfigError(
            f"static_shapes is not supported by {what}: a dynamic-CP group's pack size depends on the group's size "
            "(its tokens are split over 1..dp*cp ranks), so no fixed token bucket fits every rank; use a static-CP "
            "scheduler ('balanced', 'dp_balanced', 'empty') with static_shapes"
        )


def resolved_buckets(static_shapes: StaticShapes, capacity: int) -> tuple[int, ...]:
    """The buckets of a plan of ``capacity`` tokens a microbatch: ``"capacity"`` is the
    capacity, at most the largest int32 (a pack's token count is one)."""
    return static_shapes.buckets(min(capacity, INT32_MAX))


def bucket_capacity(static_shapes: StaticShapes, capacity: int) -> int:
    """The most padded tokens a microbatch may hold: ``capacity``, or the largest bucket when
    smaller (``"capacity"``: the capacity itself)."""
    return min(capacity, resolved_buckets(static_shapes, capacity)[-1])


def group_buckets(static_shapes: StaticShapes, tokens: np.ndarray, capacity: int) -> np.ndarray:
    """int64: the bucket of each microbatch of ``tokens`` padded tokens (an empty one's
    filler included by the caller).

    Raises:
        ScheduleError: A microbatch larger than the largest bucket (a plan made without
            these shapes), named with it.
    """
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
        """The price for ``static_shapes`` at ``capacity`` (None without shapes or when the
        padding costs nothing: ``linear == 0``)."""
        if static_shapes is None or linear <= 0:
            return None
        return cls(np.asarray(resolved_buckets(static_shapes, capacity), dtype=np.int64), float(linear))

    def bucket_of(self, tokens: np.ndarray) -> np.ndarray:
        """int64, shaped as ``tokens``: the bucket of microbatches holding ``tokens`` (the
        largest for more)."""
        index = np.minimum(np.searchsorted(self.buckets, tokens), self.buckets.shape[0] - 1)
        return self.buckets[index]

    def extra(self, tokens: np.ndarray) -> np.ndarray:
        """float64, shaped as ``tokens``: the bucket padding's cost of microbatches holding
        ``tokens`` (each at most the largest bucket)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        return self.linear * np.maximum(self.bucket_of(tokens) - tokens, 0).astype(np.float64)


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
    """``rounds`` (``rounds[m][d]`` global ids) with at most ``limit`` ids per microbatch.

    The excess of every over-full microbatch (its shortest ids, ties the larger id) moves,
    longest first, to the least loaded (``weight``) microbatch with a free slot and room for
    its ``padded`` tokens within ``capacity``: of the same round first, then of any round,
    then of rounds added at the end (in multiples of ``round_multiple``). With
    ``keep_replica`` an id only moves between microbatches of its own replica (groups, or
    a scheduler that never moves samples). ``padded`` and ``weight`` are indexed by global
    id. A plan within the limit comes back unchanged (same arrays, same order).

    Raises:
        ScheduleError: ``fixed_rounds`` given and the ids need more rounds.
    """
    grid = [[np.asarray(ids, dtype=np.int64) for ids in row] for row in rounds]
    if all(ids.shape[0] <= limit for row in grid for ids in row):
        return grid
    dp = len(grid[0])
    flat = [ids for row in grid for ids in row]
    sizes = np.array([ids.shape[0] for ids in flat], dtype=np.int64)
    every = np.concatenate(flat)
    cell = np.repeat(np.arange(sizes.shape[0]), sizes)
    # The excess of every over-full microbatch: its shortest ids (ties: the larger id).
    order = np.lexsort((-every, padded[every], cell))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0]) - starts[cell[order]]
    excess = rank < (sizes - limit)[cell]
    kept = ~excess
    shape = (len(grid), dp)
    counts = np.bincount(cell[kept], minlength=sizes.shape[0]).astype(np.int64).reshape(shape)
    tokens = np.bincount(cell[kept], weights=padded[every[kept]], minlength=sizes.shape[0]).astype(np.int64)
    tokens = tokens.reshape(shape)
    load = np.bincount(cell[kept], weights=weight[every[kept]], minlength=sizes.shape[0]).reshape(shape)
    members: list[list[list[int] | np.ndarray]] = [list(row) for row in grid]
    for c in np.unique(cell[excess]).tolist():
        m, d = divmod(c, dp)
        members[m][d] = grid[m][d][kept[starts[c] : starts[c] + sizes[c]]].tolist()
    pending = every[excess]
    pending_cell = cell[excess]
    moving = np.lexsort((pending, -padded[pending]))  # longest first, ties the lower id
    for i, c in zip(pending[moving].tolist(), pending_cell[moving].tolist(), strict=True):
        m, d = divmod(c, dp)
        size = int(padded[i])
        row_room = (counts[m] < limit) & (tokens[m] + size <= capacity)
        if keep_replica:
            row_room[np.arange(dp) != d] = False
        where = _least_loaded(row_room, load[m])
        if where is not None:
            tm, td = m, where
        else:
            room = (counts < limit) & (tokens + size <= capacity)
            if keep_replica:
                room[:, np.arange(dp) != d] = False
            found = _least_loaded(room.reshape(-1), load.reshape(-1))
            if found is None:
                if fixed_rounds is not None:
                    raise ScheduleError(
                        f"num_microbatches={fixed_rounds} cannot hold the step's sequences at most {limit} per "
                        f"microbatch (static_shapes' max_real_sequences) within {capacity} tokens: raise "
                        "num_microbatches or max_sequences"
                    )
                added = round_multiple
                counts = np.vstack([counts, np.zeros((added, dp), np.int64)])
                tokens = np.vstack([tokens, np.zeros((added, dp), np.int64)])
                load = np.vstack([load, np.zeros((added, dp))])
                members.extend([[] for _ in range(dp)] for _ in range(added))
                found = (counts.shape[0] - added) * dp + (d if keep_replica else 0)
            tm, td = divmod(found, dp)
        target = members[tm][td]
        if isinstance(target, np.ndarray):
            target = members[tm][td] = target.tolist()
        target.append(i)
        counts[tm, td] += 1
        tokens[tm, td] += size
        load[tm, td] += float(weight[i])
    return [
        [ids if isinstance(ids, np.ndarray) else np.sort(np.asarray(ids, dtype=np.int64)) for ids in row]
        for row in members
    ]


def _least_loaded(room: np.ndarray, load: np.ndarray) -> int | None:
    """The index of the least ``load`` where ``room`` (ties: the lowest index), or None."""
    candidates = np.flatnonzero(room)
    if not candidates.size:
        return None
    return int(candidates[np.argmin(load[candidates])])


def ladder_for(tokens: np.ndarray, *, buckets: int, unit: int, top: int) -> tuple[int, ...]:
    """At most ``buckets`` token counts, multiples of ``unit``, the largest ``top``, that
    minimise the summed bucket padding ``sum(bucket(t) - t)`` of microbatches holding
    ``tokens`` (each at most ``top``): exact, by a dynamic program over the distinct
    candidate sizes (every optimal ladder's buckets are ``tokens`` rounded up to ``unit``).
    """
    t = np.asarray(tokens, dtype=np.int64)
    candidates, where = np.unique(np.clip(-(-t // unit) * unit, unit, top), return_inverse=True)
    if not candidates.size or candidates[-1] != top:
        candidates = np.append(candidates, top)
    k = candidates.shape[0]
    counts = np.bincount(where, minlength=k).astype(np.float64)
    sums = np.bincount(where, weights=t.astype(np.float64), minlength=k)
    n_prefix = np.concatenate([[0.0], np.cumsum(counts)])  # n_prefix[j + 1]: counts of candidates 0..j
    s_prefix = np.concatenate([[0.0], np.cumsum(sums)])
    size = candidates.astype(np.float64)
    # best[j]: the least padding of every candidate 0..j with the last bucket at candidate j.
    best = size * n_prefix[1:] - s_prefix[1:]
    choices: list[np.ndarray] = []
    for _ in range(1, min(buckets, k)):
        nxt, arg = best.copy(), np.full(k, -1, dtype=np.int64)
        for j in range(1, k):  # the previous bucket at i < j; candidates i+1..j take bucket j
            covered = n_prefix[j + 1] - n_prefix[1 : j + 1]
            total = best[:j] + size[j] * covered - (s_prefix[j + 1] - s_prefix[1 : j + 1])
            i = int(np.argmin(total))
            if total[i] < nxt[j]:
                nxt[j], arg[j] = total[i], i
        choices.append(arg)
        best = nxt
    ladder, j = [int(candidates[-1])], k - 1
    for arg in reversed(choices):
        if arg[j] >= 0:
            j = int(arg[j])
            ladder.append(int(candidates[j]))
    return tuple(sorted(set(ladder)))


@dataclasses.dataclass(frozen=True)
class FixedPlans:
    """Static plans whose predicted step time is evaluated for any ladder without
    re-planning: every microbatch's time without buckets (``base``, ``[M, dp]`` per plan),
    its padded tokens (a filler's for an empty one) and the per-token cost of its bucket's
    extra tokens (``rate``)."""

    base: list[np.ndarray]
    grid_tokens: list[np.ndarray]
    rate: float
    sync: str

    @classmethod
    def of(cls, plans: Sequence[Schedule], family: GroupCost, sync: str) -> FixedPlans:
        from seqpack.schedulers.step_time import group_times

        base, tokens = [], []
        rate = 0.0
        for plan in plans:
            times = np.where(plan.group_counts > 0, group_times(plan, family), family.compute.constant)
            held = np.where(plan.group_counts > 0, plan.group_tokens(padded=True), plan.pad_multiple)
            where = (plan.group_round, plan.leading_replica())
            grid_time = np.zeros((plan.num_microbatches, plan.dp_size))
            grid_tokens = np.zeros((plan.num_microbatches, plan.dp_size), dtype=np.int64)
            np.add.at(grid_time, where, times)
            np.add.at(grid_tokens, where, held)
            base.append(grid_time)
            tokens.append(grid_tokens)
            rate = family.at(plan.cp_size).linear
        return cls(base, tokens, rate, sync)

    @property
    def tokens(self) -> np.ndarray:
        """Every microbatch's padded tokens, all plans."""
        return np.concatenate([t.reshape(-1) for t in self.grid_tokens]) if self.grid_tokens else np.zeros(0, np.int64)

    def mean_time(self, ladder: tuple[int, ...]) -> float:
        """The plans' mean predicted step time with ``ladder``'s bucket padding."""
        buckets = np.asarray(ladder, dtype=np.int64)
        total = 0.0
        for base, tokens in zip(self.base, self.grid_tokens, strict=True):
            index = np.minimum(np.searchsorted(buckets, tokens), buckets.shape[0] - 1)
            times = base + self.rate * (buckets[index] - tokens)
            if times.size:
                total += float(times.max(axis=1).sum() if self.sync == Sync.LOCKSTEP else times.sum(axis=0).max())
        return total / max(len(self.base), 1)

    def descend(self, starts: Sequence[tuple[int, ...]], sweeps: int = 3, candidates: int = 128) -> tuple[int, ...]:
        """The best ladder found by moving one bucket at a time (the largest stays) to the
        size, among the plans' microbatch sizes (``candidates`` quantiles at most), that
        lowers :meth:`mean_time` most, from each of ``starts``."""
        top = starts[0][-1]
        sizes = np.unique(self.tokens)
        sizes = sizes[(sizes > 0) & (sizes < top)]
        if sizes.shape[0] > candidates:
            sizes = np.unique(np.quantile(sizes, np.linspace(0, 1, candidates), method="higher").astype(np.int64))
        best, best_time = starts[0], self.mean_time(starts[0])
        for start in starts:
            ladder, now = list(start), self.mean_time(start)
            for _ in range(sweeps):
                moved = False
                for i in range(len(ladder) - 1):  # sorted: the largest (the capacity) stays
                    rest = ladder[:i] + ladder[i + 1 :]
                    chosen, chosen_time = None, now
                    for size in sizes.tolist():
                        if size not in rest:
                            t = self.mean_time(tuple(sorted([*rest, size])))
                            if t < chosen_time:
                                chosen, chosen_time = size, t
                    if chosen is not None:
                        ladder, now, moved = sorted([*rest, chosen]), chosen_time, True
                if not moved:
                    break
            if now < best_time:
                best, best_time = tuple(ladder), now
        return best


def even_ladder(buckets: int, unit: int, top: int) -> tuple[int, ...]:
    """``buckets`` evenly spaced sizes up to ``top``, each rounded up to a multiple of
    ``unit`` (fewer where they coincide)."""
    step = top / buckets
    return tuple(sorted({min(top, -(-round(step * k) // unit) * unit) for k in range(1, buckets + 1)} - {0}))


def static_shapes_by_cost(
    steps: Sequence[Sequence[int] | np.ndarray],
    *,
    buckets: int,
    max_sequences: int,
    max_tokens_per_rank: int,
    dp_size: int,
    cp_size: int = 1,
    pad_multiple: int = 1,
    cost: CostModel | GroupCost | None = None,
    scheduler: str | Scheduler = "balanced",
    sync: str = "lockstep",
    tail_padding: TailPadding | str = TailPadding.APPEND_DUMMY_SEQ,
    refits: int = 2,
) -> StaticShapes:
    """A :class:`~seqpack.thd.StaticShapes` of at most ``buckets`` token buckets chosen for
    the least predicted step time of the plans of ``steps``.

    Every step of ``steps`` (e.g. the lengths of the data's first steps, or mock ones)
    is planned by ``scheduler`` with one bucket, the capacity rounded down to
    ``pad_multiple``. On those plans the ladder (multiples of ``pad_multiple``, the largest
    that capacity) with the least summed bucket padding is found exactly (a dynamic program
    over the microbatches' padded token counts, :func:`ladder_for`), then improved one bucket
    at a time for the plans' predicted step time (a microbatch just past a bucket edge can
    set its round's or replica's time; :class:`FixedPlans`). The steps are re-planned with
    that ladder and a ladder is fitted to the new plans, ``refits`` times at most; evenly
    spaced buckets are tried too (a ladder fitted to a few plans' microbatches may fit
    other steps worse). The ladder kept (one bucket among them) is the one whose plans
    predict the least mean step time under ``sync``
    (:func:`~seqpack.schedulers.predicted_step_time` with ``static_shapes``); the log
    (``seqpack.schedulers.static_limits``, INFO) reports each. Give it many steps of the
    real data: the ladder fits the next steps as well as their microbatches resemble the
    sample's (docs/thd.md, "What buckets cost the plans").

    Args:
        steps: One int array of real lengths per step (global order, as ``schedule``).
        buckets: Most buckets (fewer when fewer pay off).
        max_sequences, tail_padding: As :class:`~seqpack.thd.StaticShapes`'.
        max_tokens_per_rank, dp_size, cp_size, cost, sync: As
            :meth:`Scheduler.schedule <seqpack.schedulers.Scheduler.schedule>` (the
            training run's).
        pad_multiple: The packer's (``2 * cp_size`` and more under CP:
            :func:`~seqpack.thd.pad_multiple_for`): every bucket is a multiple of it.
        scheduler: The scheduler (or its name) that plans the steps.
        refits: Re-plans after the first ladder (0: the first ladder is kept).

    Raises:
        ConfigError: ``steps`` empty or not a list, ``buckets`` below 1, a capacity
            below ``pad_multiple``, or what the scheduler refuses.
    """
    from seqpack.schedulers import get_scheduler, predicted_step_time  # the package imports this module

    buckets = check_positive_int("buckets", buckets, maximum=INT32_MAX)
    refits = check_int("refits", refits, minimum=0, maximum=16)
    mode = check_choice("sync", sync, Sync)
    planner = get_scheduler(scheduler)
    pad_multiple = check_positive_int("pad_multiple", pad_multiple)
    capacity = check_positive_int("max_tokens_per_rank", max_tokens_per_rank) * check_positive_int("cp_size", cp_size)
    top = min(capacity, INT32_MAX) // pad_multiple * pad_multiple  # a bucket is an int32 token count
    if top < 1:
        raise ConfigError(
            f"max_tokens_per_rank={max_tokens_per_rank} x cp_size={cp_size} = {capacity} tokens holds no multiple of "
            f"pad_multiple={pad_multiple}: no token bucket fits the capacity"
        )
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not len(steps):
        raise ConfigError(
            "steps must be a non-empty list of the steps' lengths (one int array per step, e.g. the first steps "
            f"of the data), got {steps!r:.80}"
        )
    step_lengths = [as_lengths(lengths) for lengths in steps]
    model = planner.resolve_cost(cost)
    family = as_group_cost(model or default_cost_model(), cp_size)
    limits: dict[str, Any] = dict(
        dp_size=dp_size, cp_size=cp_size, max_tokens_per_rank=max_tokens_per_rank, pad_multiple=pad_multiple
    )

    def make(ladder: tuple[int, ...]) -> StaticShapes:
        return StaticShapes(token_buckets=ladder, max_sequences=max_sequences, tail_padding=TailPadding(tail_padding))

    def evaluate(shapes: StaticShapes) -> tuple[float, FixedPlans]:
        times, plans = [], []
        for lengths in step_lengths:
            plan = planner.schedule(lengths, cost=cost, sync=mode, static_shapes=shapes, **limits)
            times.append(predicted_step_time(plan, family, sync=mode, static_shapes=shapes))
            plans.append(plan)
        return float(np.mean(times)), FixedPlans.of(plans, family, mode)

    best = make((top,))
    best_time, fixed = evaluate(best)
    logger.info("by_cost: one bucket %d: mean predicted step %.6g", top, best_time)
    tried = {best}
    starts = [even_ladder(buckets, pad_multiple, top)]
    for _ in range(refits + 1):
        # On these plans: the least summed padding (exact), then the least predicted step
        # time (a microbatch past a bucket edge can set its round's or replica's time).
        ladder = fixed.descend([ladder_for(fixed.tokens, buckets=buckets, unit=pad_multiple, top=top), *starts])
        starts = []
        shapes = make(ladder)
        if shapes in tried:
            break
        tried.add(shapes)
        mean, fixed = evaluate(shapes)  # re-planned with the ladder: the next ladder fits these plans
        logger.info("by_cost: buckets %s: mean predicted step %.6g", shapes.token_buckets, mean)
        if mean < best_time:
            best, best_time = shapes, mean
    # Evenly spaced buckets too: a ladder fitted to a few plans' microbatches may not fit others.
    even = make(even_ladder(buckets, pad_multiple, top))
    if even not in tried:
        mean, _ = evaluate(even)
        logger.info("by_cost: even buckets %s: mean predicted step %.6g", even.token_buckets, mean)
        if mean < best_time:
            best, best_time = even, mean
    return best


def trim_to_buckets(
    rounds: Sequence[Sequence[np.ndarray]],
    padded: np.ndarray,
    weight: np.ndarray,
    *,
    price: BucketPrice,
    limit: int,
    capacity: int,
    constant: float,
    sync: str | None,
) -> list[list[np.ndarray]]:
    """``rounds`` with microbatches just past a bucket edge brought below it where that
    predicts a shorter step.

    A microbatch of ``t`` tokens in bucket ``b_k`` pays ``b_k - t`` tokens of padding; one
    sequence of at least ``t - b_(k-1)`` tokens (the shortest such, of 3 tried) moved to
    another microbatch of the same round (with a free slot, within ``capacity``; its own
    bucket may grow) drops it to ``b_(k-1)``. A move is made when the step objective
    (:func:`step_objective` of ``sync``: microbatch costs ``weight`` summed, ``constant``,
    and the bucket padding's ``price``) drops, to the target that lowers it most; under
    ``sync="replica"`` the target may also be another round's microbatch of the same replica
    (its total then changes only by the buckets' padding). Only
    microbatches that set the step's time are tried (a round's slowest under lockstep, the
    slowest replica's under replica), until none moves. ``padded`` and ``weight`` are
    indexed by global id; cells no move touched come back as they were.
    """
    grid = [[np.asarray(ids, dtype=np.int64) for ids in row] for row in rounds]
    if not grid or not grid[0]:
        return grid
    shape = (len(grid), len(grid[0]))
    flat = [ids for row in grid for ids in row]
    sizes = np.array([ids.shape[0] for ids in flat], dtype=np.int64)
    every = np.concatenate(flat)
    cell = np.repeat(np.arange(sizes.shape[0]), sizes)
    count = sizes.shape[0]
    state = _TrimState(
        tokens=np.bincount(cell, weights=padded[every], minlength=count).astype(np.int64).reshape(shape),
        load=np.bincount(cell, weights=weight[every], minlength=count).reshape(shape) + constant,
        counts=sizes.reshape(shape).copy(),
        price=price,
        lockstep=sync in (None, Sync.LOCKSTEP),
        replica=sync in (None, Sync.REPLICA),
    )
    members: dict[tuple[int, int], list[int]] = {}  # the cells a move touched, as lists

    def ids_of(m: int, d: int) -> list[int]:
        if (m, d) not in members:
            members[m, d] = grid[m][d].tolist()
        return members[m, d]

    def trim(m: int, d: int) -> bool:
        moves = [state.best_trim(m, d, ids_of(m, d), padded, weight, limit, capacity)]
        if not state.lockstep:  # replica alone: a replica's rounds may trade sequences too
            moves.append(state.best_shift(m, d, ids_of(m, d), padded, weight, limit, capacity))
        found = [move for move in moves if move is not None]
        if not found:
            return False
        i, (tm, td), _ = max(found, key=lambda move: move[2])
        state.move((m, d), (tm, td), int(padded[i]), float(weight[i]))
        ids_of(m, d).remove(i)
        ids_of(tm, td).append(i)
        return True

    # Only a round's slowest microbatch can shorten a lockstep step, only the slowest
    # replica's a replica step: those are tried, until none moves.
    rounds_count = state.tokens.shape[0]
    if state.lockstep:
        for m in range(rounds_count):
            for _ in range(8):
                if not trim(m, int(np.argmax(state.times[m]))):
                    break
    if state.replica:  # each move lowers the largest total; 8 a round at most (plan time)
        for _ in range(8 * rounds_count):
            d = int(np.argmax(state.column))
            if not any(trim(m, d) for m in np.argsort(-state.times[:, d]).tolist()):
                break
    for (m, d), ids in members.items():
        grid[m][d] = np.sort(np.asarray(ids, dtype=np.int64))
    return grid


@dataclasses.dataclass
class _TrimState:
    """The grid :func:`trim_to_buckets` works on: tokens, costs (constant included) and
    counts of every microbatch ``[M, dp]``, their times with the bucket padding, and each
    replica's total."""

    tokens: np.ndarray
    load: np.ndarray
    counts: np.ndarray
    price: BucketPrice
    lockstep: bool
    replica: bool

    def __post_init__(self) -> None:
        self.times = self.load + self.price.extra(self.tokens)
        self.column = self.times.sum(axis=0)

    def move(self, source: tuple[int, int], target: tuple[int, int], size: int, cost: float) -> None:
        for cell, sign in ((source, -1), (target, 1)):
            self.tokens[cell] += sign * size
            self.load[cell] += sign * cost
            self.counts[cell] += sign
        for m in {source[0], target[0]}:
            row = self.load[m] + self.price.extra(self.tokens[m])
            self.column += row - self.times[m]
            self.times[m] = row

    def _candidates(self, m: int, d: int, ids: list[int], padded: np.ndarray) -> list[int]:
        """The 3 shortest ids of microbatch ``(m, d)`` whose leaving drops it a bucket."""
        t, edges = int(self.tokens[m, d]), self.price.buckets
        k = int(np.searchsorted(edges, t))
        if k == 0 or t == 0:
            return []
        need = t - int(edges[k - 1])
        return sorted((i for i in ids if int(padded[i]) >= need), key=lambda i: (int(padded[i]), i))[:3]

    def best_shift(
        self, m: int, d: int, ids: list[int], padded: np.ndarray, weight: np.ndarray, limit: int, capacity: int
    ) -> tuple[int, tuple[int, int], float] | None:
        """``(id, target cell, gain)`` of the move to another round of replica ``d`` that
        lowers the largest replica total most (the replica objective), or None."""
        times, tokens = self.times[:, d], self.tokens[:, d]
        largest = min(capacity, int(self.price.buckets[-1]))
        others = float(_largest_but(self.column)[d])
        best, best_gain = None, 1e-9 * float(self.column.max())
        for i in self._candidates(m, d, ids, padded):
            size, cost = int(padded[i]), float(weight[i])
            after = tokens + size
            fits = (after <= largest) & (self.counts[:, d] < limit)
            fits[m] = False
            if not fits.any():
                continue
            source = self.load[m, d] - cost + float(self.price.extra(np.array([tokens[m] - size]))[0])
            total = self.column[d] + (source - times[m]) + (self.load[:, d] + cost + self.price.extra(after) - times)
            gain = float(self.column.max()) - np.maximum(others, total)
            gain[~fits] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] > best_gain:
                best, best_gain = (i, (j, d), float(gain[j])), float(gain[j])
        return best

    def best_trim(
        self, m: int, d: int, ids: list[int], padded: np.ndarray, weight: np.ndarray, limit: int, capacity: int
    ) -> tuple[int, tuple[int, int], float] | None:
        """``(id, target cell, gain)`` of the move to another replica of round ``m`` that
        lowers the objective most, or None."""
        t = int(self.tokens[m, d])
        row, tokens = self.times[m], self.tokens[m]
        largest = min(capacity, int(self.price.buckets[-1]))
        best, best_gain = None, 1e-9 * float(row.max())
        for i in self._candidates(m, d, ids, padded):
            size, cost = int(padded[i]), float(weight[i])
            after = tokens + size
            fits = (after <= largest) & (self.counts[m] < limit)
            fits[d] = False
            if not fits.any():
                continue
            new_row = row.copy()
            new_row[d] = self.load[m, d] - cost + float(self.price.extra(np.array([t - size]))[0])
            target = self.load[m] + cost + self.price.extra(after)  # [dp]: each replica as the target
            gain = np.zeros(row.shape[0])
            if self.lockstep:  # the round's new maximum with each target: the largest of the others
                gain += float(row.max()) - np.maximum(_largest_but(new_row), target)
            if self.replica:  # the largest replica total with each target
                column = self.column.copy()
                column[d] += new_row[d] - row[d]
                gain += float(self.column.max()) - np.maximum(_largest_but(column), column + target - row)
            gain[~fits] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] > best_gain:
                best, best_gain = (i, (m, j), float(gain[j])), float(gain[j])
        return best


def _largest_but(values: np.ndarray) -> np.ndarray:
    """For every index, the largest of the other values (-inf alone)."""
    if values.shape[0] == 1:
        return np.full(1, -np.inf)
    first = int(np.argmax(values))
    rest = np.delete(values, first)
    out = np.full(values.shape[0], float(values[first]))
    out[first] = float(rest.max())
    return out
