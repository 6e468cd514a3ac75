"""What a calibrator keeps of a timed microbatch, and the checks it passes.

A :class:`~seqpack.calibrate.CostCalibrator` reduces every timed microbatch to a fixed number
of exact integers, its *sums* (``S, SS[, SW]`` of its padded lengths, or under dynamic CP
``size, S, SS, spans`` of its CP group: :data:`GROUP_SUMS`), and keeps them with its seconds
and step (a :data:`Point`). :func:`microbatch_sums` reduces a scheduled step's microbatches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from seqpack.cost.terms import sequence_features
from seqpack.errors import SeqpackTypeError
from seqpack.validation import check_numbers

__all__ = [
    "GROUP_SUMS",
    "MAX_SECONDS",
    "MAX_STEP",
    "MAX_WINDOW",
    "MIN_SECONDS",
    "check_lengths_count",
    "check_seconds",
    "microbatch_sums",
    "parse_count",
    "parse_point",
]

logger = logging.getLogger(__name__)

MAX_WINDOW = 1 << 24
"""The most timed microbatches a calibrator keeps (each refit reads them all, in Python)."""
MAX_STEP = (1 << 63) - 1  # steps travel and are saved as int64

MIN_SECONDS = 2.0**-120
MAX_SECONDS = 2.0**120
"""Times the calibrators fit (about 7.5e-37 to 1.3e36 s): beyond them no clock measured a
microbatch, and their squares (relative weights) would leave float64. Others are skipped
and counted like NaN."""

# One observation: the microbatch's exact sums, its seconds, its step (-1: none).
Point: TypeAlias = tuple[tuple[int, ...], float, int]

GROUP_SUMS: tuple[str, ...] = ("size", "seqlen_sum", "seqlen_sq_sum", "spans")
"""The integers a timed microbatch of a CP group is reduced to (its group's size, padded
``S`` and ``SS``, whether the group spans nodes)."""


def check_lengths_count(name: str, values: object, where: str = "") -> int:
    """How many microbatches a per-microbatch argument holds (``len``), refusing what has
    none (a string, a number, a 0-d array or tensor).

    Raises:
        SeqpackTypeError: ``values`` is no sequence, named with its type.
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or getattr(values, "ndim", 1) == 0:
        raise SeqpackTypeError(
            f"{name} must be a sequence, one entry per microbatch{where}, got {type(values).__name__}"
        )
    return len(values)


def check_seconds(name: str, values: object, where: str = "") -> np.ndarray:
    """Measured times as a 1-D float64 array: a sequence, a 1-D array or tensor, or one
    number (NaN, infinities and non-positive times pass: callers skip and count them).

    Raises:
        SeqpackTypeError: An element that is no real number (a string, a bool, ``None``),
            named with its index, or an array of 2 or more dimensions (its shape named:
            which axis is the microbatch is a guess seqpack does not make).
    """
    try:
        shape = np.asarray(values).shape
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged nesting: check_numbers names it
        shape = ()
    if len(shape) > 1:
        raise SeqpackTypeError(f"{name} must be one time per microbatch (1-D){where}, got an array of shape {shape}")
    return check_numbers(name, values, where=where)


def parse_point(item: Sequence[Any], width: int) -> Point:
    """A saved ``[*sums, seconds, step]`` with ``width`` sums."""
    if isinstance(item, (str, bytes)) or len(item) != width + 2:
        raise ValueError(f"a point has {len(item)} values, expected {width + 2}")
    return tuple(int(v) for v in item[:width]), float(item[width]), int(item[width + 1])


def parse_count(value: Any) -> int:
    """A saved counter (a non-negative int)."""
    count = int(value)
    if count < 0:
        raise ValueError(f"a negative count {value!r}")
    return count


def microbatch_sums(schedule: Any, window: int | None = None) -> np.ndarray:
    """int64 ``[M, dp, 2]``: ``S`` and ``SS`` of every microbatch's padded lengths, as the
    rank runs it, or ``[M, dp, 3]`` with ``SW`` for a sliding ``window``
    (:mod:`seqpack.cost.terms`): an empty cell runs a padding-only filler of
    ``pad_multiple`` tokens (exact while ``capacity**2 < 2**63``)."""
    padded = schedule.padded_assigned().astype(np.int64)
    counts = schedule.group_counts
    per_sequence = sequence_features(padded, window)  # [n, k]
    out = np.zeros((counts.shape[0], per_sequence.shape[1]), dtype=np.int64)
    for j in range(per_sequence.shape[1]):
        np.add.at(out[:, j], schedule.group_of, per_sequence[:, j])
    out[counts == 0] = sequence_features(np.array([schedule.pad_multiple]), window)[0]
    return out.reshape(schedule.num_microbatches, schedule.dp_size, per_sequence.shape[1])
