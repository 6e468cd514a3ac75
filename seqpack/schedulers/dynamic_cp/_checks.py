"""The invariants of a :class:`~seqpack.schedulers.dynamic_cp.plan.DynamicCpSchedule`, one
check each; ``DynamicCpSchedule.validate`` runs them in this order (later checks trust the
shapes the earlier ones established)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from seqpack.errors import ScheduleError
from seqpack.schedulers.dynamic_cp.padding import GroupSizes, group_padded_lengths
from seqpack.validation import check_positive_int

if TYPE_CHECKING:
    from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule


def check_limits(
    plan: DynamicCpSchedule, lengths: Sequence[int] | np.ndarray | None, expected: Mapping[str, int | None]
) -> None:
    """The plan was made for ``lengths`` and for every limit given in ``expected``."""
    if lengths is not None:
        given = np.asarray(lengths)
        if given.shape != plan.original_lengths.shape or not np.array_equal(given, plan.original_lengths):
            raise ScheduleError("dynamic CP plan was computed for different lengths than the ones given")
    for name, value in expected.items():
        if value is not None and check_positive_int(name, value) != getattr(plan, name):
            raise ScheduleError(f"dynamic CP plan has {name}={getattr(plan, name)}, expected {value}")
    for name in ("dp_size", "cp_size", "max_tokens_per_rank", "pad_multiple"):
        check_positive_int(name, getattr(plan, name))
    if plan.num_rounds < 0:
        raise ScheduleError(f"num_rounds={plan.num_rounds} is negative")


def check_arrays(plan: DynamicCpSchedule) -> None:
    """Every array is 1-D int64 and the group arrays have one entry per group."""
    for name in plan.ARRAY_FIELDS:
        array = getattr(plan, name)
        if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != 1:
            got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
            raise ScheduleError(f"dynamic CP plan {name} must be a 1-D int64 array, got {got}")
    groups = plan.group_size.shape[0]
    for name in ("group_round", "group_start", "group_counts"):
        if getattr(plan, name).shape[0] != groups:
            count = getattr(plan, name).shape[0]
            raise ScheduleError(f"dynamic CP plan {name} holds {count} entries for {groups} groups")
    if plan.group_counts.size and plan.group_counts.min() < 0:
        raise ScheduleError("dynamic CP plan group_counts holds a negative count")
    if int(plan.group_counts.sum()) != plan.assigned.shape[0]:
        raise ScheduleError(
            f"dynamic CP plan group_counts sum to {int(plan.group_counts.sum())} "
            f"but {plan.assigned.shape[0]} ids are assigned"
        )
    if plan.lengths.shape != plan.original_lengths.shape:
        raise ScheduleError("dynamic CP plan lengths and original lengths differ in shape")
    origin = plan.origin
    assert origin is not None  # filled in __post_init__
    if origin.shape != plan.original_lengths.shape or (
        origin.size and (origin.min() < 0 or origin.max() >= plan.dp_size)
    ):
        raise ScheduleError(f"dynamic CP plan origin must hold one DP rank in 0..{plan.dp_size - 1} per id")


def check_partition(plan: DynamicCpSchedule) -> None:
    """Rounds run 0..num_rounds-1 in order; the groups of each round are contiguous blocks
    that start at rank 0 and end at rank R; under ``"pow2"`` each is a power of two on an
    aligned start (``start % size == 0``) or the whole R."""
    rounds, start, size = plan.group_round, plan.group_start, plan.group_size
    ranks = plan.num_ranks
    if size.size and size.min() < 1:
        raise ScheduleError(f"group {int(np.argmin(size))} has size {int(size.min())}; sizes must be >= 1")
    if rounds.size and (np.any(np.diff(rounds) < 0) or rounds.min() < 0 or rounds.max() >= plan.num_rounds):
        raise ScheduleError(f"group rounds must be sorted and within 0..{plan.num_rounds - 1}")
    present = np.unique(rounds)
    if present.shape[0] != plan.num_rounds:
        missing = sorted(set(range(plan.num_rounds)) - set(present.tolist()))
        raise ScheduleError(f"round {missing[0]} has no groups: every round must partition the {ranks} ranks")
    end = start + size
    first = np.ones(rounds.shape[0], dtype=bool)
    first[1:] = rounds[1:] != rounds[:-1]
    expected_start = np.where(first, 0, np.concatenate([[0], end[:-1]]))
    bad = np.flatnonzero(start != expected_start)
    if bad.size:
        g = int(bad[0])
        raise ScheduleError(
            f"group {g} of round {int(rounds[g])} starts at rank {int(start[g])}, expected {int(expected_start[g])}: "
            "the groups of a round must be contiguous blocks covering every rank once"
        )
    last = np.ones(rounds.shape[0], dtype=bool)
    last[:-1] = rounds[1:] != rounds[:-1]
    short = np.flatnonzero(last & (end != ranks))
    if short.size:
        g = int(short[0])
        raise ScheduleError(f"the groups of round {int(rounds[g])} end at rank {int(end[g])}, not at R={ranks}")
    if plan.group_sizes == GroupSizes.POW2:
        pow2 = (size & (size - 1)) == 0
        ok = (pow2 & (start % size == 0)) | (size == ranks)
        if not ok.all():
            g = int(np.flatnonzero(~ok)[0])
            raise ScheduleError(
                f"group {g} of round {int(rounds[g])} (ranks {int(start[g])}..{int(end[g]) - 1}, size {int(size[g])}) "
                "is not an aligned power-of-2 block nor the whole R, as group_sizes='pow2' requires"
            )


def check_exactly_once(plan: DynamicCpSchedule) -> None:
    """Every id appears exactly once in assigned, deferred or dropped."""
    n = plan.num_sequences
    seen = np.zeros(n, dtype=np.int64)
    for name in ("assigned", "deferred", "dropped"):
        ids = getattr(plan, name)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ScheduleError(f"dynamic CP plan {name} holds an id outside 0..{n - 1}")
        seen += np.bincount(ids, minlength=n)
    if n and seen.max() > 1:
        dup = int(np.argmax(seen > 1))
        raise ScheduleError(f"sample {dup} appears {int(seen[dup])} times in the dynamic CP plan")
    if n and seen.min() < 1:
        missing = int(np.argmin(seen))
        raise ScheduleError(f"sample {missing} appears nowhere in the dynamic CP plan (assigned, deferred or dropped)")


def check_lengths(plan: DynamicCpSchedule) -> None:
    """Packed lengths are the original ones unless truncated (shorter, still >= 1) or
    dropped (0)."""
    lengths, original = plan.lengths, plan.original_lengths
    if np.any(lengths > original) or np.any(lengths < 0):
        raise ScheduleError("a packed length exceeds its original length or is negative")
    if plan.assigned.size and lengths[plan.assigned].min() < 1:
        bad = int(plan.assigned[np.argmin(lengths[plan.assigned])])
        raise ScheduleError(f"sample {bad} is assigned with length {int(lengths[bad])}")
    if plan.dropped.size and np.any(lengths[plan.dropped] != 0):
        raise ScheduleError("a dropped sample keeps a non-zero length")
    changed = np.flatnonzero(lengths != original)
    allowed = np.union1d(plan.truncated, plan.dropped)
    stray = changed[~np.isin(changed, allowed)]
    if stray.size:
        bad = int(stray[0])
        raise ScheduleError(f"sample {bad} is packed with a changed length but is neither truncated nor dropped")


def check_capacity(plan: DynamicCpSchedule) -> None:
    """The padded tokens of every group fit ``size * max_tokens_per_rank``."""
    group_of = np.repeat(np.arange(plan.num_groups, dtype=np.int64), plan.group_counts)
    padded = group_padded_lengths(plan.lengths[plan.assigned], plan.group_size[group_of], plan.pad_multiple)
    tokens = np.bincount(group_of, weights=padded, minlength=plan.num_groups)
    over = np.flatnonzero(tokens > plan.group_size * plan.max_tokens_per_rank)
    if over.size:
        g = int(over[0])
        raise ScheduleError(
            f"group {g} of round {int(plan.group_round[g])} ({int(plan.group_size[g])} ranks) holds "
            f"{int(tokens[g])} padded tokens > capacity {int(plan.group_size[g]) * plan.max_tokens_per_rank} "
            f"({int(plan.group_size[g])} x max_tokens_per_rank={plan.max_tokens_per_rank})"
        )
