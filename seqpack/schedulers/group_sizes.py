"""The CP group sizes a dynamic-CP plan may use, and the longest sequence each holds."""

from __future__ import annotations

import numpy as np

from seqpack.errors import ConfigError
from seqpack.options import GroupSizes
from seqpack.thd.padding import group_pad_multiples
from seqpack.validation import check_choice

__all__ = ["allowed_group_sizes", "dynamic_group_sizes", "group_holds"]


def dynamic_group_sizes(group_sizes: object, who: str) -> GroupSizes:
    """``group_sizes`` checked as ``"pow2"`` or ``"any"`` for ``who``.

    Raises:
        ConfigError: Another value, or ``"static"``, naming it and ``who``.
    """
    mode = check_choice("group_sizes", group_sizes, GroupSizes)
    if mode == GroupSizes.STATIC:
        raise ConfigError(f"{who} takes group_sizes='pow2' or 'any': static groups are the other schedulers'")
    return mode


def allowed_group_sizes(num_ranks: int, group_sizes: str) -> np.ndarray:
    """Group sizes a plan over ``num_ranks`` ranks may use, ascending (int64): ``"pow2"``,
    the powers of two up to ``num_ranks`` and ``num_ranks`` itself; ``"any"``, ``1..num_ranks``.

    Raises:
        ConfigError: As :func:`dynamic_group_sizes`.
    """
    if dynamic_group_sizes(group_sizes, "allowed_group_sizes") == GroupSizes.ANY:
        return np.arange(1, num_ranks + 1, dtype=np.int64)
    return np.array(sorted({1 << k for k in range(num_ranks.bit_length())} | {num_ranks}), dtype=np.int64)


def group_holds(sizes: np.ndarray, max_tokens_per_rank: int, pad_multiple: int) -> np.ndarray:
    """int64: the longest sequence a group of each size holds alone (its tokens rounded down
    to its padding multiple)."""
    multiple = group_pad_multiples(sizes, pad_multiple)
    return (sizes * max_tokens_per_rank // multiple) * multiple
