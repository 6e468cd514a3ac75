"""What a calibrator keeps of a timed microbatch (a :data:`Point`: its exact integer sums,
seconds and step), :func:`microbatch_sums` of a scheduled step, and the checks of times and
counts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from seqpack.cost.terms import sequence_features
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_numbers, int64_array

__all__ = [
    "GROUP_SUMS",
    "MAX_EXACT_FLOPS",
    "MAX_SECONDS",
    "MAX_STEP",
    "MAX_WINDOW",
    "MIN_SECONDS",
    "add_encoder_flops",
    "check_lengths_count",
    "check_seconds",
    "microbatch_encoder_flops",
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
"""Times the calibrator fits: beyond them no clock measured a microbatch, and their squares
would leave float64. Others are skipped and counted like NaN."""

# One observation: the microbatch's exact sums, its seconds, its step (-1: none).
Point: TypeAlias = tuple[tuple[int, ...], float, int]

GROUP_SUMS: tuple[str, ...] = ("size", "seqlen_sum", "seqlen_sq_sum", "spans")
"""The integers a timed microbatch of a CP group is reduced to (its group's size, padded
``S`` and ``SS``, whether the group spans nodes)."""


def check_lengths_count(name: str, values: object, where: str = "") -> int:
    """How many microbatches a per-microbatch argument holds (``len``).

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
            named with its index, or an array of 2 or more dimensions.
    """
    try:
        shape = np.asarray(values).shape
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged nesting: check_numbers names it
        shape = ()
    if len(shape) > 1:
        raise SeqpackTypeError(f"{name} must be one time per microbatch (1-D){where}, got an array of shape {shape}")
    return check_numbers(name, values, where=where)


def add_encoder_flops(rows: list[tuple[int, ...]], encoder_flops: object, where: str = "") -> list[tuple[int, ...]]:
    """``rows`` (one microbatch's sums each) with its encoder FLOPs appended (``None``: 0).

    Raises:
        SeqpackTypeError: FLOPs that are no integers.
        ConfigError: Not one per microbatch (1-D).
    """
    if encoder_flops is None:
        return [(*row, 0) for row in rows]
    flops = int64_array("encoder_flops", encoder_flops)
    if flops.shape != (len(rows),):
        raise ConfigError(f"{len(rows)} microbatches but encoder_flops of shape {flops.shape}{where}")
    return [(*row, int(e)) for row, e in zip(rows, flops.tolist(), strict=True)]


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
    rank runs it (an empty cell runs a ``pad_multiple``-token filler), or ``[M, dp, 3]`` with
    ``SW`` for a sliding ``window``."""
    padded = schedule.padded_assigned().astype(np.int64)
    counts = schedule.group_counts
    per_sequence = sequence_features(padded, window)  # [n, k]
    out = np.zeros((counts.shape[0], per_sequence.shape[1]), dtype=np.int64)
    for j in range(per_sequence.shape[1]):
        np.add.at(out[:, j], schedule.group_of, per_sequence[:, j])
    out[counts == 0] = sequence_features(np.array([schedule.pad_multiple]), window)[0]
    return out.reshape(schedule.num_microbatches, schedule.dp_size, per_sequence.shape[1])


MAX_EXACT_FLOPS = 1 << 50
"""The most encoder FLOPs one sample may have for :func:`microbatch_encoder_flops` to read
them back exactly from a plan's ``sample_cost``."""


def microbatch_encoder_flops(schedule: Any, price: float | None) -> np.ndarray:
    """int64 ``[M, dp]``: the vision encoder's training FLOPs of every microbatch of a static
    plan, read back from its ``sample_cost`` (each sample's FLOPs at ``price``) as the
    nearest integers, so that every rank sums the same exact counts; zeros for a plan
    without ``sample_cost`` or without a ``price``.

    Raises:
        ConfigError: A sample whose FLOPs are not below :data:`MAX_EXACT_FLOPS` (named).
    """
    out = np.zeros((schedule.num_microbatches, schedule.dp_size), dtype=np.int64)
    cost = schedule.sample_cost
    if cost is None or price is None or not schedule.assigned.size:
        return out
    flops = np.rint(cost[schedule.assigned] / price)
    if flops.size and not flops.max() < MAX_EXACT_FLOPS:
        i = int(np.argmax(flops))
        raise ConfigError(
            f"sample {int(schedule.assigned[i])} has {flops[i]:.3g} vision encoder FLOPs, more than the calibrator "
            f"counts exactly ({MAX_EXACT_FLOPS:.3g})"
        )
    per_group = np.zeros(schedule.group_counts.shape[0], dtype=np.int64)
    np.add.at(per_group, schedule.group_of, flops.astype(np.int64))
    return per_group.reshape(schedule.num_microbatches, schedule.dp_size)
