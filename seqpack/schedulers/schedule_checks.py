"""The invariants of a :class:`~seqpack.schedulers.schedule.Schedule`, one check each.

:meth:`Schedule.validate` runs them in order (:func:`check_all`); each raises
:class:`~seqpack.errors.ScheduleError` naming the first thing it finds wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.validation import check_positive_int

if TYPE_CHECKING:
    from seqpack.schedulers.schedule import Schedule

__all__ = ["check_all"]


def check_all(schedule: Schedule, lengths: np.ndarray | None, expected: dict[str, int | None]) -> None:
    """Every check below, in order: ``lengths`` (when given) and the ``expected`` limits
    (those not None) first, then the schedule's own consistency."""
    check_lengths_given(schedule, lengths)
    check_limits(schedule, expected)
    check_grid(schedule)
    check_ids_in_range(schedule)
    check_exactly_once(schedule)
    check_origin(schedule)
    check_scheduled_lengths(schedule)
    check_capacity(schedule)


def check_lengths_given(schedule: Schedule, lengths: np.ndarray | None) -> None:
    """The schedule was computed for ``lengths``."""
    if lengths is None:
        return
    if lengths.shape != schedule.original_lengths.shape or not np.array_equal(lengths, schedule.original_lengths):
        raise ScheduleError("schedule was computed for different lengths than the ones given")


def check_limits(schedule: Schedule, expected: dict[str, int | None]) -> None:
    """Each given limit equals the schedule's."""
    for name, value in expected.items():
        if value is not None and check_positive_int(name, value) != getattr(schedule, name):
            raise ScheduleError(f"schedule has {name}={getattr(schedule, name)}, expected {value}")


def check_grid(schedule: Schedule) -> None:
    """``num_microbatches`` rounds of ``dp_size`` 1-D int64 id arrays."""
    if len(schedule.assignment) != schedule.num_microbatches:
        raise ScheduleError(
            f"assignment has {len(schedule.assignment)} microbatch rounds but "
            f"num_microbatches={schedule.num_microbatches}"
        )
    if schedule.num_microbatches < 0:
        raise ScheduleError(f"num_microbatches={schedule.num_microbatches} is negative")
    for m, row in enumerate(schedule.assignment):
        if len(row) != schedule.dp_size:
            raise ScheduleError(f"microbatch {m} has {len(row)} replicas, expected dp_size={schedule.dp_size}")
        for d, ids in enumerate(row):
            if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
                got = f"{ids.dtype} {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
                raise ScheduleError(f"assignment[{m}][{d}] must be a 1-D int64 array, got {got}")


def check_ids_in_range(schedule: Schedule) -> None:
    """Assigned, deferred and dropped ids are sample ids ``0..N-1``."""
    n = schedule.num_sequences
    ids, cell, _ = schedule._flat
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
        m, d = divmod(int(cell[bad]), schedule.dp_size)
        raise ScheduleError(f"assignment[{m}][{d}] holds an id outside 0..{n - 1}")
    for name in ("deferred", "dropped"):
        extra = getattr(schedule, name)
        if extra.size and (extra.min() < 0 or extra.max() >= n):
            raise ScheduleError(f"{name} holds an id outside 0..{n - 1}")


def check_exactly_once(schedule: Schedule) -> None:
    """Every sample appears exactly once in assignment, deferred or dropped."""
    n = schedule.num_sequences
    if not n:
        return
    seen = np.bincount(schedule._flat[0], minlength=n)
    for extra in (schedule.deferred, schedule.dropped):
        seen = seen + np.bincount(extra, minlength=n)
    if seen.max(initial=0) > 1:
        dup = int(np.flatnonzero(seen > 1)[0])
        raise ScheduleError(f"sample {dup} appears {int(seen[dup])} times in the schedule")
    if seen.min(initial=1) < 1:
        missing = int(np.flatnonzero(seen == 0)[0])
        raise ScheduleError(f"sample {missing} appears nowhere in the schedule (assignment, deferred or dropped)")


def check_origin(schedule: Schedule) -> None:
    """One DP rank in ``0..dp_size-1`` per sample."""
    origin, n = schedule.origin, schedule.num_sequences
    if origin is None or origin.shape != schedule.original_lengths.shape:
        raise ScheduleError(f"origin must hold one DP rank per sample ({n}), got {origin!r:.80}")
    if n and (origin.min() < 0 or origin.max() >= schedule.dp_size):
        bad = int(np.flatnonzero((origin < 0) | (origin >= schedule.dp_size))[0])
        raise ScheduleError(f"origin of sample {bad} is DP rank {int(origin[bad])}, outside 0..{schedule.dp_size - 1}")


def check_scheduled_lengths(schedule: Schedule) -> None:
    """Scheduled lengths: at most the original, positive when assigned, 0 when dropped, and
    changed only for truncated or dropped samples."""
    lengths, original = schedule.lengths, schedule.original_lengths
    if lengths.shape != original.shape:
        raise ScheduleError("schedule lengths and original lengths differ in shape")
    if np.any(lengths > original) or np.any(lengths < 0):
        raise ScheduleError("a scheduled length exceeds its original length or is negative")
    ids = schedule._flat[0]
    if ids.size and lengths[ids].min() < 1:
        bad = int(ids[np.argmin(lengths[ids])])
        raise ScheduleError(f"sample {bad} is assigned with length {int(lengths[bad])}")
    if schedule.dropped.size and np.any(lengths[schedule.dropped] != 0):
        raise ScheduleError("a dropped sample keeps a non-zero length")
    changed = np.flatnonzero(lengths != original)
    allowed = np.union1d(schedule.truncated, schedule.dropped)
    if not np.isin(changed, allowed).all():
        bad = int(changed[~np.isin(changed, allowed)][0])
        raise ScheduleError(f"sample {bad} is packed with a changed length but is neither truncated nor dropped")


def check_capacity(schedule: Schedule) -> None:
    """The padded tokens of every microbatch fit ``capacity``."""
    if not schedule.num_microbatches:
        return
    tokens = schedule.microbatch_tokens(padded=True)
    over = np.argwhere(tokens > schedule.capacity)
    if over.size:
        m, d = (int(v) for v in over[0])
        raise ScheduleError(
            f"microbatch {m} of replica {d} holds {int(tokens[m, d])} padded tokens > capacity "
            f"{schedule.capacity} (max_tokens_per_rank={schedule.max_tokens_per_rank} x cp_size={schedule.cp_size})"
        )
