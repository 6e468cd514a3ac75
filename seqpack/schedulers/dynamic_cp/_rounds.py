"""The builders of :mod:`~seqpack.schedulers.dynamic_cp.planner`'s candidates: lockstep
(:func:`build`: rounds of groups, filled longest first), replica sync (:func:`build_replica`:
groups on laminar aligned blocks, then every rank's own microbatches) and static CP."""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.cost import CostModel
from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced.scheduler import BalancedScheduler
from seqpack.schedulers.dynamic_cp._candidate import Bins, Problem
from seqpack.thd import group_pad_multiple, group_padded_lengths
from seqpack.thd.padding import ranges


def _new_rounds(p: Problem, bins: Bins, first: int, count: int, size: int) -> None:
    """Append ``count`` rounds (numbered from ``first``) of ``R // size`` empty groups of
    ``size`` ranks, the rest single ranks; floor 0."""
    rounds = np.arange(first, first + count, dtype=np.int64)
    if size > 1:
        ring = (size - 1) * float(p.coef[3])  # the ring's fixed cost, paid once a sequence lands
        bins.extend(size, np.repeat(rounds, p.num_ranks // size), room=size * p.capacity, load=ring)
    alone = np.repeat(rounds, p.num_ranks % size if size > 1 else p.num_ranks)
    bins.extend(1, alone, room=p.capacity)


def _fill(p: Problem, bins: Bins, positions: np.ndarray, rounds_done: int, size: int, more: int) -> Bins:
    """Place the sequences at ``positions`` (planning order) into ``bins`` and the fewest new
    rounds (of groups of ``size``) that hold them, plus ``more``."""
    padded = group_padded_lengths(p.lengths[positions], size, p.pad_multiple)
    per_round = (p.num_ranks // size) * size * p.capacity
    count = more + max(0, -(-(int(padded.sum()) - int(bins.room.sum())) // per_round))
    while True:
        trial = dataclasses.replace(bins, seq_bin=bins.seq_bin.copy())
        _new_rounds(p, trial, rounds_done, count, size)  # extending copies every bin array
        ok, bin_of = _kernels.cp_planner.lpt(
            p.lengths[positions], *trial.fill_arrays, p.coef, p.ranks_per_node, p.pad_multiple
        )
        if ok:
            trial.seq_bin[positions] = bin_of
            return trial
        count += 1  # the bins could not hold them: one more round always can


def build(p: Problem, height: float, more: int = 0, widen: bool = True) -> Bins:
    """The plan for one height ``H`` (docs/dynamic_cp.md, steps 1-3)."""
    size_of, time_of = _kernels.cp_planner.choose_sizes(
        p.lengths, p.sizes, p.coef, p.ranks_per_node, p.capacity, p.pad_multiple, height
    )
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -size_of[grouped], -time_of[grouped]))]
    round_of, used, rounds = _kernels.cp_planner.shelf(size_of[order], p.num_ranks)
    if widen:
        lengths = p.lengths[order]
        widths, times = size_of[order], time_of[order]
        _kernels.cp_planner.widen(
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
    bins = Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple)
    fp = padded.astype(np.float64)
    k = float(p.coef[0])
    bins.extend(
        size_of[order],
        round_of,
        room=size_of[order] * p.capacity - padded,
        load=time_of[order] - k,
        floor=heights[round_of] - k,
        tokens=padded,
        s=fp,
        ss=fp * fp,
    )
    bins.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    free = np.repeat(np.arange(rounds, dtype=np.int64), p.num_ranks - used)
    bins.extend(1, free, room=p.capacity, floor=heights[free] - k)
    return _fill(p, bins, np.flatnonzero(size_of == 1), rounds, 1, more)


def static_size(p: Problem, sizes: np.ndarray | None = None) -> int:
    """The smallest of ``sizes`` (ascending; default the allowed group sizes) that holds the
    longest sequence."""
    sizes = p.sizes if sizes is None else sizes
    if p.lengths.shape[0] == 0:
        return 1
    fits = group_padded_lengths(p.lengths[:1], sizes, p.pad_multiple) <= sizes * p.capacity
    return int(sizes[np.argmax(fits)])


def build_static(p: Problem) -> Bins:
    """Static CP: every round cut into equal groups sized for the longest sequence."""
    positions = np.arange(p.lengths.shape[0], dtype=np.int64)
    return _fill(p, Bins.empty(positions.shape[0]), positions, 0, static_size(p), 0)


def build_balanced(p: Problem) -> list[Bins]:
    """Static CP as the ``balanced`` scheduler plans it (replica-first under replica sync),
    on the smallest size that divides the ranks and holds the longest sequence among the
    allowed sizes and among the powers of 2 (and R): one candidate per distinct size, the
    smaller first; none for an empty step."""
    if p.lengths.shape[0] == 0:
        return []
    out = []
    for c in sorted({static_size(p, sizes[p.num_ranks % sizes == 0]) for sizes in (p.sizes, p.pow2_sizes)}):
        bins = _balanced_at(p, c)
        if bins is not None:
            out.append(bins)
    return out


def _balanced_at(p: Problem, c: int) -> Bins | None:
    """``R / c`` replicas of ``c`` ranks, each running its own microbatches as ``balanced``
    plans them under the static group's cost (``CostModel.at(c)`` of ``p.coef``), laid out
    as they run. Sequences go to ``balanced`` in id order, as a caller of it would pass them;
    None should it leave one out."""
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
    groups = static.group_size.shape[0]
    positions = by_id[static.assigned]
    group_of = np.repeat(np.arange(groups, dtype=np.int64), static.group_counts)
    seq_padded = group_padded_lengths(p.lengths[positions], c, p.pad_multiple).astype(np.float64)
    s = np.bincount(group_of, weights=seq_padded, minlength=groups)
    ss = np.bincount(group_of, weights=seq_padded * seq_padded, minlength=groups)
    bins = Bins.empty(p.lengths.shape[0])
    bins.extend(static.group_size, static.group_round, tokens=s.astype(np.int64), s=s, ss=ss)
    bins.seq_bin[positions] = group_of
    bins.start = static.group_start.copy()
    bins.run_round = static.group_round.copy()
    return bins


def build_replica(p: Problem, height: float, more: int = 0) -> Bins:
    """For replica sync: groups (power-of-2 sizes for height ``H``, as in ``_rounds.build``)
    largest first, each on the least busy aligned block after what the block already runs,
    so the ranks of a group always share their history and never wait for each other; then
    the sequences alone on a rank, longest first, on the least busy rank that holds them, in at
    most one more microbatch per rank than their tokens need, plus ``more``: ranks without
    groups take more than the average."""
    size_of, time_of = _kernels.cp_planner.choose_sizes(
        p.lengths, p.pow2_sizes, p.coef, p.ranks_per_node, p.capacity, p.pad_multiple, height
    )
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -time_of[grouped], -size_of[grouped]))]
    start, rounds, load, depth = _kernels.cp_planner.place_blocks(size_of[order], time_of[order], p.num_ranks)
    bins = Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple).astype(np.float64)
    bins.extend(size_of[order], rounds, tokens=padded, s=padded, ss=padded * padded)
    bins.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    num_groups = order.shape[0]
    # Every rank's own microbatches after its groups: ``slots`` per rank at most, more when
    # they cannot hold the sequences.
    shorts = np.flatnonzero(size_of == 1)
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
    flat = first[rank_of] + slot_of
    n_mb = int(count.sum())
    sp = short_padded.astype(np.float64)
    s = np.bincount(flat, weights=sp, minlength=n_mb)
    bins.seq_bin[shorts] = num_groups + flat
    bins.extend(1, ranges(depth, count), tokens=s, s=s, ss=np.bincount(flat, weights=sp * sp, minlength=n_mb))
    busy = depth + count
    gaps = int(busy.max(initial=0)) - busy  # rounds each rank sits idle at the end
    bins.extend(1, ranges(busy, gaps), room=p.capacity)
    ranks = np.arange(p.num_ranks, dtype=np.int64)
    bins.start = np.concatenate([start, np.repeat(ranks, count), np.repeat(ranks, gaps)])
    bins.run_round = bins.round.copy()
    return bins
