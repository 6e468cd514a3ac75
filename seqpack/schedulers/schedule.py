"""The :class:`Schedule` a scheduler returns and the :class:`ScheduleLimits` it was made for
(docs/schedulers.md, "The Schedule"). Ranks are DP-major: rank ``d * cp_size + k`` is CP rank
``k`` of replica ``d``; a static plan's group ``m * dp_size + d`` is microbatch ``m`` of replica ``d``."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import typing
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.options import GroupSizes, TailPadding
from seqpack.schedulers import schedule_checks
from seqpack.schedulers.request import _empty, as_lengths, check_origin, default_origin
from seqpack.schedulers.shape_limits import group_buckets
from seqpack.thd import group_padded_lengths, padded_lengths
from seqpack.thd.padding import group_pad_multiples
from seqpack.validation import check_choice, int64_array

if typing.TYPE_CHECKING:
    from seqpack.thd import StaticShapes

__all__ = ["Schedule", "ScheduleLimits"]

_GROUP_SIZES = tuple(GroupSizes)  # wire code: the index


@dataclasses.dataclass(frozen=True)
class ScheduleLimits:
    """The sizes a schedule was made for, in their wire order (:meth:`to_array`)."""

    num_microbatches: int
    dp_size: int
    cp_size: int
    max_tokens_per_rank: int
    pad_multiple: int
    group_sizes: GroupSizes = GroupSizes.STATIC

    def to_array(self) -> np.ndarray:
        """The limits as int64 ``[6]``, in field order (``group_sizes`` as its index in
        :class:`~seqpack.options.GroupSizes`)."""
        values = [getattr(self, f.name) for f in dataclasses.fields(self)][:-1]
        return np.array([*values, _GROUP_SIZES.index(self.group_sizes)], dtype=np.int64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> ScheduleLimits:
        """Inverse of :meth:`to_array`.

        Raises:
            ScheduleError: Not one value per field, or an unknown group-sizes code.
        """
        fields = dataclasses.fields(cls)
        if values.shape != (len(fields),):
            raise ScheduleError(
                f"schedule limits must hold {len(fields)} values ({', '.join(f.name for f in fields)}), "
                f"got {values.tolist()}"
            )
        code = int(values[-1])
        if not 0 <= code < len(_GROUP_SIZES):
            raise ScheduleError(f"schedule group_sizes code {code} is not one of 0..{len(_GROUP_SIZES) - 1}")
        m, dp, cp, per_rank, pad = (int(v) for v in values[:-1])
        return cls(m, dp, cp, per_rank, pad, _GROUP_SIZES[code])


class Grid(Sequence[list[np.ndarray]]):
    """A static plan's grid held flat: ``ids`` cell after cell, cell ``m * dp_size + d`` holding
    ``counts[m * dp_size + d]`` of them in pack order; reads as ``grid[m][d]`` (views of ``ids``)."""

    def __init__(self, ids: np.ndarray, counts: np.ndarray, dp_size: int) -> None:
        self.ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        self.counts = np.ascontiguousarray(counts, dtype=np.int64).reshape(-1)
        self.dp_size = int(dp_size)
        if self.dp_size < 1 or self.counts.shape[0] % self.dp_size or int(self.counts.sum()) != self.ids.shape[0]:
            raise ScheduleError(
                f"a grid of {self.counts.shape[0]} cells holding {int(self.counts.sum())} ids does not hold "
                f"{self.ids.shape[0]} ids in rows of dp_size={dp_size}"
            )
        self._ends = np.cumsum(self.counts)

    def __len__(self) -> int:
        return self.counts.shape[0] // self.dp_size

    @typing.overload
    def __getitem__(self, index: int) -> list[np.ndarray]: ...
    @typing.overload
    def __getitem__(self, index: slice) -> list[list[np.ndarray]]: ...
    def __getitem__(self, index: int | slice) -> list[np.ndarray] | list[list[np.ndarray]]:
        if isinstance(index, slice):
            return [self[m] for m in range(len(self))[index]]
        m = range(len(self))[index]  # IndexError past the rows, negative indices from the end
        ends = self._ends[m * self.dp_size : (m + 1) * self.dp_size].tolist()
        starts = [ends[0] - int(self.counts[m * self.dp_size]), *ends[:-1]]
        return [self.ids[a:b] for a, b in zip(starts, ends, strict=True)]


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Where every sequence of one step goes, and on which ranks (the fields: docs/schedulers.md).

    Groups are listed round by round, within a round by first rank; group ``g`` packs
    ``assigned[offsets[g]:offsets[g+1]]``. ``origin`` (default: contiguous equal blocks) and
    ``sample_cost`` are not part of the fingerprint, nor ``sample_cost`` of :meth:`to_arrays`.
    Arrays are never written after construction (``dataclasses.replace`` makes a new schedule).
    """

    num_microbatches: int
    group_round: np.ndarray
    group_start: np.ndarray
    group_size: np.ndarray
    group_counts: np.ndarray
    assigned: np.ndarray
    lengths: np.ndarray
    original_lengths: np.ndarray
    dp_size: int
    cp_size: int
    max_tokens_per_rank: int
    pad_multiple: int
    group_sizes: GroupSizes = GroupSizes.STATIC
    deferred: np.ndarray = dataclasses.field(default_factory=_empty)
    dropped: np.ndarray = dataclasses.field(default_factory=_empty)
    truncated: np.ndarray = dataclasses.field(default_factory=_empty)
    origin: np.ndarray | None = None
    sample_cost: np.ndarray | None = None

    # Arrays of :meth:`to_arrays`, in wire order after ``limits``.
    ARRAY_FIELDS: ClassVar[tuple[str, ...]] = (
        "original_lengths",
        "lengths",
        "group_round",
        "group_start",
        "group_size",
        "group_counts",
        "assigned",
        "deferred",
        "dropped",
        "truncated",
        "origin",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_sizes", check_choice("group_sizes", self.group_sizes, GroupSizes))
        if self.origin is None:
            object.__setattr__(self, "origin", default_origin(self.num_sequences, max(self.dp_size, 1)))

    @classmethod
    def from_assignment(
        cls,
        assignment: Sequence[Sequence[np.ndarray | Sequence[int]]],
        *,
        lengths: np.ndarray,
        original_lengths: np.ndarray,
        dp_size: int,
        cp_size: int,
        max_tokens_per_rank: int,
        pad_multiple: int,
        deferred: np.ndarray | None = None,
        dropped: np.ndarray | None = None,
        truncated: np.ndarray | None = None,
        origin: np.ndarray | None = None,
        sample_cost: np.ndarray | None = None,
    ) -> Schedule:
        """A static plan from its grid: ``assignment[m][d]`` the ids (in pack order) of microbatch
        ``m`` of replica ``d`` (a :class:`Grid` of ``dp_size`` is taken flat, as it is).

        Raises:
            ScheduleError: A round that does not list ``dp_size`` replicas.
        """
        if isinstance(assignment, Grid) and assignment.dp_size == dp_size:
            num_rounds, counts, assigned = len(assignment), assignment.counts, assignment.ids
        else:
            rows = list(assignment)
            for m, row in enumerate(rows):
                if len(row) != dp_size:
                    raise ScheduleError(f"microbatch {m} has {len(row)} replicas, expected dp_size={dp_size}")
            cells = [np.ascontiguousarray(ids, dtype=np.int64).reshape(-1) for row in rows for ids in row]
            counts = np.fromiter((c.shape[0] for c in cells), dtype=np.int64, count=len(cells))
            num_rounds, assigned = len(rows), np.concatenate(cells) if cells else _empty()
        g = np.arange(num_rounds * dp_size, dtype=np.int64)  # group m * dp + d: replica d's CP block
        return cls(
            num_microbatches=num_rounds,
            group_round=g // dp_size,
            group_start=g % dp_size * cp_size,
            group_size=np.full(g.shape[0], cp_size, dtype=np.int64),
            group_counts=counts,
            assigned=assigned,
            lengths=lengths,
            original_lengths=original_lengths,
            dp_size=dp_size,
            cp_size=cp_size,
            max_tokens_per_rank=max_tokens_per_rank,
            pad_multiple=pad_multiple,
            deferred=_empty() if deferred is None else deferred,
            dropped=_empty() if dropped is None else dropped,
            truncated=_empty() if truncated is None else truncated,
            origin=origin,
            sample_cost=sample_cost,
        )

    # -- shape -----------------------------------------------------------------------------
    @property
    def limits(self) -> ScheduleLimits:
        """The limits the schedule was made for (the head of :meth:`to_arrays`)."""
        return ScheduleLimits(*(getattr(self, f.name) for f in dataclasses.fields(ScheduleLimits)))

    @property
    def is_static(self) -> bool:
        """Whether every group is a replica's CP block (``group_sizes="static"``)."""
        return self.group_sizes == GroupSizes.STATIC

    @property
    def capacity(self) -> int:
        """Padded tokens a static microbatch may hold: ``max_tokens_per_rank * cp_size``."""
        return self.max_tokens_per_rank * self.cp_size

    @property
    def num_ranks(self) -> int:
        """``R = dp_size * cp_size``: the ranks every round partitions."""
        return self.dp_size * self.cp_size

    @property
    def num_groups(self) -> int:
        return int(self.group_size.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.original_lengths.shape[0])

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """int64 ``[G+1]``: group ``g``'s ids are ``assigned[offsets[g]:offsets[g+1]]``."""
        return np.concatenate([[0], np.cumsum(self.group_counts)]).astype(np.int64)

    @functools.cached_property
    def group_of(self) -> np.ndarray:
        """int64, one per entry of :attr:`assigned`: the group it is packed in."""
        return np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_counts)

    def group_ids(self, group: int) -> np.ndarray:
        """The ids group ``group`` packs, in pack order."""
        return self.assigned[self.offsets[group] : self.offsets[group + 1]]

    def round_groups(self, round_index: int) -> range:
        """Indices of the groups of round ``round_index`` (ordered by first rank)."""
        lo, hi = np.searchsorted(self.group_round, [round_index, round_index + 1])
        return range(int(lo), int(hi))

    def rank_group(self) -> np.ndarray:
        """int64 ``[num_microbatches, R]``: the group each rank belongs to in each round."""
        return np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_size).reshape(
            self.num_microbatches, self.num_ranks
        )

    def leading_replica(self) -> np.ndarray:
        """int64 ``[G]``: the DP replica whose CP block holds each group's first rank."""
        return self.group_start // max(self.cp_size, 1)

    @functools.cached_property
    def assignment(self) -> list[list[np.ndarray]]:
        """``assignment[m][d]``: the ids of round ``m`` packed by the groups that start in
        replica ``d``'s CP block, group after group (a static plan: microbatch ``m`` of ``d``)."""
        if self.is_static:  # group m * dp + d is the cell
            cells = np.split(self.assigned, self.offsets[1:-1]) if self.num_groups else []
            return [cells[m * self.dp_size : (m + 1) * self.dp_size] for m in range(self.num_microbatches)]
        grid: list[list[list[np.ndarray]]] = [[[] for _ in range(self.dp_size)] for _ in range(self.num_microbatches)]
        for g, (m, d) in enumerate(zip(self.group_round.tolist(), self.leading_replica().tolist(), strict=True)):
            grid[m][d].append(self.group_ids(g))
        return [[parts[0] if len(parts) == 1 else np.concatenate(parts or [_empty()]) for parts in row] for row in grid]

    # -- padding and tokens ----------------------------------------------------------------
    def padded_assigned(self) -> np.ndarray:
        """int64, one per entry of :attr:`assigned`: its padded length in its group."""
        lengths = self.lengths[self.assigned]
        if self.is_static:
            return padded_lengths(lengths, self.pad_multiple)
        return group_padded_lengths(lengths, self.group_size[self.group_of], self.pad_multiple)

    def pad_multiples(self) -> np.ndarray:
        """int64, per global id: what its padded length is a multiple of in its group
        (:func:`~seqpack.thd.group_pad_multiple`)."""
        if self.is_static:
            return np.full(self.num_sequences, self.pad_multiple, dtype=np.int64)
        return group_pad_multiples(self.per_id(self.group_size), self.pad_multiple)

    def group_tokens(self, padded: bool = True) -> np.ndarray:
        """Tokens every group packs, int64 ``[G]`` (padded under its group's rule)."""
        per_seq = self.padded_assigned() if padded else self.lengths[self.assigned]
        sums = np.zeros(self.num_groups, dtype=np.int64)
        np.add.at(sums, self.group_of, per_seq)
        return sums

    def placement(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global id: its replica (:meth:`replica_of`), round and slot in its pack, -1 when not assigned."""
        slot = np.full(self.num_sequences, -1, dtype=np.int64)
        slot[self.assigned] = np.arange(self.assigned.shape[0], dtype=np.int64) - self.offsets[self.group_of]
        return self.replica_of(), self.per_id(self.group_round), slot

    def replica_of(self) -> np.ndarray:
        """Per global id: its group's :meth:`leading_replica` (static: its replica), -1 when not assigned."""
        return self.per_id(self.leading_replica())

    def packed_spans(self, static_shapes: StaticShapes | None = None) -> np.ndarray:
        """Tokens every sequence spans in its pack, int64 ``[N]`` (0 where not assigned): its
        padded length in its group, plus, under ``static_shapes`` with ``tail_padding="extend_last"``,
        the bucket's tail for each pack's last sequence."""
        spans = np.zeros(self.num_sequences, dtype=np.int64)
        spans[self.assigned] = self.padded_assigned()
        if static_shapes is None or static_shapes.tail_padding != TailPadding.EXTEND_LAST:
            return spans
        filled = self.group_counts > 0
        tokens = self.group_tokens()[filled]
        last = self.assigned[self.offsets[1:][filled] - 1]  # each pack's last sequence
        spans[last] += group_buckets(static_shapes, tokens, self.capacity) - tokens
        return spans

    def per_id(self, group_values: np.ndarray) -> np.ndarray:
        """int64, per global id: ``group_values`` of the group that packs it, -1 when not assigned."""
        out = np.full(self.num_sequences, -1, dtype=np.int64)
        out[self.assigned] = np.asarray(group_values, dtype=np.int64)[self.group_of]
        return out

    # -- wire ------------------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The schedule as flat int64 arrays (the wire): ``limits`` and :attr:`ARRAY_FIELDS`."""
        arrays = {name: np.ascontiguousarray(getattr(self, name), dtype=np.int64) for name in self.ARRAY_FIELDS}
        return {"limits": self.limits.to_array(), **arrays}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Schedule:
        """Inverse of :meth:`to_arrays`, copying every array (:meth:`validate` checks the invariants).

        Raises:
            SeqpackTypeError: ``arrays`` not a mapping.
            ScheduleError: Missing arrays, or arrays whose shapes, counts or origin do not add up.
        """
        if not isinstance(arrays, Mapping):
            raise SeqpackTypeError(f"schedule arrays must be a mapping, got {type(arrays).__name__}")
        missing = [k for k in ("limits", *cls.ARRAY_FIELDS) if k not in arrays]
        if missing:
            raise ScheduleError(f"schedule arrays are missing {missing}")
        got = {
            k: int64_array(f"schedule array {k!r}", arrays[k], error=ScheduleError).reshape(-1)
            for k in ("limits", *cls.ARRAY_FIELDS)
        }
        fields: dict[str, object] = {**dataclasses.asdict(ScheduleLimits.from_array(got.pop("limits"))), **got}
        plan = cls(**fields)  # type: ignore[arg-type]
        schedule_checks.check_arrays(plan)
        check_origin(plan.origin, plan.num_sequences, plan.dp_size, ScheduleError)
        return plan

    def fingerprint(self) -> int:
        """A 63-bit hash of the schedule, equal on ranks that computed the same one; hashed at
        the first call only (a pickled schedule carries it)."""
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> int:
        return _digest(self)

    # -- invariants ------------------------------------------------------------------------
    def validate(
        self,
        lengths: Sequence[int] | np.ndarray | None = None,
        *,
        dp_size: int | None = None,
        cp_size: int | None = None,
        max_tokens_per_rank: int | None = None,
        pad_multiple: int | None = None,
        static_shapes: StaticShapes | None = None,
    ) -> None:
        """Raise :class:`~seqpack.errors.ScheduleError` naming the first violated invariant
        (:mod:`~seqpack.schedulers.schedule_checks`; docs/schedulers.md): the given lengths and
        limits match the plan's; with ``static_shapes`` (a static plan) every microbatch fits them."""
        expected = {"dp_size": dp_size, "cp_size": cp_size, "max_tokens_per_rank": max_tokens_per_rank}
        expected["pad_multiple"] = pad_multiple
        schedule_checks.check_all(self, None if lengths is None else as_lengths(lengths), expected)
        if static_shapes is not None:
            schedule_checks.check_static_shapes(self, static_shapes)


def _digest(plan: Schedule) -> int:
    """:meth:`Schedule.fingerprint`: blake2b of ``to_arrays()`` but ``origin``, each array with its name and length."""
    digest = hashlib.blake2b(digest_size=8)
    for name, array in plan.to_arrays().items():
        if name == "origin":
            continue
        digest.update(name.encode())
        digest.update(np.int64(array.shape[0]).tobytes())
        digest.update(array.tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1
