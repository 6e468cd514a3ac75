"""The replica-sync builder for :mod:`~seqpack.schedulers.dynamic_cp.planner`: groups on
laminar aligned blocks, then every rank's own microbatches."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.dynamic_cp._candidate import Bins, Problem
from seqpack.thd import group_padded_lengths

_LOOK = 2  # ranks a sequence alone chooses among: the least busy ones that can hold it


def build_replica(p: Problem, height: float, more: int = 0) -> Bins:
    """For replica sync: groups (power-of-2 sizes for height ``H``, as in ``_rounds.build``)
    largest first, each on the least busy aligned block after what the block already runs,
    so the ranks of a group always share their history and never wait for each other; then
    the sequences alone on a rank, longest first, on the rank that ends least busy, in at
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
            p.lengths[shorts], load.copy(), p.capacity, p.pad_multiple, p.coef, slots, _LOOK
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
    bins.extend(1, _ranges(depth, count), tokens=s, s=s, ss=np.bincount(flat, weights=sp * sp, minlength=n_mb))
    busy = depth + count
    gaps = int(busy.max(initial=0)) - busy  # rounds each rank sits idle at the end
    bins.extend(1, _ranges(busy, gaps), room=p.capacity)
    ranks = np.arange(p.num_ranks, dtype=np.int64)
    bins.start = np.concatenate([start, np.repeat(ranks, count), np.repeat(ranks, gaps)])
    bins.run_round = bins.round.copy()
    return bins


def _ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``first[k], first[k]+1, ..., first[k]+counts[k]-1`` for every k, concatenated."""
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(first, counts) + offsets
