"""What a scheduler checks before planning: lengths, origins, sizes, the oversize policy.

The public :meth:`~seqpack.schedulers.base.Scheduler.schedule` runs these at the boundary;
the planners behind it trust their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seqpack.cost import check_cost_model
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import OnOversize
from seqpack.schedulers.objective import exact_sum
from seqpack.thd import padded_lengths
from seqpack.validation import INT64_MAX, MAX_TOKENS, check_choice, check_fits_memory, int64_array

__all__ = [
    "ON_OVERSIZE",
    "apply_oversize",
    "as_lengths",
    "as_origin",
    "check_microbatches",
    "check_request",
    "check_step_tokens",
    "default_origin",
]

ON_OVERSIZE = tuple(OnOversize)
_EMPTY = np.zeros(0, dtype=np.int64)


def _empty() -> np.ndarray:
    return _EMPTY.copy()


def default_origin(num_samples: int, dp_size: int) -> np.ndarray:
    """DP rank of each sample when ``num_samples`` are split into equal contiguous blocks."""
    return (np.arange(num_samples, dtype=np.int64) * dp_size) // max(num_samples, 1)


def as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Validate and coerce lengths to a contiguous int64 array of positive values.

    Raises:
        SeqpackTypeError: Not a 1-D sequence of integers (integral floats are accepted).
        SampleError: A length below 1, or one past int64 (named, never wrapped negative).
    """
    try:
        ndim = np.ndim(lengths)
    except (TypeError, ValueError, RuntimeError):  # ragged lists, device tensors
        ndim = 0
    if ndim != 1:
        if ndim == 0:
            raise SeqpackTypeError(f"lengths must be a 1-D sequence of integers, got {type(lengths).__name__}")
        raise SampleError(f"lengths must be 1-D, got shape {np.shape(lengths)}")
    arr = int64_array(
        "lengths", lengths, too_large=SampleError, integral_floats=True, element="sample {index} has length"
    )
    if arr.size and arr.min() < 1:
        i = int(np.argmin(arr))
        raise SampleError(f"sample {i} has length {int(arr[i])}; lengths must be >= 1 (drop empty samples first)")
    return arr


def as_origin(origin: Sequence[int] | np.ndarray | None, num_samples: int, dp_size: int) -> np.ndarray:
    """The DP rank of every sample as int64 (default :func:`default_origin`).

    Raises:
        SeqpackTypeError: Ranks that are not integers.
        ConfigError: Not one rank per sample, or a rank outside ``0..dp_size-1`` (named).
    """
    if origin is None:
        return default_origin(num_samples, dp_size)
    arr = int64_array("origin", origin, integral_floats=True, element="origin of sample {index} is")
    if arr.shape != (num_samples,):
        raise ConfigError(f"origin must hold one DP rank per sample ({num_samples}), got shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= dp_size):
        bad = int(np.flatnonzero((arr < 0) | (arr >= dp_size))[0])
        raise ConfigError(f"origin of sample {bad} is DP rank {int(arr[bad])}, outside 0..{dp_size - 1}")
    return arr


def check_request(num_samples: int, *, dp_size: int, cp_size: int, capacity: int, cost: object) -> None:
    """Refuse, before planning, what no schedule can hold: a microbatch past
    :data:`~seqpack.validation.MAX_TOKENS`, more replicas than memory holds, a cost that is
    not a :class:`~seqpack.cost.CostModel`."""
    if capacity > MAX_TOKENS:
        raise ConfigError(
            f"max_tokens_per_rank={capacity // cp_size} x cp_size={cp_size} = {capacity} tokens per microbatch is too "
            f"large (at most 2**53 = {MAX_TOKENS})"
        )
    # Every round of a schedule holds one id array per replica (~112 bytes each).
    check_fits_memory(f"dp_size={dp_size} for {num_samples} samples", 64 * num_samples + 112 * dp_size)
    check_cost_model("cost", cost)


def check_microbatches(dp_size: int, **least: int | None) -> None:
    """Refuse, before planning, a microbatch count (the largest of the scheduler options in
    ``least``, e.g. ``min_microbatches``) whose ``count x dp_size`` cells memory cannot hold."""
    name, count = max(((k, v) for k, v in least.items() if v is not None), key=lambda kv: kv[1])
    check_fits_memory(f"{name}={count} microbatches x dp_size={dp_size}", 112 * count * dp_size)


def check_step_tokens(lengths: np.ndarray, pad_multiple: int) -> None:
    """Refuse a step whose padded tokens, summed, do not fit int64 (each fits capacity)."""
    if lengths.size and int(lengths.max()) + pad_multiple > INT64_MAX // lengths.shape[0]:
        total = exact_sum(padded_lengths(lengths, pad_multiple))
        if total > INT64_MAX:
            raise ScheduleError(
                f"the step's {lengths.shape[0]} sequences hold {total} padded tokens, too many (at most 2**63 - 1)"
            )


def apply_oversize(
    lengths: np.ndarray, capacity: int, pad_multiple: int, on_oversize: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply the oversize policy. Returns (lengths to pack with, dropped ids, truncated ids)."""
    on_oversize = check_choice("on_oversize", on_oversize, OnOversize)
    if capacity < pad_multiple:
        raise ConfigError(f"capacity {capacity} is smaller than pad_multiple {pad_multiple}: no sequence fits")
    # Longest length whose padded length fits (compared unpadded: padding a length near
    # 2**63 would wrap int64).
    fits = (capacity // pad_multiple) * pad_multiple
    over = np.flatnonzero(lengths > fits)
    effective = lengths.copy()
    if over.size == 0:
        return effective, _empty(), _empty()
    if on_oversize == OnOversize.ERROR:
        i = int(over[0])
        padded = -(-int(lengths[i]) // pad_multiple) * pad_multiple
        raise ScheduleError(
            f"sample {i} has {int(lengths[i])} tokens ({padded} padded to a multiple of {pad_multiple}), "
            f"more than one microbatch holds: capacity {capacity} tokens; {over.size} sample(s) are too long. "
            "Raise max_tokens_per_rank or cp_size, or pass on_oversize='truncate' or 'drop'"
        )
    if on_oversize == "drop":
        effective[over] = 0
        return effective, over.astype(np.int64), _empty()
    effective[over] = fits
    return effective, _empty(), over.astype(np.int64)
