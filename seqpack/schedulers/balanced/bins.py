"""Step 2 of the balanced plan: bin rules, tried in turn at a microbatch count ``M``. A rule
takes the step's :class:`~seqpack.schedulers.balanced.rounds.Sequences`, the cost target of
every bin and ``M``, and packs the sequences into ``dp * M`` bins of ``capacity`` tokens:
``(rule, bin of each sequence, cost of each bin)``, or None. The greedy rules are one
kernel (:func:`~seqpack.schedulers._kernels.grid_lpt`) and can miss a packing that exists;
:func:`exact_search` searches exactly, within a bounded amount of work.
"""

from __future__ import annotations

import logging

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.balanced import exact as _exact
from seqpack.schedulers.balanced.rounds import Sequences

logger = logging.getLogger(__name__)

Packed = tuple[int, np.ndarray, np.ndarray]
"""(rule, bin of each sequence, cost of each bin) of a bin rule that packed the sequences."""


def _greedy(seqs: Sequences, targets: np.ndarray, mode: int) -> Packed | None:
    ok, bin_of, bin_load, _ = _kernels.grid_lpt(seqs.fill_order, seqs.padded, seqs.costs, targets, seqs.capacity, mode)
    return (mode, bin_of, bin_load) if ok else None


def cost_targets(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """LPT with targets: each sequence into the bin furthest below its cost target."""
    return _greedy(seqs, targets, _kernels.MODE_COST)


def worst_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Balance tokens: each sequence into the bin with the fewest tokens."""
    return _greedy(seqs, targets, _kernels.MODE_TOKENS)


def first_fit(seqs: Sequences, targets: np.ndarray, num_rounds: int) -> Packed | None:
    """Each sequence into the first bin with room."""
    return _greedy(seqs, targets, _kernels.MODE_FIRST_FIT)


def exact_search(
    seqs: Sequences, targets: np.ndarray, num_rounds: int, *, bin_completion: bool = True
) -> Packed | None:
    """The bounded exact search (:func:`seqpack.schedulers.balanced.exact.pack_bins`, with
    bin completion where there are few sequences per bin)."""
    padded, dp_size, capacity = seqs.padded, seqs.dp_size, seqs.capacity
    status, bin_of = _exact.pack_bins(
        padded, dp_size * num_rounds, capacity, found_only=True, bin_completion=bin_completion
    )
    if status != _exact.FOUND:
        return None
    logger.debug(
        "exact search packed %d sequences of %d tokens into %d x %d microbatches of %d tokens (greedy failed)",
        padded.shape[0],
        int(padded.sum()),
        num_rounds,
        dp_size,
        capacity,
    )
    return _exact.MODE_EXACT, bin_of, np.bincount(bin_of, weights=seqs.costs, minlength=dp_size * num_rounds)
