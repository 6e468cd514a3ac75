"""The candidates of :mod:`~seqpack.schedulers.dynamic_cp.planner`: the step in planning
order (``Problem``), a candidate's bins (microbatches of one group each, ``Bins``), its
builders (lockstep :func:`build`, :func:`build_replica`, static CP) and its exact
:func:`score` (docs/dynamic_cp.md, "The planner")."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from seqpack.cost import CostModel
from seqpack.options import Sync
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.scheduler import BalancedScheduler
from seqpack.thd import group_pad_multiple, group_padded_lengths
from seqpack.thd.padding import ranges

_FIELDS = ("size", "round", "room", "load", "floor", "tokens", "s", "ss")  # a bin's, in Bins


@dataclasses.dataclass(frozen=True)
class Problem:
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

    @property
    def pow2_sizes(self) -> np.ndarray:
        """The allowed sizes that are powers of two, and ``num_ranks``."""
        return self.sizes[((self.sizes & (self.sizes - 1)) == 0) | (self.sizes == self.num_ranks)]

    @property
    def fit(self) -> tuple[np.ndarray, int, int, int]:
        """``choose_sizes`` and ``widen``'s arguments after the sizes."""
        return self.coef, self.ranks_per_node, self.capacity, self.pad_multiple


@dataclasses.dataclass
class Bins:
    """A candidate: its bins' ``_FIELDS`` and each sequence's bin (by planning position)."""

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
    def empty(cls, n: int) -> Bins:
        z, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return cls(z, z, z, f, f, z, f, f, np.full(n, -1, dtype=np.int64))

    @property
    def fill_arrays(self) -> tuple[np.ndarray, ...]:
        """The bin arrays ``cp_planner.lpt`` reads and updates, in its order."""
        return tuple(getattr(self, name) for name in _FIELDS if name != "round")

    def extend(self, size: np.ndarray | int, round_: np.ndarray, **fields: np.ndarray | float) -> None:
        """Append one bin per entry of ``round_``; a field a scalar for every new bin, 0 absent."""
        fields.update(size=size, round=round_)
        for name in _FIELDS:
            old = getattr(self, name)
            new = np.broadcast_to(np.asarray(fields.get(name, 0), dtype=old.dtype), round_.shape)
            setattr(self, name, np.concatenate([old, new]))


def score(p: Problem, bins: Bins) -> Bins:
    """Lay the candidate out and order its rounds heaviest first (unless the builder fixed
    both), then score it exactly."""
    kernels, nb = _kernels.cp_planner, bins.size.shape[0]
    if bins.start is None:
        args = (np.lexsort((np.arange(nb), -bins.size, bins.round)), bins.round, bins.size)
        bins.start = (
            kernels.layout_in_nodes(*args, p.ranks_per_node, p.num_ranks) if p.in_nodes else kernels.layout(*args)
        )
    start = bins.start
    count = np.bincount(bins.seq_bin[bins.seq_bin >= 0], minlength=nb)
    times = kernels.bin_times(bins.size, start, count, bins.s, bins.ss, p.coef, p.ranks_per_node)
    rounds = int(bins.round.max()) + 1 if nb else 0
    heights = np.full(rounds, -np.inf)
    np.maximum.at(heights, bins.round, times)
    if bins.run_round is None:  # each round's place in the run order
        bins.run_round = np.argsort(np.lexsort((np.arange(rounds), -heights)))[bins.round]
    if p.sync == Sync.LOCKSTEP:
        bins.score = float(heights.sum())
    else:
        by_run = np.lexsort((start, bins.run_round))
        bins.score = float(kernels.replica_finish(by_run, start, bins.size, times, p.num_ranks))
    return bins


def _fill(p: Problem, bins: Bins, positions: np.ndarray, rounds_done: int, size: int, more: int) -> Bins:
    """``bins`` with the sequences at ``positions`` placed, in them and the fewest new rounds
    (``R // size`` groups of ``size``, the rest single ranks) that hold them, plus ``more``."""
    lengths = p.lengths[positions]
    padded = group_padded_lengths(lengths, size, p.pad_multiple)
    per_round = (p.num_ranks // size) * size * p.capacity
    count = more + max(0, -(-(int(padded.sum()) - int(bins.room.sum())) // per_round))
    ring = (size - 1) * float(p.coef[3])  # the ring's fixed cost, paid once a sequence lands
    while True:
        trial = dataclasses.replace(bins, seq_bin=bins.seq_bin.copy())  # extending copies every bin array
        rounds = np.arange(rounds_done, rounds_done + count, dtype=np.int64)
        trial.extend(size, np.repeat(rounds, p.num_ranks // size), room=size * p.capacity, load=ring)
        if p.num_ranks % size:  # single ranks beside the groups
            trial.extend(1, np.repeat(rounds, p.num_ranks % size), room=p.capacity)
        ok, bin_of = _kernels.cp_planner.lpt(lengths, *trial.fill_arrays, p.coef, p.ranks_per_node, p.pad_multiple)
        if ok:
            trial.seq_bin[positions] = bin_of
            return trial
        count += 1  # the bins could not hold them: one more round always can


def build(p: Problem, height: float, more: int = 0, widen: bool = True) -> Bins:
    """The plan for one height ``H`` (docs/dynamic_cp.md, steps 1-3)."""
    size_of, time_of = _kernels.cp_planner.choose_sizes(p.lengths, p.sizes, *p.fit, height)
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -size_of[grouped], -time_of[grouped]))]
    round_of, used, rounds = _kernels.cp_planner.shelf(size_of[order], p.num_ranks)
    if widen:
        widths, times = size_of[order], time_of[order]
        _kernels.cp_planner.widen(round_of, widths, times, p.lengths[order], used, p.sizes, *p.fit, p.num_ranks)
        size_of[order], time_of[order] = widths, times
    heights = np.zeros(rounds, dtype=np.float64)
    np.maximum.at(heights, round_of, time_of[order])
    bins = Bins.empty(p.lengths.shape[0])
    widths, k = size_of[order], float(p.coef[0])
    padded = group_padded_lengths(p.lengths[order], widths, p.pad_multiple)
    fp = padded.astype(np.float64)
    room, load, floor = widths * p.capacity - padded, time_of[order] - k, heights[round_of] - k
    bins.extend(widths, round_of, room=room, load=load, floor=floor, tokens=padded, s=fp, ss=fp * fp)
    bins.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    free = np.repeat(np.arange(rounds, dtype=np.int64), p.num_ranks - used)
    bins.extend(1, free, room=p.capacity, floor=heights[free] - k)
    return _fill(p, bins, np.flatnonzero(size_of == 1), rounds, 1, more)


def static_size(p: Problem, sizes: np.ndarray) -> int:
    """The smallest of ``sizes`` (ascending) that holds the longest sequence."""
    if p.lengths.shape[0] == 0:
        return 1
    fits = group_padded_lengths(p.lengths[:1], sizes, p.pad_multiple) <= sizes * p.capacity
    return int(sizes[np.argmax(fits)])


def build_static(p: Problem) -> Bins:
    """Static CP: every round cut into equal groups sized for the longest sequence."""
    positions = np.arange(p.lengths.shape[0], dtype=np.int64)
    return _fill(p, Bins.empty(positions.shape[0]), positions, 0, static_size(p, p.sizes), 0)


def build_balanced(p: Problem) -> list[Bins]:
    """Static CP as ``balanced`` plans it on the smallest size dividing the ranks that holds the
    longest sequence, of ``sizes`` and of ``pow2_sizes`` (smaller first); none for an empty step."""
    if p.lengths.shape[0] == 0:
        return []
    sizes = {static_size(p, allowed[p.num_ranks % allowed == 0]) for allowed in (p.sizes, p.pow2_sizes)}
    return [bins for c in sorted(sizes) if (bins := _balanced_at(p, c)) is not None]


def _balanced_at(p: Problem, c: int) -> Bins | None:
    """``balanced``'s plan on ``R / c`` replicas of ``c`` ranks under ``CostModel.at(c)``,
    given the ids in order, laid out as it runs; None should it leave a sequence out."""
    by_id = np.argsort(p.ids, kind="stable")  # position (planning order) of every id, ascending
    static = BalancedScheduler().schedule(
        p.lengths[by_id],
        dp_size=p.num_ranks // c,
        cp_size=c,
        max_tokens_per_rank=p.capacity,
        pad_multiple=group_pad_multiple(c, p.pad_multiple),
        cost=CostModel.from_group_coefficients(p.coef, p.ranks_per_node).at(c),
        sync=p.sync,
    )
    if static.assigned.shape[0] != p.lengths.shape[0]:  # not seen (c holds the longest): kept exact
        return None
    padded, group_of = static.padded_assigned().astype(np.float64), static.group_of
    s, ss = (np.bincount(group_of, weights=w, minlength=static.num_groups) for w in (padded, padded * padded))
    bins = Bins.empty(p.lengths.shape[0])
    bins.extend(static.group_size, static.group_round, tokens=s, s=s, ss=ss)
    bins.seq_bin[by_id[static.assigned]] = group_of
    bins.start = static.group_start.copy()
    bins.run_round = static.group_round.copy()
    return bins


def build_replica(p: Problem, height: float, more: int = 0) -> Bins:
    """The replica builder's plan for height ``H`` (docs/dynamic_cp.md, step 4); every rank's
    own microbatches at most one more than their tokens need, plus ``more``."""
    size_of, time_of = _kernels.cp_planner.choose_sizes(p.lengths, p.pow2_sizes, *p.fit, height)
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -time_of[grouped], -size_of[grouped]))]
    start, rounds, load, depth = _kernels.cp_planner.place_blocks(size_of[order], time_of[order], p.num_ranks)
    bins = Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple).astype(np.float64)
    bins.extend(size_of[order], rounds, tokens=padded, s=padded, ss=padded * padded)
    bins.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    shorts = np.flatnonzero(size_of == 1)  # each rank's own microbatches after its groups, ``slots`` at most
    short_padded = group_padded_lengths(p.lengths[shorts], 1, p.pad_multiple)
    slots = max(1, 1 + more - (-int(short_padded.sum()) // (p.num_ranks * p.capacity)))
    while True:
        ok, rank_of, slot_of, count = _kernels.cp_planner.lpt_ranks(
            p.lengths[shorts], load.copy(), p.capacity, p.pad_multiple, p.coef, slots
        )
        if ok:
            break
        slots += 1
    first = np.cumsum(count) - count  # flat index of every rank's first own microbatch
    flat, sp = first[rank_of] + slot_of, short_padded.astype(np.float64)
    s, ss = (np.bincount(flat, weights=w, minlength=int(count.sum())) for w in (sp, sp * sp))
    bins.seq_bin[shorts] = order.shape[0] + flat
    bins.extend(1, ranges(depth, count), tokens=s, s=s, ss=ss)
    busy = depth + count
    gaps = int(busy.max(initial=0)) - busy  # rounds each rank sits idle at the end
    bins.extend(1, ranges(busy, gaps), room=p.capacity)
    ranks = np.arange(p.num_ranks, dtype=np.int64)
    bins.start = np.concatenate([start, np.repeat(ranks, count), np.repeat(ranks, gaps)])
    bins.run_round = bins.round.copy()
    return bins
