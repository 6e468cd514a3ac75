"""Single-rank packing of sequence lengths into as few packs of ``max_tokens`` as it finds
(:func:`pack_lengths`); the kernel is :mod:`seqpack.packing._kernel`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError, SampleError, ScheduleError
from seqpack.options import INT64_MAX, MAX_TOKENS
from seqpack.validation import check_fits_memory, check_positive_int, int64_array

__all__ = ["Packing", "pack_lengths", "token_lower_bound"]

logger = logging.getLogger(__name__)


TABLE_LIMIT = 1 << 22
"""Longest length up to which the kernel counting-sorts the lengths and looks ranks up in a
table (``8 * longest`` bytes); past it, a stable sort and binary searches."""


@dataclasses.dataclass(frozen=True)
class Packing:
    """Sequences assigned to packs of at most ``max_tokens`` tokens.

    Attributes:
        pack_of: int64 ``[n]``: the pack of each sequence.
        order: int64 ``[n]``: the sequences pack by pack, ascending index within a pack.
        cu_packs: int64 ``[num_packs + 1]``: pack ``k`` holds ``order[cu_packs[k]:cu_packs[k + 1]]``.
        tokens: int64 ``[num_packs]``: tokens in each pack.
        max_tokens: The capacity of a pack.
        token_bound: ``ceil(sum(lengths) / max_tokens)``: no packing has fewer packs.
    """

    pack_of: np.ndarray
    order: np.ndarray
    cu_packs: np.ndarray
    tokens: np.ndarray
    max_tokens: int
    token_bound: int

    @property
    def num_packs(self) -> int:
        return int(self.cu_packs.shape[0]) - 1

    def pack(self, k: int) -> np.ndarray:
        """The sequences of pack ``k`` (ascending index)."""
        return self.order[self.cu_packs[k] : self.cu_packs[k + 1]]


def token_lower_bound(lengths: np.ndarray, max_tokens: int) -> int:
    """``ceil(sum(lengths) / max_tokens)`` in exact integers (int64 ``lengths``, each >= 0)."""
    longest = int(lengths.max()) if lengths.size else 0
    if longest and lengths.size > INT64_MAX // longest:  # the int64 sum could wrap
        total = sum(int(x) for x in lengths.tolist())
    else:
        total = int(lengths.sum())
    return -(-total // max_tokens)


def pack_lengths(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> Packing:
    """Pack sequences of ``lengths`` tokens into packs of at most ``max_tokens`` tokens, as
    few as it finds, deterministically.

    The algorithm: :mod:`seqpack.packing._kernel`; how close to the token lower bound it
    gets, and how fast: docs/packing.md.

    Args:
        lengths: Token count of each sequence (integers >= 1).
        max_tokens: Tokens a pack holds (at most 2**53).

    Returns:
        The :class:`Packing`.

    Raises:
        ScheduleError: A length above ``max_tokens``, naming the sequence.
        SampleError: A length below 1, naming the sequence; a length past int64.
        ConfigError: ``lengths`` not 1-D; ``max_tokens`` out of range.
        SeqpackTypeError: Lengths that are not integers; ``max_tokens`` not an integer.
    """
    max_tokens = check_positive_int("max_tokens", max_tokens, maximum=MAX_TOKENS)
    array = int64_array("lengths", lengths, too_large=SampleError, element="sequence {index} has length")
    if array.ndim != 1:
        raise ConfigError(f"lengths must be 1-D (one length per sequence), got shape {array.shape}")
    n = int(array.shape[0])
    check_fits_memory(f"packing {n} lengths", 56 * n)  # the input copy, sort, entries, output, grouping
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Packing(empty, empty, np.zeros(1, dtype=np.int64), empty, max_tokens, 0)
    shortest, longest = int(array.min()), int(array.max())
    if shortest < 1:
        i = int(np.argmin(array))
        raise SampleError(f"sequence {i} has length {shortest}: every sequence needs at least one token")
    if longest > max_tokens:
        i = int(np.argmax(array))
        raise ScheduleError(
            f"sequence {i} has {longest} tokens > max_tokens={max_tokens}: a pack holds at most max_tokens tokens; "
            "raise max_tokens, or cut or leave out the sequence (pack_dataset's on_oversize='truncate' or 'drop')"
        )
    from seqpack.packing import _kernel  # numba, imported on the first pack

    use_table = longest <= min(TABLE_LIMIT, 16 * n + 65536)
    pack_of, num_packs = _kernel.pack_sizes(array, max_tokens, use_table)
    order, cu_packs = _kernel.group_by_pack(pack_of, num_packs)
    tokens = np.add.reduceat(array[order], cu_packs[:-1])
    bound = token_lower_bound(array, max_tokens)
    logger.debug("packed %d sequences into %d packs of %d tokens (token bound %d)", n, num_packs, max_tokens, bound)
    return Packing(pack_of, order, cu_packs, tokens.astype(np.int64, copy=False), max_tokens, bound)
