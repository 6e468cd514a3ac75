"""The padding rule and the group sizes of dynamic CP (a leaf: imports nothing of this package).

A sequence in a group of ``c > 1`` ranks is padded to a multiple of ``2 * c * pad_multiple``:
DualChunkSwap cuts it into ``2c`` chunks, and each chunk is itself a multiple of
``pad_multiple``, so every rank's shard meets what ``pad_multiple`` asks of a whole sequence
on one rank (TP under sequence parallelism, 16 under FP8). Alone (``c = 1``) it is padded to
``pad_multiple``.
"""

from __future__ import annotations

import numpy as np

from seqpack.options import GroupSizes
from seqpack.validation import check_choice

__all__ = [
    "GroupSizes",
    "allowed_group_sizes",
    "cp_pad_multiple",
    "group_holds",
    "group_padded_lengths",
    "longest_sequence",
]


def cp_pad_multiple(group_size: int, pad_multiple: int) -> int:
    """What a sequence is padded to a multiple of in a group of ``group_size`` ranks:
    ``pad_multiple`` alone, ``2 * group_size * pad_multiple`` in a group (module docstring)."""
    return 2 * group_size * pad_multiple if group_size > 1 else pad_multiple


def group_padded_lengths(lengths: np.ndarray, group_size: int | np.ndarray, pad_multiple: int) -> np.ndarray:
    """Padded length of each sequence in a group of ``group_size`` ranks (int64; sizes
    broadcast against ``lengths``)."""
    size = np.asarray(group_size, dtype=np.int64)
    multiple = np.where(size > 1, 2 * size * pad_multiple, pad_multiple)
    return -(-np.asarray(lengths, dtype=np.int64) // multiple) * multiple


def allowed_group_sizes(num_ranks: int, group_sizes: str) -> np.ndarray:
    """Group sizes a plan over ``num_ranks`` ranks may use, ascending (int64).

    ``"pow2"``: every power of two up to ``num_ranks``, and ``num_ranks`` itself (so one
    sequence may always use every rank); ``"any"``: ``1..num_ranks``.
    """
    mode = check_choice("group_sizes", group_sizes, GroupSizes)
    if mode == GroupSizes.ANY:
        return np.arange(1, num_ranks + 1, dtype=np.int64)
    sizes = [1 << k for k in range(num_ranks.bit_length()) if (1 << k) <= num_ranks]
    if sizes[-1] != num_ranks:
        sizes.append(num_ranks)
    return np.array(sizes, dtype=np.int64)


def group_holds(sizes: np.ndarray, max_tokens_per_rank: int, pad_multiple: int) -> np.ndarray:
    """int64: the longest sequence a group of each size holds alone (``size *
    max_tokens_per_rank`` rounded down to the size's padding multiple)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    multiple = np.where(sizes > 1, 2 * sizes * pad_multiple, pad_multiple)
    return (sizes * max_tokens_per_rank // multiple) * multiple


def longest_sequence(num_ranks: int, group_sizes: str, max_tokens_per_rank: int, pad_multiple: int) -> int:
    """The longest sequence a plan over ``num_ranks`` ranks schedules (what
    ``on_oversize="truncate"`` cuts a longer one to): the most any allowed group holds."""
    return int(group_holds(allowed_group_sizes(num_ranks, group_sizes), max_tokens_per_rank, pad_multiple).max())
