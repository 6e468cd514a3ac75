"""The :class:`Schedule` a scheduler returns and the :class:`ScheduleLimits` it was made for.

A schedule says, for one training step, which global sample ids each DP replica packs into
each of its microbatches. It is pure data computed from lengths alone, so every rank
computes the same one without talking to the others.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.schedulers import schedule_checks
from seqpack.schedulers.request import _empty, as_lengths, default_origin
from seqpack.thd import padded_lengths
from seqpack.validation import int64_array

__all__ = ["Schedule", "ScheduleLimits"]


@dataclasses.dataclass(frozen=True)
class ScheduleLimits:
    """The sizes a schedule was made for, in their wire order (:meth:`to_array`)."""

    num_microbatches: int
    dp_size: int
    cp_size: int
    max_tokens_per_rank: int
    pad_multiple: int

    def to_array(self) -> np.ndarray:
        """The limits as int64 ``[5]``, in field order."""
        return np.array(dataclasses.astuple(self), dtype=np.int64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> ScheduleLimits:
        """Inverse of :meth:`to_array`.

        Raises:
            ScheduleError: Not one value per field.
        """
        fields = dataclasses.fields(cls)
        if values.shape != (len(fields),):
            raise ScheduleError(
                f"schedule limits must hold {len(fields)} values ({', '.join(f.name for f in fields)}), "
                f"got {values.tolist()}"
            )
        return cls(*(int(v) for v in values))


def _int64_array(name: str, value: object) -> np.ndarray:
    """One array of :meth:`Schedule.from_arrays` as a flat int64 copy (never wrapped, never
    truncated)."""
    return int64_array(f"schedule array {name!r}", value, error=ScheduleError).reshape(-1)


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
    def limits(self) -> ScheduleLimits:
        """The limits the schedule was made for (the head of :meth:`to_arrays`)."""
        return ScheduleLimits(
            self.num_microbatches, self.dp_size, self.cp_size, self.max_tokens_per_rank, self.pad_multiple
        )

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

        ``limits`` is :meth:`ScheduleLimits.to_array`; ``cell_counts[m*dp + d]`` is the number
        of ids of cell ``(m, d)``, whose ids follow each other in ``assigned``. :meth:`from_arrays` inverts it.
        """
        ids, _, counts = self._flat
        return {
            "limits": self.limits.to_array(),
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
        limits = ScheduleLimits.from_array(_int64_array("limits", arrays["limits"]))
        m_count, dp = limits.num_microbatches, limits.dp_size
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
            cp_size=limits.cp_size,
            max_tokens_per_rank=limits.max_tokens_per_rank,
            pad_multiple=limits.pad_multiple,
            deferred=get["deferred"],
            dropped=get["dropped"],
            truncated=get["truncated"],
            origin=get["origin"],
        )

    def fingerprint(self) -> int:
        """A 63-bit hash of the whole schedule, equal on ranks that computed the same one."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update(self.limits.to_array().tobytes())
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
        """Raise :class:`~seqpack.errors.ScheduleError` naming the first violated invariant.

        Every id appears exactly once in assignment, deferred or dropped; every replica runs
        ``num_microbatches`` microbatches; padded tokens of every microbatch fit capacity;
        truncated ids are packed with at most their original length; the limits match.
        One check per invariant, in :mod:`seqpack.schedulers.schedule_checks`.
        """
        expected = {"dp_size": dp_size, "cp_size": cp_size, "max_tokens_per_rank": max_tokens_per_rank}
        expected["pad_multiple"] = pad_multiple
        schedule_checks.check_all(self, None if lengths is None else as_lengths(lengths), expected)
