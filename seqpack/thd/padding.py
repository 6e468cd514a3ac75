"""How long a sequence is once padded: the length arithmetic of packing and context
parallelism (static, and dynamic CP's groups of any size), on numpy arrays and ints (no
torch, so the schedulers that plan with it import no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError, SampleError
from seqpack.options import CpLayout
from seqpack.validation import (
    INT32_MAX,
    INT64_MAX,
    check_bool,
    check_choice,
    check_int,
    check_positive_int,
    int64_array,
)

__all__ = [
    "MAX_CP_SIZE",
    "check_cp",
    "cp_pad_multiple",
    "group_pad_multiple",
    "group_pad_multiples",
    "group_padded_lengths",
    "pad_multiple_for",
    "padded_lengths",
    "ranges",
]

MAX_CP_SIZE = 2**30
"""Largest CP size: every sequence holds ``2*cp`` chunks, and a pack's token count is int32."""


def check_cp(cp_size: object, cp_rank: object = 0) -> tuple[int, int]:
    """``(cp_size, cp_rank)`` as ints: a positive size, a rank in ``[0, cp_size)``."""
    size = check_positive_int("cp_size", cp_size, maximum=MAX_CP_SIZE)
    rank = check_int("cp_rank", cp_rank)
    if not 0 <= rank < size:
        raise ConfigError(f"cp_rank={rank} is out of range for cp_size={size} (valid: 0..{size - 1})")
    return size, rank


def cp_pad_multiple(cp_size: int, layout: CpLayout | str = CpLayout.DUALCHUNK) -> int:
    """What every padded sequence length must be a multiple of: ``2*cp`` (dualchunk), ``cp``
    (contiguous), 1 without CP. ``pad_multiple_for(cp_size)`` (``2*cp``) suits both layouts."""
    cp_size, _ = check_cp(cp_size)
    return layout_multiple(cp_size, check_choice("layout", layout, CpLayout))


def group_pad_multiple(group_size: int, pad_multiple: int) -> int:
    """What a sequence of a dynamic-CP group of ``group_size`` ranks is padded to a multiple
    of: ``pad_multiple`` alone, ``2 * group_size * pad_multiple`` in a group (each of the
    ``2c`` DualChunkSwap chunks is itself a multiple of ``pad_multiple``)."""
    return 2 * group_size * pad_multiple if group_size > 1 else pad_multiple


def group_pad_multiples(group_size: int | np.ndarray, pad_multiple: int) -> np.ndarray:
    """:func:`group_pad_multiple` of every entry of ``group_size`` (int64 array)."""
    size = np.asarray(group_size, dtype=np.int64)
    return np.where(size > 1, 2 * size * pad_multiple, pad_multiple)


def group_padded_lengths(lengths: np.ndarray, group_size: int | np.ndarray, pad_multiple: int) -> np.ndarray:
    """Padded length of each sequence in a dynamic-CP group of ``group_size`` ranks
    (:func:`group_pad_multiple`; int64, sizes broadcast against ``lengths``)."""
    multiple = group_pad_multiples(group_size, pad_multiple)
    return -(-np.asarray(lengths, dtype=np.int64) // multiple) * multiple


def layout_multiple(cp_size: int, layout: CpLayout) -> int:
    """:func:`cp_pad_multiple` for a checked size and layout."""
    if cp_size == 1:
        return 1
    return 2 * cp_size if layout == CpLayout.DUALCHUNK else cp_size


def pad_multiple_for(cp_size: int, tp_size: int = 1, sequence_parallel: bool = False, fp8: bool = False) -> int:
    """The multiple every sequence's padded length must have.

    ``2*cp`` under context parallelism, times ``tp`` under sequence parallelism, and a
    multiple of 16 under FP8 (its GEMMs need 16-aligned token counts).
    """
    cp = check_positive_int("cp_size", cp_size, maximum=INT32_MAX)
    tp = check_positive_int("tp_size", tp_size, maximum=INT32_MAX)
    sequence_parallel = check_bool("sequence_parallel", sequence_parallel)
    fp8 = check_bool("fp8", fp8)
    multiple = 2 * cp if cp > 1 else 1
    if sequence_parallel:
        multiple *= tp
    if fp8:
        multiple = math.lcm(multiple, 16)
    return multiple


def padded_lengths(lengths: np.ndarray | Sequence[int], pad_multiple: int) -> np.ndarray:
    """Smallest multiple of ``pad_multiple`` that holds each length (int64 array).

    Raises:
        SeqpackTypeError: Lengths that are not integers.
        SampleError: A negative length, or one whose padded length does not fit int64.
    """
    pad_multiple = check_positive_int("pad_multiple", pad_multiple)
    arr = lengths if isinstance(lengths, np.ndarray) and lengths.dtype == np.int64 else _int64_lengths(lengths)
    if arr.size:
        low, high = int(arr.min()), int(arr.max())
        if low < 0:
            raise SampleError(f"lengths must be >= 0, got {low}")
        if high > INT64_MAX // pad_multiple * pad_multiple:  # its padded length would wrap negative
            raise SampleError(f"length {high} padded to pad_multiple={pad_multiple} is too large (at most 2**63 - 1)")
    return -(-arr // pad_multiple) * pad_multiple


def _int64_lengths(lengths: np.ndarray | Sequence[int]) -> np.ndarray:
    return int64_array("lengths", lengths, too_large=SampleError, integral_floats=True, element="length at {index} is")


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], ..., starts[i] + counts[i] - 1`` for every ``i``, concatenated (int64): the
    token (or row) indices of spans laid end to end."""
    ends = np.cumsum(counts, dtype=np.int64)
    first = np.asarray(starts, dtype=np.int64) - ends + counts
    return np.repeat(first, counts) + np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64)
