"""The replica-sync builder for :mod:`~seqpack.schedulers.dynamic_cp.planner`: groups on
laminar aligned blocks, then every rank's own microbatches."""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.dynamic_cp._candidate import Bins, Problem, score
from seqpack.thd import group_padded_lengths

_LOOK = 2  # ranks a sequence alone chooses among: the least busy ones that can hold it


def build_replica(p: Problem, height: float, more: int = 0, widen: bool = True) -> Bins:
    """For replica sync: groups (power-of-2 sizes for height ``H``, as in ``_rounds.build``)
    largest first, each on the least busy aligned block after what the block already runs,
    so the ranks of a group always share their history and never wait for each other; then
    the sequences alone on a rank, longest first, on the rank that ends least busy, in at
    most one more microbatch per rank than their tokens need, plus ``more`` (``widen`` does
    not apply): ranks without groups take more than the average."""
    size_of, time_of = _kernels.cp_planner.choose_sizes(
        p.lengths, p.pow2_sizes, p.coef, p.ranks_per_node, p.capacity, p.pad_multiple, height
    )
    grouped = np.flatnonzero(size_of > 1)
    order = grouped[np.lexsort((grouped, -time_of[grouped], -size_of[grouped]))]
    start, rounds, load, depth = _kernels.cp_planner.place_blocks(size_of[order], time_of[order], p.num_ranks)
    groups = Bins.empty(p.lengths.shape[0])
    padded = group_padded_lengths(p.lengths[order], size_of[order], p.pad_multiple).astype(np.float64)
    groups.extend(size_of[order], rounds, tokens=padded, s=padded, ss=padded * padded)
    groups.seq_bin[order] = np.arange(order.shape[0], dtype=np.int64)
    groups.start = start
    shorts = np.flatnonzero(size_of == 1)
    tokens = int(group_padded_lengths(p.lengths[shorts], 1, p.pad_multiple).sum())
    slots = max(1, 1 + more - (-tokens // (p.num_ranks * p.capacity)))
    return score(p, _replica_fill(p, groups, load, depth, shorts, slots))


def _replica_fill(
    p: Problem, groups: Bins, load: np.ndarray, depth: np.ndarray, shorts: np.ndarray, slots: int
) -> Bins:
    """:func:`_build_replica`'s plan with every rank's own microbatches after its groups
    (``slots`` per rank at most, more when they cannot hold the sequences)."""
    while True:
        ok, rank_of, slot_of, count = _kernels.cp_planner.lpt_ranks(
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
    bins.extend(1, _ranges(depth, count), tokens=s, s=s, ss=np.bincount(flat, weights=sp * sp, minlength=n_mb))
    busy = depth + count
    gaps = int(busy.max(initial=0)) - busy  # rounds each rank sits idle at the end
    bins.extend(1, _ranges(busy, gaps), room=p.capacity)
    ranks = np.arange(p.num_ranks, dtype=np.int64)
    assert groups.start is not None
    bins.start = np.concatenate([groups.start, np.repeat(ranks, count), np.repeat(ranks, gaps)])
    bins.run_round = bins.round.copy()
    return bins


def _ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``first[k], first[k]+1, ..., first[k]+counts[k]-1`` for every k, concatenated."""
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(first, counts) + offsets
