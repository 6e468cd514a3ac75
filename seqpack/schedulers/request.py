"""One step's scheduling :class:`Request`, checked once (:meth:`Request.of`) and trusted by the
planners, and the checks and oversize policy they apply before planning."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from seqpack.cost import CostModel, check_cost_model
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import INT64_MAX, MAX_TOKENS, OnOversize, Sync
from seqpack.schedulers.objective import as_sample_cost, exact_sum
from seqpack.schedulers.shape_limits import bucket_capacity
from seqpack.thd import padded_lengths
from seqpack.thd.static_shapes import StaticShapes, as_static_shapes
from seqpack.validation import check_choice, check_fits_memory, check_number, check_positive_int, int64_array

__all__ = [
    "Request",
    "apply_oversize",
    "apply_static_oversize",
    "as_lengths",
    "as_origin",
    "check_microbatches",
    "check_capacity",
    "check_step_tokens",
    "default_origin",
]


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


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
    """The DP rank of every sample as int64 (default :func:`default_origin`), checked by
    :func:`check_origin` (ConfigError; SeqpackTypeError for ranks that are not integers)."""
    if origin is None:
        return default_origin(num_samples, dp_size)
    arr = int64_array("origin", origin, integral_floats=True, element="origin of sample {index} is")
    check_origin(arr, num_samples, dp_size, ConfigError)
    return arr


def check_origin(origin: np.ndarray | None, num_samples: int, dp_size: int, error: type[ValueError]) -> None:
    """Raise ``error`` naming the fault unless ``origin`` holds a DP rank in ``0..dp_size-1`` per sample."""
    if origin is None or origin.shape != (num_samples,):
        raise error(
            f"origin must hold one DP rank per sample ({num_samples}), got shape {getattr(origin, 'shape', None)}"
        )
    if num_samples and (origin.min() < 0 or origin.max() >= dp_size):
        bad = int(np.flatnonzero((origin < 0) | (origin >= dp_size))[0])
        raise error(f"origin of sample {bad} is DP rank {int(origin[bad])}, outside 0..{dp_size - 1}")


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    """One step's scheduling request, checked (build it with :meth:`of`; fields as the
    arguments of :meth:`~seqpack.schedulers.base.Scheduler.schedule`, ``origin`` filled in,
    ``on_oversize`` and ``sync`` as their enums)."""

    lengths: np.ndarray
    dp_size: int
    cp_size: int
    max_tokens_per_rank: int
    pad_multiple: int
    cost: CostModel | None
    on_oversize: OnOversize
    origin: np.ndarray
    sync: Sync
    bytes_per_token: float | None
    static_shapes: StaticShapes | None
    sample_cost: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: CostModel | None = None,
        on_oversize: str = OnOversize.ERROR,
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str = Sync.LOCKSTEP,
        bytes_per_token: float | None = None,
        static_shapes: StaticShapes | None = None,
        sample_cost: Sequence[float] | np.ndarray | None = None,
    ) -> Request:
        """The checked request (arguments as :meth:`~seqpack.schedulers.Scheduler.schedule`).

        Raises:
            SampleError, SeqpackTypeError: Bad lengths (:func:`as_lengths`).
            ConfigError: A bad argument (named): a size not a positive int, more replicas than
                memory holds, an unknown choice, a bad ``origin``, ``cost``, ``bytes_per_token``
                or ``sample_cost``.
        """
        checked = as_lengths(lengths)
        dp_size = check_positive_int("dp_size", dp_size)
        # Every round of a schedule holds one id array per replica (~112 bytes each).
        check_fits_memory(f"dp_size={dp_size} for {checked.shape[0]} samples", 64 * checked.shape[0] + 112 * dp_size)
        return cls(
            lengths=checked,
            dp_size=dp_size,
            cp_size=check_positive_int("cp_size", cp_size),
            max_tokens_per_rank=check_positive_int("max_tokens_per_rank", max_tokens_per_rank),
            pad_multiple=check_positive_int("pad_multiple", pad_multiple),
            cost=check_cost_model("cost", cost),
            on_oversize=check_choice("on_oversize", on_oversize, OnOversize),
            origin=as_origin(origin, checked.shape[0], dp_size),
            sync=check_choice("sync", sync, Sync),
            bytes_per_token=None
            if bytes_per_token is None
            else check_number("bytes_per_token", bytes_per_token, minimum=0.0),
            static_shapes=as_static_shapes(static_shapes),
            sample_cost=as_sample_cost(sample_cost, checked.shape[0]),
        )

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        """Padded tokens a static microbatch holds: ``max_tokens_per_rank * cp_size``, or the
        largest bucket of ``static_shapes`` when smaller."""
        full = self.max_tokens_per_rank * self.cp_size
        return full if self.static_shapes is None else bucket_capacity(self.static_shapes, full)

    def subset(self, ids: np.ndarray, **changes: object) -> Request:
        """The request for the samples ``ids`` only, with ``changes`` to its fields (e.g.
        ``lengths`` after the oversize policy; trusted: not checked again)."""
        changes.setdefault("origin", self.origin[ids])
        changes.setdefault("sample_cost", None if self.sample_cost is None else self.sample_cost[ids])
        changes.setdefault("lengths", self.lengths[ids])
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def check_capacity(capacity: int, ranks: int, ranks_name: str = "cp_size") -> None:
    """Refuse, before planning, a microbatch of ``capacity`` tokens on ``ranks`` ranks (the
    ``ranks_name``) past :data:`~seqpack.validation.MAX_TOKENS`."""
    if capacity > MAX_TOKENS:
        raise ConfigError(
            f"max_tokens_per_rank={capacity // ranks} x {ranks_name}={ranks} = {capacity} tokens per microbatch is too "
            f"large (at most 2**53 = {MAX_TOKENS})"
        )


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
    lengths: np.ndarray, on_oversize: OnOversize, *, fits: int, multiple: int, limit: str, remedy: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply the oversize policy to the sequences longer than ``fits`` (the longest a plan
    holds, padded to ``multiple``); ``limit`` says what holds them and ``remedy`` what raises
    it, for the errors. Returns (lengths to pack with, dropped ids, truncated ids).

    Raises:
        ConfigError: ``fits`` below 1 (nothing fits).
        ScheduleError: A longer sequence under ``on_oversize="error"``, named.
    """
    if fits < 1:
        raise ConfigError(
            f"nothing fits: {limit}, at most 0 once padded to a multiple of {multiple}. "
            f"Raise {remedy}, or lower pad_multiple"
        )
    over = np.flatnonzero(lengths > fits).astype(np.int64)  # compared unpadded: padding near 2**63 would wrap
    if over.size and on_oversize == OnOversize.ERROR:
        i = int(over[0])
        raise ScheduleError(
            f"sample {i} has {int(lengths[i])} tokens, more than {limit}, at most {fits} once padded to a multiple "
            f"of {multiple}; {over.size} sample(s) are too long. Raise {remedy}, or pass on_oversize='truncate' or "
            "'drop'"
        )
    effective = lengths.copy()
    if on_oversize == OnOversize.DROP:
        effective[over] = 0
        return effective, over, _empty()
    effective[over] = fits
    return effective, _empty(), over


def apply_static_oversize(request: Request) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`apply_oversize` for a static plan: a sequence fits one microbatch of
    ``request.capacity`` tokens once padded to ``request.pad_multiple``."""
    capacity, pad_multiple = request.capacity, request.pad_multiple
    return apply_oversize(
        request.lengths,
        request.on_oversize,
        fits=(capacity // pad_multiple) * pad_multiple,
        multiple=pad_multiple,
        limit=f"one microbatch holds: capacity {capacity} tokens",
        remedy="max_tokens_per_rank or cp_size",
    )
