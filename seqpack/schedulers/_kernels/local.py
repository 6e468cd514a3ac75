"""grid_local: LPT that first lets every rank keep what fits into its own share."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._types import BoolArray, FloatArray, IntArray
from seqpack.schedulers._kernels.constants import GRID_LOCAL_SLICES, MODE_COST
from seqpack.schedulers._kernels.heaps import _sift_down
from seqpack.schedulers._kernels.jit import njit
from seqpack.schedulers._kernels.lpt import _grid_lpt_sorted


def grid_local(
    order: IntArray,
    lengths: IntArray,
    values: FloatArray,
    targets: FloatArray,
    home_fill: float,
    token_share: int,
    capacity: int,
    origin: IntArray,
    dp_size: int,
) -> tuple[bool, IntArray, BoolArray]:
    """:func:`grid_lpt` that first lets every rank keep what fits into its own share.

    Bin ``b`` belongs to replica ``b % dp_size`` (round ``b // dp_size``); ``key = load -
    target`` with ``load`` the sum of the bin's ``values`` (costs, or tokens).

    ``order`` (longest first) is cut into :data:`GRID_LOCAL_SLICES` consecutive slices of
    equal count; for each slice in turn:

    1. Home: each item, in order, goes to its own replica's best bin (smallest (key,
       tokens, round)) if that keeps the bin within ``home_fill`` times its target and
       within ``token_share`` tokens (a rank of short, cheap-per-token sequences must leave
       room for the cost its microbatches still lack); else it waits.
    2. The slice's waiting items, in order, go to the best bin anywhere that has room, as
       :func:`grid_lpt` in ``MODE_COST`` does, starting from the current loads.

    Home placements never push a bin over its target and the LPT passes even out the rest,
    so the bins end about as even as LPT leaves them while each rank keeps most of its own.
    Slices keep the LPT passes close to longest first, which tight packings need (one home
    pass over everything leaves no room for the long items that wait). The home pass is
    independent per rank, so it runs rank by rank (cache friendly).

    Requires ``len(targets) == rounds * dp_size`` with ``rounds >= 1`` when there are items,
    and ``0 <= origin < dp_size`` (bounds of :func:`_home_pass`).

    Returns:
        (ok, bin_of[n], home[n]): ``home`` marks items placed by the home pass; ``ok`` is
        False when some waiting item found no bin with room.
    """
    n = order.shape[0]
    n_bins = targets.shape[0]
    rounds = n_bins // max(dp_size, 1)
    origin_placed = origin[order]
    lengths_placed = lengths[order]
    values_placed = values[order]
    share = min(int(token_share), int(capacity))
    load = np.zeros(n_bins, dtype=np.float64)
    tok = np.zeros(n_bins, dtype=np.int64)
    placed = np.full(n, -1, dtype=np.int64)
    home = np.zeros(n, dtype=np.bool_)
    ok = True
    for lo, hi in _slices(n, GRID_LOCAL_SLICES):
        # This slice's positions grouped by rank, in placement order within a rank.
        origin_slice = origin_placed[lo:hi]
        count = hi - lo
        if dp_size * count < 2**62:
            by_rank = lo + np.argsort(origin_slice * count + np.arange(count, dtype=np.int64))
        else:
            by_rank = lo + np.argsort(origin_slice, kind="stable")
        _home_pass(
            by_rank, lengths_placed, values_placed, origin_placed, targets, float(home_fill), share, dp_size, rounds,
            placed, load, tok,
        )  # fmt: skip
        wait = lo + np.flatnonzero(placed[lo:hi] < 0)
        ok, waiting_bin, _, _ = _grid_lpt_sorted(
            lengths_placed[wait], values_placed[wait], targets, capacity, MODE_COST, load, tok
        )
        home[lo:hi] = placed[lo:hi] >= 0
        placed[wait] = waiting_bin
        if not ok:
            break
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    bin_of[order] = placed
    at_home = np.zeros(lengths.shape[0], dtype=np.bool_)
    at_home[order] = home
    return ok, bin_of, at_home


def _slices(n: int, count: int) -> list[tuple[int, int]]:
    """``count`` consecutive (start, end) ranges covering ``0..n`` (empty ones left out)."""
    bounds = [(n * k) // count for k in range(count + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


@njit(cache=True)
def _home_pass(
    by_rank: IntArray,
    lengths: IntArray,
    values: FloatArray,
    origin: IntArray,
    targets: FloatArray,
    fill: float,
    share: int,
    dp: int,
    rounds: int,
    placed: IntArray,
    load: FloatArray,
    tok: IntArray,
) -> None:
    """Step 1 of :func:`grid_local` for the items ``by_rank`` (grouped by rank): sets
    ``placed`` (bin, or -1 to wait) and updates ``load`` and ``tok`` of the bins.

    Bounds: the heap of one replica's rounds (``key``, ``own_tok``, ``heap``) has ``rounds``
    entries and is read at its top only when an item exists, so it needs ``rounds >= 1``
    whenever ``by_rank`` is not empty; bin ``m * dp + d`` is below ``rounds * dp`` (the length
    of ``targets``, ``load``, ``tok``) for ``0 <= origin < dp``.
    """
    n = by_rank.shape[0]
    # One replica at a time: its rounds in a small heap of (key, tokens, round).
    key = np.empty(rounds, dtype=np.float64)
    own_tok = np.zeros(rounds, dtype=np.int64)
    heap = np.empty(rounds, dtype=np.int64)
    k = 0
    while k < n:
        d = origin[by_rank[k]]
        for m in range(rounds):
            b = m * dp + d
            key[m] = load[b] - targets[b]
            own_tok[m] = tok[b]
            heap[m] = m
        for i in range(rounds // 2 - 1, -1, -1):
            _sift_down(heap, rounds, i, key, own_tok)
        while k < n and origin[by_rank[k]] == d:
            j = by_rank[k]
            k += 1
            m = heap[0]
            b = m * dp + d
            if own_tok[m] + lengths[j] <= share and load[b] + values[j] <= fill * targets[b]:
                placed[j] = b
                load[b] += values[j]
                own_tok[m] += lengths[j]
                key[m] = load[b] - targets[b]
                _sift_down(heap, rounds, 0, key, own_tok)
        for m in range(rounds):
            tok[m * dp + d] = own_tok[m]
