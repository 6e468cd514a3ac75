"""``plan_dynamic_cp``: one step's sequences onto CP groups of the DP x CP ranks.

The planner searches one number, the *height* ``H``: the longest a sequence may run alone.
For a given ``H`` (:func:`_build`):

1. **Sizes.** Every sequence gets the smallest allowed group size that holds it and runs it
   within ``H`` (the fastest size that holds it when none does): long sequences spread over
   as many ranks as they need, and more when that shortens them to ``H``; short ones stay
   on one rank unless even they exceed ``H`` (Megatron dev's dynamic-CP idea).
2. **Group rounds.** Sequences on more than one rank become groups, placed tallest first
   into the first round with enough free ranks (first-fit decreasing height); a round's
   height is its tallest group's time.
3. **Fill.** Sequences on one rank go, longest first, into the bin furthest below its
   *floor* among those with room: the free ranks of the group rounds (floor: the round's
   height, so filling them up to it is free), the room left in the groups themselves, and
   as few new rounds of single ranks as the tokens need (floor 0; one more when the bins
   cannot hold them).

Each plan is then laid out (every round's groups left to right, largest first, which puts
powers of two on aligned blocks) and scored exactly under the sync
(:func:`~seqpack.schedulers.dynamic_cp.cost.predicted_step_time`). ``H`` is tried on a grid
of the times the longest sequences take at each allowed size, refined around the best, and
with one or two more rounds at the best; a static-CP plan (every round cut into equal
groups sized for the longest sequence) is also scored, so the result is never worse than it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import MAX_TOKENS, OnOversize, Sync
from seqpack.schedulers.dynamic_cp import _kernels
from seqpack.schedulers.dynamic_cp.cost import GroupCost
from seqpack.schedulers.dynamic_cp.padding import GroupSizes, allowed_group_sizes, group_padded_lengths
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.validation import check_choice, check_positive_int

__all__ = ["plan_dynamic_cp"]

_COARSE = 24  # heights tried on the first pass of the search
_FINE = 12  # heights tried between the best coarse height's neighbours
_TOP = 64  # the longest sequences whose times make the grid (all that need a group too)
_LOOK = 2  # ranks a sequence alone chooses among (replica sync): the least busy ones


@dataclasses.dataclass(frozen=True)
class _Problem:
    """One step, in planning order (longest first, ties by id)."""

    ids: np.ndarray
    lengths: np.ndarray
    sizes: np.ndarray
    coef: np.ndarray
    ranks_per_node: int
    num_ranks: int
    capacity: int
    pad_multiple: int
    sync: Sync
    in_nodes: bool  # lay groups smaller than a node inside one (any size); else plainly (aligned powers of 2)


@dataclasses.dataclass
class _Bins:
    """A candidate plan: its bins (microbatches of one group each) and where each sequence
    (by planning position) went."""

    size: np.ndarray
    round: np.ndarray
    room: np.ndarray
    load: np.ndarray
    floor: np.ndarray
    tokens: np.ndarray
    s: np.ndarray
    ss: np.ndarray
    seq_bin: np.ndarray
    score: float = math.inf
    start: np.ndarray | None = None
    run_round: np.ndarray | None = None

    @classmethod
    def empty(cls, n: int) -> _Bins:
        z, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return cls(z, z, z, f, f, z, f, f, np.full(n, -1, dtype=np.int64))

    def extend(
        self,
        size: np.ndarray,
        round_: np.ndarray,
        room: np.ndarray,
        load: np.ndarray,
        floor: np.ndarray,
        tokens: np.ndarray,
        s: np.ndarray,
        ss: np.ndarray,
    ) -> None:
        """Append bins (arrays of one entry per new bin)."""
        for name, value in zip(
            ("size", "round", "room", "load", "floor", "tokens", "s", "ss"),
            (size, round_, room, load, floor, tokens, s, ss),
            strict=True,
        ):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.asarray(value, dtype=old.dtype)]))


def _singles(p: _Problem, rounds: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, ...]:
    """Bin arrays of empty one-rank bins in ``rounds`` with ``floor``."""
    n = rounds.shape[0]
    zeros = np.zeros(n, dtype=np.float64)
    return (
        np.ones(n, dtype=np.int64),
        rounds,
        np.full(n, p.capacity, dtype=np.int64),
        zeros,
        floor,
        np.zeros(n, dtype=np.int64),
        zeros,
        zeros,
    )


def _new_rounds(p: _Problem, bins: _Bins, first: int, count: int, size: int) -> None:
    """Append ``count`` rounds (numbered from ``first``) of ``R // size`` empty groups of
    ``size`` ranks, the rest single ranks; floor 0."""
    rounds = np.arange(first, first + count, dtype=np.int64)
    if size > 1:
        g = np.repeat(rounds, p.num_ranks // size)
        n = g.shape[0]
        ring = np.full(n, (size - 1) * float(p.coef[3]))  # the ring's fixed cost, paid once a sequence lands
        bins.extend(
            np.full(n, size),
            g,
            np.full(n, size * p.capacity),
            ring,
            np.zeros(n),
            np.zeros(n, dtype=np.int64),
            np.zeros(n),
            np.zeros(n),
        )
    singles = np.repeat(rounds, p.num_ranks % size if size > 1 else p.num_ranks)
    bins.extend(*_singles(p, singles, np.zeros(singles.shape[0])))


def _fill(p: _Problem, bins: _Bins, positions: np.ndarray, rounds_done: int, size: int, more: int) -> _Bins:
    """Place the sequences at ``positions`` (planning order) into ``bins`` and the fewest new
    rounds (of groups of ``size``) that hold them, plus ``more``."""
    padded = group_padded_lengths(p.lengths[positions], size, p.pad_multiple)
    per_round = (p.num_ranks // size) * size * p.capacity
    count = more + max(0, -(-(int(padded.sum()) - int(bins.room.sum())) // per_round))
    while True:
        trial = dataclasses.replace(bins, seq_bin=bins.seq_bin.copy())
        _new_rounds(p, trial, rounds_done, count, size)  # extending copies every bin array
        ok, bin_of = _kernels.lpt(
            p.lengths[positions],
            trial.size,
            trial.room,
            trial.load,
            trial.floor,
            trial.tokens,
            trial.s,
            trial.ss,
            p.coef,
            p.ranks_per_node,
            p.pad_multiple,
        )
        if ok:
            trial.seq_bin[positions] = bin_of
            return trial
        count += 1  # the bins could not hold them: one more round always can


def _build(p: _Problem, height: float, more: int = 0, widen: bool = True) -> _Bins:
    """The plan for one height ``H`` (module docstring, steps 1-3)."""
    size_of, time_of = _kernels.choose_sizes(
        p.lengths, p.sizes, p.coef, p.ranks_per_node, p.capacity, p.pad_multiple, height
    )
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -size_of[grouped], -time_of[grouped]))]
    round_of, used, rounds = _kernels.shelf(size_of[order], p.num_ranks)
    if widen:
        lengths = p.lengths[order]
        widths, times = size_of[order], time_of[order]
        _kernels.widen(
            round_of,
            widths,
            times,
            lengths,
            used,
            p.sizes,
            p.coef,
            p.ranks_per_node,
            p.capacity,
            p.pad_multiple,
            p.num_ranks,
        )
        size_of[order], time_of[order] = widths, times
    heights = np.zeros(rounds, dtype=np.float64)
    np.maximum.at(heights, round_of, time_of[order])
    bins = _Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple)
    fp = padded.astype(np.float64)
    k = float(p.coef[0])
    bins.extend(
        size_of[order],
        round_of,
        size_of[order] * p.capacity - padded,
        time_of[order] - k,
        heights[round_of] - k,
        padded,
        fp,
        fp * fp,
    )
    bins.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    free = np.repeat(np.arange(rounds, dtype=np.int64), p.num_ranks - used)
    bins.extend(*_singles(p, free, heights[free] - k))
    return _fill(p, bins, np.flatnonzero(size_of == 1), rounds, 1, more)


def _build_replica(p: _Problem, height: float, more: int = 0, widen: bool = True) -> _Bins:
    """For replica sync: groups (power-of-2 sizes for height ``H``, as in :func:`_build`)
    largest first, each on the least busy aligned block after what the block already runs,
    so the ranks of a group always share their history and never wait for each other; then
    the sequences alone on a rank, longest first, on the rank that ends least busy, in at
    most one more microbatch per rank than their tokens need, plus ``more`` (``widen`` does
    not apply): ranks without groups take more than the average."""
    sizes = p.sizes[((p.sizes & (p.sizes - 1)) == 0) | (p.sizes == p.num_ranks)]
    size_of, time_of = _kernels.choose_sizes(
        p.lengths, sizes, p.coef, p.ranks_per_node, p.capacity, p.pad_multiple, height
    )
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -time_of[grouped], -size_of[grouped]))]
    start, rounds, load, depth = _kernels.place_blocks(size_of[order], time_of[order], p.num_ranks)
    groups = _Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple).astype(np.float64)
    none = np.zeros(order.shape[0])
    groups.extend(
        size_of[order], rounds, none.astype(np.int64), none, none, padded.astype(np.int64), padded, padded * padded
    )
    groups.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    groups.start = start
    shorts = np.flatnonzero(size_of == 1)
    tokens = int(group_padded_lengths(p.lengths[shorts], 1, p.pad_multiple).sum())
    slots = max(1, 1 + more - (-tokens // (p.num_ranks * p.capacity)))
    return _score(p, _replica_fill(p, groups, load, depth, shorts, slots))


def _replica_fill(
    p: _Problem, groups: _Bins, load: np.ndarray, depth: np.ndarray, shorts: np.ndarray, slots: int
) -> _Bins:
    """:func:`_build_replica`'s plan with every rank's own microbatches after its groups
    (``slots`` per rank at most, more when they cannot hold the sequences)."""
    while True:
        ok, rank_of, slot_of, count = _kernels.lpt_ranks(
            p.lengths[shorts], load.copy(), p.capacity, p.pad_multiple, p.coef, slots, _LOOK
        )
        if ok:
            break
        slots += 1
    bins = dataclasses.replace(groups, seq_bin=groups.seq_bin.copy())
    first = np.cumsum(count) - count  # flat index of every rank's first own microbatch
    flat = first[rank_of] + slot_of
    sp = group_padded_lengths(p.lengths[shorts], 1, p.pad_multiple).astype(np.float64)
    n_mb = int(count.sum())
    s = np.bincount(flat, weights=sp, minlength=n_mb)
    bins.seq_bin[shorts] = groups.size.shape[0] + flat
    bins.extend(
        np.ones(n_mb, dtype=np.int64),
        _ranges(depth, count),
        np.zeros(n_mb, dtype=np.int64),
        np.zeros(n_mb),
        np.zeros(n_mb),
        s.astype(np.int64),
        s,
        np.bincount(flat, weights=sp * sp, minlength=n_mb),
    )
    busy = depth + count
    gaps = int(busy.max(initial=0)) - busy  # rounds each rank sits idle at the end
    bins.extend(*_singles(p, _ranges(busy, gaps), np.zeros(int(gaps.sum()))))
    ranks = np.arange(p.num_ranks, dtype=np.int64)
    assert groups.start is not None
    bins.start = np.concatenate([groups.start, np.repeat(ranks, count), np.repeat(ranks, gaps)])
    bins.run_round = bins.round.copy()
    return bins


def _ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``first[k], first[k]+1, ..., first[k]+counts[k]-1`` for every k, concatenated."""
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(first, counts) + offsets


def static_size(p: _Problem) -> int:
    """The smallest allowed group size that holds the longest sequence."""
    if p.lengths.shape[0] == 0:
        return 1
    fits = group_padded_lengths(p.lengths[:1], p.sizes, p.pad_multiple) <= p.sizes * p.capacity
    return int(p.sizes[np.argmax(fits)])


def _build_static(p: _Problem) -> _Bins:
    """Static CP: every round cut into equal groups sized for the longest sequence."""
    positions = np.arange(p.lengths.shape[0], dtype=np.int64)
    return _fill(p, _Bins.empty(positions.shape[0]), positions, 0, static_size(p), 0)


def _score(p: _Problem, bins: _Bins) -> _Bins:
    """Lay the candidate out and order its rounds heaviest first (unless the builder fixed
    both), then score it exactly."""
    nb = bins.size.shape[0]
    if bins.start is None:
        order = np.lexsort((np.arange(nb), -bins.size, bins.round))
        if p.in_nodes:
            bins.start = _kernels.layout_in_nodes(order, bins.round, bins.size, p.ranks_per_node, p.num_ranks)
        else:
            bins.start = _kernels.layout(order, bins.round, bins.size)
    start = bins.start
    count = np.bincount(bins.seq_bin[bins.seq_bin >= 0], minlength=nb)
    idle = float(p.coef[0]) if p.sync == Sync.LOCKSTEP else 0.0
    times = _kernels.bin_times(bins.size, start, count, bins.s, bins.ss, p.coef, p.ranks_per_node, idle)
    rounds = int(bins.round.max()) + 1 if nb else 0
    heights = np.full(rounds, -np.inf)
    np.maximum.at(heights, bins.round, times)
    if bins.run_round is None:
        run_order = np.lexsort((np.arange(rounds), -heights))
        run_round = np.empty(rounds, dtype=np.int64)
        run_round[run_order] = np.arange(rounds, dtype=np.int64)
        bins.run_round = run_round[bins.round]
    if p.sync == Sync.LOCKSTEP:
        bins.score = float(heights.sum())
    else:
        by_run = np.lexsort((start, bins.run_round))
        bins.score = float(_kernels.replica_finish(by_run, bins.round, start, bins.size, times, p.num_ranks))
    return bins


def _height_grid(p: _Problem) -> np.ndarray:
    """Heights worth trying: the times of the longest sequences alone at every power-of-2
    size (and R) that holds them, ascending."""
    if p.lengths.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    need_group = int(np.count_nonzero(group_padded_lengths(p.lengths, 1, p.pad_multiple) > p.capacity))
    top = p.lengths[: max(_TOP, need_group)]
    sizes = p.sizes[((p.sizes & (p.sizes - 1)) == 0) | (p.sizes == p.num_ranks)]
    out = []
    k, a, b, step, token, inter = (float(v) for v in p.coef)
    for c in sizes.tolist():
        padded = group_padded_lengths(top, c, p.pad_multiple)
        s = padded[padded <= c * p.capacity].astype(np.float64)
        ring = (c - 1) * (step + (inter if c > p.ranks_per_node else token) * s / c) if c > 1 else 0.0
        out.append(k + (a * s + b * s * s) / c + ring)
    return np.unique(np.concatenate(out))


def _search_heights(p: _Problem, replica: bool = False, coarse_n: int = _COARSE, fine_n: int = _FINE) -> _Bins:
    """The best plan over the height grid (coarse, then refined around the best), then
    at the best height without widening and with one or two more rounds; ties keep the
    first found."""
    tried: dict[tuple[float, int, bool], _Bins] = {}

    build = _build_replica if replica else _build

    def attempt(height: float, more: int = 0, widen: bool = True) -> _Bins:
        if (height, more, widen) not in tried:
            tried[(height, more, widen)] = _score(p, build(p, height, more, widen))
        return tried[(height, more, widen)]

    grid = _height_grid(p)
    picks = np.unique(np.linspace(0, grid.shape[0] - 1, min(coarse_n, grid.shape[0])).round().astype(np.int64))
    coarse = [*grid[picks].tolist(), math.inf]
    best_i = min(range(len(coarse)), key=lambda i: (attempt(coarse[i]).score, i))
    lo = int(picks[best_i - 1]) + 1 if best_i > 0 else 0
    hi = int(picks[best_i + 1]) if best_i + 1 < picks.shape[0] else grid.shape[0]
    between = grid[lo:hi]
    spots = np.linspace(0, between.shape[0] - 1, min(fine_n, between.shape[0])).round().astype(np.int64)
    best_h = min([coarse[best_i], *between[np.unique(spots)].tolist()], key=lambda h: attempt(h).score)
    best = attempt(best_h)
    widen = replica or attempt(best_h, widen=False).score >= best.score
    best = attempt(best_h, widen=widen)
    for more in (-1, 1) if replica else (1, 2):
        candidate = attempt(best_h, more, widen)
        if candidate.score < best.score:
            best = candidate
        elif not replica:
            break
    return best


def _search(p: _Problem) -> _Bins:
    """The best of the height search, the same search with power-of-2 sizes only (when any
    size is allowed: every such plan is one too) and static CP."""
    best = _search_heights(p)
    if p.sync == Sync.REPLICA:
        candidate = _search_heights(p, replica=True, coarse_n=_COARSE // 2, fine_n=_FINE // 2)
        best = candidate if candidate.score < best.score else best
    if p.in_nodes:
        pow2 = p.sizes[((p.sizes & (p.sizes - 1)) == 0) | (p.sizes == p.num_ranks)]
        candidate = _search_heights(dataclasses.replace(p, sizes=pow2))
        best = candidate if candidate.score < best.score else best
    static = _score(p, _build_static(p))
    return static if static.score < best.score else best


def _as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``lengths`` as a contiguous int64 array of positive values."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise SampleError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise SeqpackTypeError(f"lengths must be integers, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size and arr.min() < 1:
        i = int(np.argmin(arr))
        raise SampleError(f"sample {i} has length {int(arr[i])}; lengths must be >= 1 (drop empty samples first)")
    return arr


def _apply_oversize(
    lengths: np.ndarray, sizes: np.ndarray, capacity: int, pad_multiple: int, on_oversize: OnOversize
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths to pack with, dropped ids, truncated ids) for sequences longer than the
    largest group holds."""
    multiple = np.where(sizes > 1, 2 * sizes * pad_multiple, pad_multiple)
    holds = (sizes * capacity // multiple) * multiple
    fits = int(holds.max())
    if fits < 1:
        raise ConfigError(f"max_tokens_per_rank={capacity} is smaller than pad_multiple={pad_multiple}: nothing fits")
    over = np.flatnonzero(lengths > fits)
    effective, none = lengths.copy(), np.zeros(0, dtype=np.int64)
    if over.size == 0:
        return effective, none, none
    if on_oversize == OnOversize.ERROR:
        i, ranks = int(over[0]), int(sizes[-1])
        raise ScheduleError(
            f"sample {i} has {int(lengths[i])} tokens, more than one sequence may hold on all {ranks} ranks "
            f"together: {ranks} x max_tokens_per_rank={capacity} = {ranks * capacity} tokens, at most {fits} once "
            f"padded to a multiple of {int(multiple[np.argmax(holds)])}; {over.size} sample(s) are too long. "
            "Raise max_tokens_per_rank or use more ranks, or pass on_oversize='truncate' or 'drop'"
        )
    if on_oversize == OnOversize.DROP:
        effective[over] = 0
        return effective, over.astype(np.int64), none
    effective[over] = fits
    return effective, none, over.astype(np.int64)


def _to_plan(p: _Problem, bins: _Bins, **fields: object) -> DynamicCpSchedule:
    """The scored candidate as a plan: groups by (round run order, first rank), ids in pack
    order (longest first)."""
    assert bins.start is not None and bins.run_round is not None
    nb = bins.size.shape[0]
    g_order = np.lexsort((bins.start, bins.run_round))
    group_of_bin = np.empty(nb, dtype=np.int64)
    group_of_bin[g_order] = np.arange(nb, dtype=np.int64)
    positions = np.flatnonzero(bins.seq_bin >= 0)
    group = group_of_bin[bins.seq_bin[positions]]
    packed = np.lexsort((positions, group))
    return DynamicCpSchedule(
        num_rounds=int(bins.run_round.max()) + 1 if nb else 0,
        group_round=bins.run_round[g_order],
        group_start=bins.start[g_order],
        group_size=bins.size[g_order],
        group_counts=np.bincount(group, minlength=nb).astype(np.int64),
        assigned=p.ids[positions[packed]],
        **fields,  # type: ignore[arg-type]
    )


def plan_dynamic_cp(
    lengths: Sequence[int] | np.ndarray,
    *,
    dp_size: int,
    cp_size: int = 1,
    max_tokens_per_rank: int,
    pad_multiple: int = 1,
    cost: GroupCost | CostModel,
    sync: str = "lockstep",
    group_sizes: str = "pow2",
    on_oversize: str = "error",
) -> DynamicCpSchedule:
    """Plan one step with dynamic context parallelism: per microbatch round, the
    ``dp_size * cp_size`` ranks split into CP groups, each running one packed microbatch.

    Pure and deterministic (same input, same plan, on every rank). Every sequence that fits
    on all ranks together is scheduled; capacity per rank is never exceeded.

    Args:
        lengths: int64 ``[N]`` real lengths in global order.
        dp_size, cp_size: The DP x CP mesh whose ``R = dp_size * cp_size`` ranks are planned.
        max_tokens_per_rank: Padded tokens one rank may hold in one microbatch.
        pad_multiple: Padding of a sequence alone on a rank (groups pad to ``2c`` times it).
        cost: The group cost (a plain CostModel means no CP communication cost).
        sync: ``"lockstep"`` (FSDP) or ``"replica"`` (DDP): the step time minimised.
        group_sizes: ``"pow2"`` (aligned powers of two, and all R) or ``"any"``.
        on_oversize: ``"error"``, ``"truncate"`` or ``"drop"`` for a sequence longer than
            one sequence may hold on all ranks.

    Raises:
        ScheduleError: An oversize sequence under ``on_oversize="error"``.
        ConfigError, SeqpackTypeError, SampleError: Bad arguments or lengths.
    """
    original = _as_lengths(lengths)
    dp_size = check_positive_int("dp_size", dp_size)
    cp_size = check_positive_int("cp_size", cp_size)
    capacity = check_positive_int("max_tokens_per_rank", max_tokens_per_rank)
    pad_multiple = check_positive_int("pad_multiple", pad_multiple)
    mode, policy = check_choice("sync", sync, Sync), check_choice("on_oversize", on_oversize, OnOversize)
    sizes_mode = check_choice("group_sizes", group_sizes, GroupSizes)
    if isinstance(cost, CostModel):
        cost = GroupCost(cost)
    if not isinstance(cost, GroupCost):
        raise SeqpackTypeError(f"cost must be a GroupCost or CostModel, got {type(cost).__name__}")
    ranks = dp_size * cp_size
    if ranks * capacity > MAX_TOKENS:
        raise ConfigError(f"{ranks} ranks x max_tokens_per_rank={capacity} tokens is too large (at most 2**53)")
    sizes = allowed_group_sizes(ranks, sizes_mode)
    effective, dropped, truncated = _apply_oversize(original, sizes, capacity, pad_multiple, policy)
    active = np.flatnonzero(effective > 0)
    active = active[np.lexsort((active, -effective[active]))]
    p = _Problem(
        active,
        effective[active],
        sizes,
        cost.coefficients,
        cost.ranks_per_node,
        ranks,
        capacity,
        pad_multiple,
        mode,
        in_nodes=sizes_mode == GroupSizes.ANY,
    )
    best = _search(p)
    return _to_plan(
        p,
        best,
        lengths=effective,
        original_lengths=original,
        dp_size=dp_size,
        cp_size=cp_size,
        max_tokens_per_rank=capacity,
        pad_multiple=pad_multiple,
        group_sizes=sizes_mode,
        dropped=dropped,
        truncated=truncated,
    )
