"""The Schedule a scheduler returns, the Scheduler base class, and oversize handling.

A schedule says, for one training step, which global sample ids each DP replica packs into
each of its microbatches. It is pure data computed from lengths alone, so every rank
computes the same one without talking to the others.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import OnOversize, Sync
from seqpack.stats import exact_sum, microbatch_costs, step_objective
from seqpack.thd import padded_lengths
from seqpack.validation import (
    INT64_MAX,
    MAX_TOKENS,
    check_choice,
    check_cost_model,
    check_fits_memory,
    check_positive_int,
)

ON_OVERSIZE = tuple(OnOversize)
_EMPTY = np.zeros(0, dtype=np.int64)


def _empty() -> np.ndarray:
    return _EMPTY.copy()


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Where every sequence of one step goes.

    Attributes:
        num_microbatches: Microbatches every DP replica runs this step.
        assignment: ``assignment[m][d]`` is the int64 array of global ids packed, in this
            order, into microbatch ``m`` of DP replica ``d``.
        deferred: Ids held back for the next step (empty unless the scheduler defers).
        dropped: Ids removed because they exceed capacity under ``on_oversize="drop"``.
        truncated: Ids cut to capacity under ``on_oversize="truncate"`` (still assigned).
        lengths: Token count each id is packed with (after truncation; 0 when dropped).
        original_lengths: Lengths as given to the scheduler.
        dp_size, cp_size, max_tokens_per_rank, pad_multiple: The limits it was made for.
        origin: DP rank holding each id before the step's exchange (default: contiguous
            equal blocks, as :meth:`Scheduler.schedule` assumes); what
            :class:`~seqpack.stats.StepStats` counts moved tokens against. Not part of the
            fingerprint: the same placement is the same schedule wherever samples came from.
    """

    num_microbatches: int
    assignment: list[list[np.ndarray]]
    lengths: np.ndarray
    original_lengths: np.ndarray
    dp_size: int
    cp_size: int
    max_tokens_per_rank: int
    pad_multiple: int
    deferred: np.ndarray = dataclasses.field(default_factory=_empty)
    dropped: np.ndarray = dataclasses.field(default_factory=_empty)
    truncated: np.ndarray = dataclasses.field(default_factory=_empty)
    origin: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.origin is None:
            object.__setattr__(self, "origin", default_origin(self.num_sequences, self.dp_size))

    @property
    def capacity(self) -> int:
        """Padded tokens one microbatch may hold: ``max_tokens_per_rank * cp_size``."""
        return self.max_tokens_per_rank * self.cp_size

    @property
    def num_sequences(self) -> int:
        return int(self.original_lengths.shape[0])

    @functools.cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(all assigned ids in cell order, cell ``m*dp + d`` of each, ids per cell).

        Computed once: the helpers below are vectorized over it, so they stay fast with
        thousands of replicas. A Schedule is immutable; do not edit ``assignment`` in place.
        """
        cells = [np.asarray(ids) for row in self.assignment for ids in row]
        counts = np.fromiter((c.shape[0] for c in cells), dtype=np.int64, count=len(cells))
        ids = np.concatenate(cells).astype(np.int64, copy=False) if cells else _empty()
        cell = np.repeat(np.arange(len(cells), dtype=np.int64), counts)
        return ids, cell, counts

    def microbatch_tokens(self, padded: bool = True) -> np.ndarray:
        """Tokens of every microbatch, int64 ``[num_microbatches, dp_size]``."""
        per_seq = padded_lengths(self.lengths, self.pad_multiple) if padded else self.lengths
        ids, cell, counts = self._flat
        if counts.shape[0] != self.num_microbatches * self.dp_size:
            raise ScheduleError("assignment does not hold num_microbatches x dp_size microbatches")
        sums = np.zeros(counts.shape[0], dtype=np.int64)
        np.add.at(sums, cell, per_seq[ids])
        return sums.reshape(self.num_microbatches, self.dp_size)

    def placement(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global id: replica, microbatch and position in pack (-1 when not assigned)."""
        n = self.num_sequences
        replica = np.full(n, -1, dtype=np.int64)
        micro = np.full(n, -1, dtype=np.int64)
        slot = np.full(n, -1, dtype=np.int64)
        ids, cell, counts = self._flat
        if ids.size:
            starts = np.cumsum(counts) - counts
            replica[ids] = cell % self.dp_size
            micro[ids] = cell // self.dp_size
            slot[ids] = np.arange(ids.shape[0], dtype=np.int64) - starts[cell]
        return replica, micro, slot

    # Arrays of :meth:`to_arrays`, in wire order after ``limits``.
    ARRAY_FIELDS: ClassVar[tuple[str, ...]] = (
        "original_lengths",
        "lengths",
        "cell_counts",
        "assigned",
        "deferred",
        "dropped",
        "truncated",
        "origin",
    )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The schedule as flat int64 arrays (what travels on the wire).

        ``limits`` is ``[num_microbatches, dp_size, cp_size, max_tokens_per_rank,
        pad_multiple]``; ``cell_counts[m*dp + d]`` is the number of ids of cell ``(m, d)``,
        whose ids follow each other in ``assigned``. :meth:`from_arrays` inverts it.
        """
        ids, _, counts = self._flat
        limits = [self.num_microbatches, self.dp_size, self.cp_size, self.max_tokens_per_rank, self.pad_multiple]
        return {
            "limits": np.array(limits, dtype=np.int64),
            "original_lengths": np.ascontiguousarray(self.original_lengths, dtype=np.int64),
            "lengths": np.ascontiguousarray(self.lengths, dtype=np.int64),
            "cell_counts": counts,
            "assigned": ids,
            "deferred": np.ascontiguousarray(self.deferred, dtype=np.int64),
            "dropped": np.ascontiguousarray(self.dropped, dtype=np.int64),
            "truncated": np.ascontiguousarray(self.truncated, dtype=np.int64),
            "origin": np.ascontiguousarray(self.origin, dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Schedule:
        """Rebuild a schedule from :meth:`to_arrays` (copies every array).

        Raises:
            ScheduleError: Missing arrays or counts that do not add up.
        """
        if not isinstance(arrays, Mapping):
            raise SeqpackTypeError(f"schedule arrays must be a mapping, got {type(arrays).__name__}")
        missing = [k for k in ("limits", *cls.ARRAY_FIELDS) if k not in arrays]
        if missing:
            raise ScheduleError(f"schedule arrays are missing {missing}")
        limits = _int64_array("limits", arrays["limits"])
        if limits.shape[0] != 5:
            raise ScheduleError(f"schedule limits must hold 5 values, got {limits.tolist()}")
        m_count, dp = int(limits[0]), int(limits[1])
        get = {k: _int64_array(k, arrays[k]) for k in cls.ARRAY_FIELDS}
        counts, assigned = get["cell_counts"], get["assigned"]
        if m_count < 0 or dp < 1 or counts.shape[0] != m_count * dp:
            raise ScheduleError(
                f"schedule cell_counts holds {counts.shape[0]} counts for {m_count} microbatches x {dp} replicas"
            )
        if int(counts.sum()) != assigned.shape[0] or (counts.size and counts.min() < 0):
            raise ScheduleError(
                f"schedule cell_counts sum to {int(counts.sum())} but {assigned.shape[0]} ids are assigned"
            )
        cells = np.split(assigned, np.cumsum(counts)[:-1]) if counts.size else []
        return cls(
            num_microbatches=m_count,
            assignment=[[np.ascontiguousarray(cells[m * dp + d]) for d in range(dp)] for m in range(m_count)],
            lengths=get["lengths"],
            original_lengths=get["original_lengths"],
            dp_size=dp,
            cp_size=int(limits[2]),
            max_tokens_per_rank=int(limits[3]),
            pad_multiple=int(limits[4]),
            deferred=get["deferred"],
            dropped=get["dropped"],
            truncated=get["truncated"],
            origin=get["origin"],
        )

    def fingerprint(self) -> int:
        """A 63-bit hash of the whole schedule, equal on ranks that computed the same one."""
        digest = hashlib.blake2b(digest_size=8)
        header = np.array(
            [self.num_microbatches, self.dp_size, self.cp_size, self.max_tokens_per_rank, self.pad_multiple],
            dtype=np.int64,
        )
        digest.update(header.tobytes())
        # Byte stream: for every cell its id count then its ids (built in one buffer).
        ids, cell, counts = self._flat
        stream = np.empty(ids.shape[0] + counts.shape[0], dtype=np.int64)
        count_at = np.cumsum(counts + 1) - (counts + 1)
        stream[count_at] = counts
        is_id = np.ones(stream.shape[0], dtype=bool)
        is_id[count_at] = False
        stream[is_id] = ids
        digest.update(stream.tobytes())
        for extra in (self.deferred, self.dropped, self.truncated, self.lengths, self.original_lengths):
            digest.update(np.int64(extra.shape[0]).tobytes())
            digest.update(np.ascontiguousarray(extra, dtype=np.int64).tobytes())
        return int.from_bytes(digest.digest(), "little") >> 1

    def validate(
        self,
        lengths: Sequence[int] | np.ndarray | None = None,
        *,
        dp_size: int | None = None,
        cp_size: int | None = None,
        max_tokens_per_rank: int | None = None,
        pad_multiple: int | None = None,
    ) -> None:
        """Raise ``ValueError`` naming the first violated invariant.

        Every id appears exactly once in assignment, deferred or dropped; every replica runs
        ``num_microbatches`` microbatches; padded tokens of every microbatch fit capacity;
        truncated ids are packed with at most their original length; the limits match.
        """
        given = self.original_lengths if lengths is None else as_lengths(lengths)
        if given.shape != self.original_lengths.shape or not np.array_equal(given, self.original_lengths):
            raise ScheduleError("schedule was computed for different lengths than the ones given")
        for name, expected in (
            ("dp_size", dp_size),
            ("cp_size", cp_size),
            ("max_tokens_per_rank", max_tokens_per_rank),
            ("pad_multiple", pad_multiple),
        ):
            if expected is not None and check_positive_int(name, expected) != getattr(self, name):
                raise ScheduleError(f"schedule has {name}={getattr(self, name)}, expected {expected}")
        if len(self.assignment) != self.num_microbatches:
            raise ScheduleError(
                f"assignment has {len(self.assignment)} microbatch rounds but num_microbatches={self.num_microbatches}"
            )
        if self.num_microbatches < 0:
            raise ScheduleError(f"num_microbatches={self.num_microbatches} is negative")
        n = self.num_sequences
        for m, row in enumerate(self.assignment):
            if len(row) != self.dp_size:
                raise ScheduleError(f"microbatch {m} has {len(row)} replicas, expected dp_size={self.dp_size}")
            for d, ids in enumerate(row):
                if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
                    got = f"{ids.dtype} {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
                    raise ScheduleError(f"assignment[{m}][{d}] must be a 1-D int64 array, got {got}")
        ids, cell, _ = self._flat
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
            m, d = divmod(int(cell[bad]), self.dp_size)
            raise ScheduleError(f"assignment[{m}][{d}] holds an id outside 0..{n - 1}")
        seen = np.bincount(ids, minlength=n) if n else np.zeros(0, dtype=np.int64)
        for name in ("deferred", "dropped"):
            extra = getattr(self, name)
            if extra.size and (extra.min() < 0 or extra.max() >= n):
                raise ScheduleError(f"{name} holds an id outside 0..{n - 1}")
            seen = seen + np.bincount(extra, minlength=n)
        if n and seen.max(initial=0) > 1:
            dup = int(np.flatnonzero(seen > 1)[0])
            raise ScheduleError(f"sample {dup} appears {int(seen[dup])} times in the schedule")
        if n and seen.min(initial=1) < 1:
            missing = int(np.flatnonzero(seen == 0)[0])
            raise ScheduleError(f"sample {missing} appears nowhere in the schedule (assignment, deferred or dropped)")
        if self.origin is None or self.origin.shape != self.original_lengths.shape:
            raise ScheduleError(f"origin must hold one DP rank per sample ({n}), got {self.origin!r:.80}")
        if n and (self.origin.min() < 0 or self.origin.max() >= self.dp_size):
            raise ScheduleError(f"origin must hold DP ranks in 0..{self.dp_size - 1}")
        if self.lengths.shape != self.original_lengths.shape:
            raise ScheduleError("schedule lengths and original lengths differ in shape")
        if np.any(self.lengths > self.original_lengths) or np.any(self.lengths < 0):
            raise ScheduleError("a scheduled length exceeds its original length or is negative")
        if ids.size and self.lengths[ids].min() < 1:
            bad = int(ids[np.argmin(self.lengths[ids])])
            raise ScheduleError(f"sample {bad} is assigned with length {int(self.lengths[bad])}")
        if self.dropped.size and np.any(self.lengths[self.dropped] != 0):
            raise ScheduleError("a dropped sample keeps a non-zero length")
        changed = np.flatnonzero(self.lengths != self.original_lengths)
        expected_changed = np.union1d(self.truncated, self.dropped)
        if not np.isin(changed, expected_changed).all():
            bad = int(changed[~np.isin(changed, expected_changed)][0])
            raise ScheduleError(f"sample {bad} is packed with a changed length but is neither truncated nor dropped")
        if self.num_microbatches:
            tokens = self.microbatch_tokens(padded=True)
            over = np.argwhere(tokens > self.capacity)
            if over.size:
                m, d = (int(v) for v in over[0])
                raise ScheduleError(
                    f"microbatch {m} of replica {d} holds {int(tokens[m, d])} padded tokens > capacity "
                    f"{self.capacity} (max_tokens_per_rank={self.max_tokens_per_rank} x cp_size={self.cp_size})"
                )


def _int64_array(name: str, value: object) -> np.ndarray:
    """One array of :meth:`Schedule.from_arrays` as a flat int64 copy (never wrapped, never
    truncated)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.dtype.kind not in "iu" and not (array.dtype.kind == "f" and array.size == 0):
        raise ScheduleError(f"schedule array {name!r} must hold integers, got {value!r:.60}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > INT64_MAX:
        raise ScheduleError(f"schedule array {name!r} holds {int(array.max())}, which does not fit int64")
    return np.array(array, dtype=np.int64).reshape(-1)


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
        arr = np.asarray(lengths)
    except (TypeError, ValueError, RuntimeError):  # ragged lists, device tensors
        arr = np.asarray(None)
    if arr.ndim != 1:
        if arr.ndim == 0:
            raise SeqpackTypeError(f"lengths must be a 1-D sequence of integers, got {type(lengths).__name__}")
        raise SampleError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype == object:  # Python ints past int64, or a mix of types
        for i, value in enumerate(arr.tolist()):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise SeqpackTypeError(f"lengths must be integers, got {value!r} for sample {i}")
            if int(value) > INT64_MAX:
                raise SampleError(f"sample {i} has length {int(value)}, too large (at most 2**63 - 1)")
        arr = np.array([int(v) for v in arr.tolist()], dtype=np.int64)
    elif arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise SeqpackTypeError(f"lengths must be integers, got dtype {arr.dtype}")
        if arr.max() >= 2.0**63:
            i = int(np.argmax(arr))
            raise SampleError(f"sample {i} has length {float(arr[i]):.0f}, too large (at most 2**63 - 1)")
    elif arr.size and arr.dtype == np.uint64 and int(arr.max()) > INT64_MAX:
        i = int(np.argmax(arr))
        raise SampleError(f"sample {i} has length {int(arr[i])}, too large (at most 2**63 - 1)")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size and arr.min() < 1:
        i = int(np.argmin(arr))
        raise SampleError(f"sample {i} has length {int(arr[i])}; lengths must be >= 1 (drop empty samples first)")
    return arr


def as_origin(origin: Sequence[int] | np.ndarray | None, num_samples: int, dp_size: int) -> np.ndarray:
    """The DP rank of every sample as int64 (default :func:`default_origin`).

    Raises:
        SeqpackTypeError: Ranks that are not integers.
        ConfigError: Not one rank in ``0..dp_size-1`` per sample.
    """
    if origin is None:
        return default_origin(num_samples, dp_size)
    arr = np.asarray(origin)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or np.any(arr != np.round(arr)):
            raise SeqpackTypeError(f"origin must hold integer DP ranks, got dtype {arr.dtype}")
    if arr.shape != (num_samples,) or (arr.size and (arr.min() < 0 or arr.max() >= dp_size)):
        raise ConfigError(f"origin must hold one DP rank in 0..{dp_size - 1} per sample, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.int64)


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


class Scheduler(ABC):
    """Turns one step's lengths into a :class:`Schedule`. Subclasses implement :meth:`_plan`.

    ``schedule`` validates its arguments, applies the oversize policy and hands the
    remaining ids to ``_plan``; it is pure and deterministic.
    """

    name: ClassVar[str] = ""
    uses_sync: ClassVar[bool] = False
    """Whether :meth:`_plan` takes ``sync`` (schedulers that choose the microbatch count
    for a predicted step time); others plan the same for every sync."""

    def schedule(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: CostModel | None = None,
        on_oversize: str = "error",
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str | None = None,
    ) -> Schedule:
        """Assign every sequence to a (microbatch, replica).

        Args:
            lengths: int64 ``[N]`` real lengths in global order (DP rank 0's samples first).
            dp_size: Data-parallel replicas.
            cp_size: Context-parallel ranks per replica; a microbatch holds up to
                ``max_tokens_per_rank * cp_size`` padded tokens.
            max_tokens_per_rank: Token capacity of one rank for one microbatch.
            pad_multiple: Every sequence is padded to a multiple of this.
            cost: Per-sequence cost model (schedulers that balance cost use it).
            on_oversize: ``"error"`` (default), ``"truncate"`` or ``"drop"`` for sequences
                longer than one microbatch's capacity.
            origin: DP rank each sample currently sits on (default: ``N`` split into
                ``dp_size`` contiguous, equal blocks). Schedulers may use it to keep samples
                where they are; ``"empty"`` never moves them.
            sync: What a step waits for, so what the scheduler minimises
                (:func:`predicted_step_time`): ``"lockstep"`` (FSDP, pipeline: every
                microbatch round waits for its slowest replica), ``"replica"`` (DDP,
                ZeRO-1: the slowest replica's total), or ``None`` (the scheduler's default;
                ``balanced`` then minimises the sum of both).

        Raises:
            ValueError: Bad sizes, non-positive lengths, or an oversize sequence under
                ``on_oversize="error"``.
        """
        original = as_lengths(lengths)
        dp_size = check_positive_int("dp_size", dp_size)
        cp_size = check_positive_int("cp_size", cp_size)
        max_tokens_per_rank = check_positive_int("max_tokens_per_rank", max_tokens_per_rank)
        pad_multiple = check_positive_int("pad_multiple", pad_multiple)
        sync = None if sync is None else check_choice("sync", sync, Sync)
        capacity = max_tokens_per_rank * cp_size
        check_request(original.shape[0], dp_size=dp_size, cp_size=cp_size, capacity=capacity, cost=cost)
        effective, dropped, truncated = apply_oversize(original, capacity, pad_multiple, on_oversize)
        check_step_tokens(effective, pad_multiple)
        origin_arr = as_origin(origin, original.shape[0], dp_size)
        active = np.flatnonzero(effective > 0).astype(np.int64)
        options: dict[str, object] = {"sync": sync} if self.uses_sync else {}
        rounds, deferred = self._plan(
            active,
            effective[active],
            dp_size=dp_size,
            capacity=capacity,
            pad_multiple=pad_multiple,
            cost=cost,
            origin=origin_arr[active],
            **options,
        )
        return Schedule(
            num_microbatches=len(rounds),
            assignment=[[np.ascontiguousarray(ids, dtype=np.int64) for ids in row] for row in rounds],
            lengths=effective,
            original_lengths=original,
            dp_size=dp_size,
            cp_size=cp_size,
            max_tokens_per_rank=max_tokens_per_rank,
            pad_multiple=pad_multiple,
            deferred=np.ascontiguousarray(deferred, dtype=np.int64),
            dropped=dropped,
            truncated=truncated,
            origin=origin_arr,
        )

    def resolve_cost(self, cost: CostModel | None) -> CostModel | None:
        """The cost model this scheduler balances for ``cost``; pass it to
        ``StepStats.from_schedule`` so stats are in the units the schedule was balanced in.
        Schedulers that ignore cost return ``cost`` unchanged."""
        return cost

    @abstractmethod
    def _plan(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        dp_size: int,
        capacity: int,
        pad_multiple: int,
        cost: CostModel | None,
        origin: np.ndarray,
    ) -> tuple[list[list[np.ndarray]], np.ndarray]:
        """Return (``rounds[m][d]`` id arrays, deferred ids) for ``ids`` with ``lengths``
        (``origin[i]``: DP rank holding ``ids[i]``). Every padded microbatch must fit
        ``capacity``; every round must list ``dp_size`` arrays (empty ones allowed)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def predicted_step_time(schedule: Schedule, cost: CostModel, *, sync: str = "lockstep") -> float:
    """The step time ``cost`` predicts for ``schedule`` (in ``cost``'s units: seconds for a
    fitted model, FLOPs for :meth:`~seqpack.cost.CostModel.from_transformer`).

    Every microbatch costs ``constant + sum(linear*s + quadratic*s**2)`` over its padded
    lengths (an empty one, a padding-only filler, costs ``constant``).

    Args:
        schedule: A step's schedule.
        cost: The cost model.
        sync: ``"lockstep"`` (FSDP, pipeline): ``sum_m max_d cost[m, d]``, every round
            waits for its slowest replica; ``"replica"`` (DDP, ZeRO-1):
            ``max_d sum_m cost[m, d]``, the slowest replica's total.

    Raises:
        SeqpackTypeError: ``cost`` is not a CostModel or ``schedule`` not a Schedule.
        ConfigError: Unknown ``sync``.
    """
    if not isinstance(schedule, Schedule):
        raise SeqpackTypeError(f"schedule must be a seqpack Schedule, got {type(schedule).__name__}")
    if not isinstance(cost, CostModel):
        raise SeqpackTypeError(f"cost must be a seqpack.CostModel, got {type(cost).__name__}")
    sync = check_choice("sync", sync, Sync)
    return step_objective(microbatch_costs(schedule, cost), sync)
