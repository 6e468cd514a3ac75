"""The invariants of a :class:`~seqpack.schedulers.schedule.Schedule`, run in order by
:func:`check_all` (each trusts the shapes the earlier ones checked); each raises
:class:`~seqpack.errors.ScheduleError` naming the first thing it finds wrong."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.options import GroupSizes
from seqpack.schedulers.group_sizes import allowed_group_sizes
from seqpack.schedulers.request import check_origin
from seqpack.schedulers.shape_limits import resolved_buckets
from seqpack.thd.static_shapes import as_static_shapes
from seqpack.validation import check_positive_int

if TYPE_CHECKING:
    from seqpack.schedulers.schedule import Schedule
    from seqpack.thd.static_shapes import StaticShapes

__all__ = ["check_all", "check_static_shapes"]


def check_all(schedule: Schedule, lengths: np.ndarray | None, expected: dict[str, int | None]) -> None:
    """Every check below, in order: ``lengths`` (when given) and the ``expected`` limits
    (those not None) first, then the schedule's own consistency."""
    if lengths is not None and not np.array_equal(lengths, schedule.original_lengths):
        raise ScheduleError("schedule was computed for different lengths than the ones given")
    check_limits(schedule, expected)
    check_arrays(schedule)
    check_partition(schedule)
    check_exactly_once(schedule)
    check_origin(schedule.origin, schedule.num_sequences, schedule.dp_size, ScheduleError)
    check_scheduled_lengths(schedule)
    check_capacity(schedule)


def check_limits(schedule: Schedule, expected: dict[str, int | None]) -> None:
    """Each given limit equals the schedule's; the schedule's own are positive."""
    for name, value in expected.items():
        if value is not None and check_positive_int(name, value) != getattr(schedule, name):
            raise ScheduleError(f"schedule has {name}={getattr(schedule, name)}, expected {value}")
    for name in ("dp_size", "cp_size", "max_tokens_per_rank", "pad_multiple"):
        value = getattr(schedule, name)
        if not isinstance(value, int) or value < 1:
            raise ScheduleError(f"schedule has {name}={value!r}; it must be a positive int")
    if schedule.num_microbatches < 0:
        raise ScheduleError(f"num_microbatches={schedule.num_microbatches} is negative")


def check_arrays(schedule: Schedule) -> None:
    """Every array is 1-D int64; the group arrays hold one entry per group and their counts
    add up to the assigned ids."""
    for name in schedule.ARRAY_FIELDS:
        array = getattr(schedule, name)
        if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != 1:
            got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
            raise ScheduleError(f"schedule {name} must be a 1-D int64 array, got {got}")
    groups = schedule.num_groups
    for name in ("group_round", "group_start", "group_counts"):
        if getattr(schedule, name).shape[0] != groups:
            raise ScheduleError(f"schedule {name} holds {getattr(schedule, name).shape[0]} entries for {groups} groups")
    counts = schedule.group_counts
    if counts.size and counts.min() < 0:
        raise ScheduleError("schedule group_counts holds a negative count")
    if int(counts.sum()) != schedule.assigned.shape[0]:
        raise ScheduleError(
            f"schedule group_counts sum to {int(counts.sum())} but {schedule.assigned.shape[0]} ids are assigned"
        )
    if schedule.lengths.shape != schedule.original_lengths.shape:
        raise ScheduleError("schedule lengths and original lengths differ in shape")


def check_partition(schedule: Schedule) -> None:
    """Rounds run ``0..num_microbatches-1`` in order; the groups of each round are contiguous
    blocks from rank 0 to rank R; static: every round's groups are the replicas' CP blocks;
    ``"pow2"``: each an aligned power of two (``start % size == 0``) or the whole R."""
    rounds, start, size = schedule.group_round, schedule.group_start, schedule.group_size
    ranks, m_count = schedule.num_ranks, schedule.num_microbatches
    if size.size and size.min() < 1:
        raise ScheduleError(f"group {int(np.argmin(size))} has size {int(size.min())}; sizes must be >= 1")
    if rounds.size and (np.any(np.diff(rounds) < 0) or rounds.min() < 0 or rounds.max() >= m_count):
        raise ScheduleError(f"group rounds must be sorted and within 0..{m_count - 1}")
    missing = np.setdiff1d(np.arange(m_count), rounds)
    if missing.size:
        raise ScheduleError(f"round {missing[0]} has no groups: every round must partition the {ranks} ranks")
    end = start + size
    first = np.diff(rounds, prepend=-1) != 0  # the first group of its round (rounds are >= 0)
    expected_start = np.where(first, 0, np.concatenate([[0], end[:-1]]))
    bad = np.flatnonzero(start != expected_start)
    if bad.size:
        g = int(bad[0])
        raise ScheduleError(
            f"group {g} of round {int(rounds[g])} starts at rank {int(start[g])}, expected {int(expected_start[g])}: "
            "the groups of a round must be contiguous blocks covering every rank once"
        )
    last = np.append(first[1:], True)  # the last group of its round
    short = np.flatnonzero(last & (end != ranks))
    if short.size:
        g = int(short[0])
        raise ScheduleError(f"the groups of round {int(rounds[g])} end at rank {int(end[g])}, not at R={ranks}")
    if schedule.is_static:
        odd = np.flatnonzero(size != schedule.cp_size)
        if odd.size:
            g = int(odd[0])
            raise ScheduleError(
                f"group {g} of round {int(rounds[g])} has {int(size[g])} ranks: a static schedule's groups are the "
                f"replicas' CP blocks of cp_size={schedule.cp_size}"
            )
    elif schedule.group_sizes == GroupSizes.POW2:
        allowed = allowed_group_sizes(ranks, GroupSizes.POW2)
        ok = np.isin(size, allowed) & ((start % size == 0) | (size == ranks))
        if not ok.all():
            g = int(np.flatnonzero(~ok)[0])
            raise ScheduleError(
                f"group {g} of round {int(rounds[g])} (ranks {int(start[g])}..{int(end[g]) - 1}, size {int(size[g])}) "
                "is not an aligned power-of-2 block nor the whole R, as group_sizes='pow2' requires"
            )


def check_exactly_once(schedule: Schedule) -> None:
    """Every sample appears exactly once in assigned, deferred or dropped."""
    n = schedule.num_sequences
    seen = np.zeros(n, dtype=np.int64)
    for name in ("assigned", "deferred", "dropped"):
        ids = getattr(schedule, name)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad, where = int(np.flatnonzero((ids < 0) | (ids >= n))[0]), name
            if name == "assigned":  # its group (a static plan's as its cell)
                g = int(np.searchsorted(schedule.offsets, bad, side="right") - 1)
                m, d = divmod(g, schedule.dp_size)
                where = (
                    f"assignment[{m}][{d}]" if schedule.is_static else f"group {g} of round {schedule.group_round[g]}"
                )
            raise ScheduleError(f"{where} holds an id outside 0..{n - 1}")
        seen += np.bincount(ids, minlength=n)
    if n and seen.max() > 1:
        dup = int(np.argmax(seen > 1))
        raise ScheduleError(f"sample {dup} appears {int(seen[dup])} times in the schedule")
    if n and seen.min() < 1:
        missing = int(np.argmin(seen))
        raise ScheduleError(f"sample {missing} appears nowhere in the schedule (assigned, deferred or dropped)")


def check_scheduled_lengths(schedule: Schedule) -> None:
    """Scheduled lengths: at most the original, positive when assigned, 0 when dropped, and
    changed only for truncated or dropped samples."""
    lengths, original = schedule.lengths, schedule.original_lengths
    if np.any(lengths > original) or np.any(lengths < 0):
        raise ScheduleError("a scheduled length exceeds its original length or is negative")
    ids = schedule.assigned
    if ids.size and lengths[ids].min() < 1:
        bad = int(ids[np.argmin(lengths[ids])])
        raise ScheduleError(f"sample {bad} is assigned with length {int(lengths[bad])}")
    if schedule.dropped.size and np.any(lengths[schedule.dropped] != 0):
        raise ScheduleError("a dropped sample keeps a non-zero length")
    stray = np.setdiff1d(np.flatnonzero(lengths != original), np.union1d(schedule.truncated, schedule.dropped))
    if stray.size:
        raise ScheduleError(
            f"sample {int(stray[0])} is packed with a changed length but is neither truncated nor dropped"
        )


def check_capacity(schedule: Schedule) -> None:
    """The padded tokens of every group fit ``size * max_tokens_per_rank``."""
    tokens = schedule.group_tokens(padded=True)
    over = np.flatnonzero(tokens > schedule.group_size * schedule.max_tokens_per_rank)
    if not over.size:
        return
    g = int(over[0])
    size, cap = int(schedule.group_size[g]), int(schedule.group_size[g]) * schedule.max_tokens_per_rank
    if schedule.is_static:
        m, d = divmod(g, schedule.dp_size)
        raise ScheduleError(
            f"microbatch {m} of replica {d} holds {int(tokens[g])} padded tokens > capacity {cap} "
            f"(max_tokens_per_rank={schedule.max_tokens_per_rank} x cp_size={schedule.cp_size})"
        )
    raise ScheduleError(
        f"group {g} of round {int(schedule.group_round[g])} ({size} ranks) holds {int(tokens[g])} padded tokens > "
        f"capacity {cap} ({size} x max_tokens_per_rank={schedule.max_tokens_per_rank})"
    )


def check_static_shapes(schedule: Schedule, static_shapes: StaticShapes) -> None:
    """Every microbatch of a static plan fits ``static_shapes``' ``max_real_sequences`` and largest bucket.

    Raises:
        ScheduleError: A dynamic-CP plan, or the first microbatch past a limit.
        SeqpackTypeError: ``static_shapes`` not a :class:`~seqpack.thd.StaticShapes`.
    """
    shapes = as_static_shapes(static_shapes)
    assert shapes is not None
    if not schedule.is_static:
        raise ScheduleError("static_shapes holds for static-CP schedules only; this one is dynamic CP")
    limit, largest = shapes.max_real_sequences, resolved_buckets(shapes, schedule.capacity)[-1]
    counts, tokens = schedule.group_counts, schedule.group_tokens()
    for name, values, bound in (("sequences", counts, limit), ("padded tokens", tokens, largest)):
        over = np.flatnonzero(values > bound)
        if over.size:
            m, d = divmod(int(over[0]), schedule.dp_size)
            which = "max_real_sequences" if name == "sequences" else "the largest token bucket"
            raise ScheduleError(
                f"microbatch {m} of replica {d} holds {int(values[over[0]])} {name} > {bound} "
                f"({which} of static_shapes={shapes})"
            )
