"""The plan of one dynamic-CP step: per microbatch round, the ranks split into CP groups.

The ``R = dp_size * cp_size`` ranks are numbered DP-major (rank ``d * cp_size + k`` is CP
rank ``k`` of DP replica ``d``, so a static CP group is the block ``[d*cp, (d+1)*cp)``). In
every round they are cut into contiguous blocks, the *groups*; each group runs one packed
microbatch whose sequences all use the group's size as their CP size (DualChunkSwap over
the group's ranks). A group of one rank is plain data parallelism.

Padding rule (:func:`cp_pad_multiple`): a sequence in a group of ``c > 1`` ranks is padded to
a multiple of ``2 * c * pad_multiple``: DualChunkSwap cuts it into ``2c`` chunks, and each
chunk is itself a multiple of ``pad_multiple``, so every rank's shard meets what
``pad_multiple`` asks of a whole sequence on one rank (TP under sequence parallelism, 16
under FP8). Alone (``c = 1``) it is padded to ``pad_multiple``. A group of ``c`` ranks holds
at most ``c * max_tokens_per_rank`` padded tokens, i.e. ``max_tokens_per_rank`` per rank.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.schedulers.dynamic_cp import _checks
from seqpack.schedulers.dynamic_cp.padding import GroupSizes, group_padded_lengths
from seqpack.validation import check_choice, int64_array

__all__ = ["DynamicCpSchedule"]

_EMPTY = np.zeros(0, dtype=np.int64)


def _int64(name: str, value: object) -> np.ndarray:
    """One array of :meth:`DynamicCpSchedule.from_arrays` as a flat int64 copy."""
    return int64_array(f"dynamic CP plan array {name!r}", value, error=ScheduleError).reshape(-1)


@dataclasses.dataclass(frozen=True, eq=False)
class DynamicCpSchedule:
    """Where every sequence of one step goes, and on which CP group.

    Groups are listed round by round, and within a round by their first rank; the groups
    of a round partition ``0..R-1`` (``R = dp_size * cp_size``). A group with no ids is an
    idle block (under lockstep it runs a padding-only filler).

    Attributes:
        num_rounds: Microbatch rounds of the step (every rank runs one microbatch per round).
        group_round, group_start, group_size: int64 ``[G]``: round, first rank and number of
            ranks of every group.
        group_counts: int64 ``[G]``: how many ids each group packs; the ids of group ``g``
            are ``assigned[offsets[g]:offsets[g+1]]``, in pack order.
        assigned: int64: the packed ids, group after group.
        lengths: Token count each id is packed with (after truncation; 0 when dropped).
        original_lengths: Lengths as given to the planner.
        dp_size, cp_size, max_tokens_per_rank, pad_multiple: The limits it was made for.
        group_sizes: ``"pow2"`` (aligned powers of two, and the whole R) or ``"any"``.
        deferred, dropped, truncated: Ids held for the next step / removed / cut to fit.
        origin: DP rank holding each id before the step's exchange (default: ``N`` split into
            ``dp_size`` contiguous, equal blocks). On the wire, not in the fingerprint: the
            same placement is the same plan wherever samples came from.
    """

    num_rounds: int
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
    group_sizes: GroupSizes = GroupSizes.POW2
    deferred: np.ndarray = dataclasses.field(default_factory=_EMPTY.copy)
    dropped: np.ndarray = dataclasses.field(default_factory=_EMPTY.copy)
    truncated: np.ndarray = dataclasses.field(default_factory=_EMPTY.copy)
    origin: np.ndarray | None = None

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
    LIMITS: ClassVar[tuple[str, ...]] = (
        "num_rounds",
        "dp_size",
        "cp_size",
        "max_tokens_per_rank",
        "pad_multiple",
        "group_sizes",
    )
    _MODE_CODE: ClassVar[dict[str, int]] = {GroupSizes.POW2: 0, GroupSizes.ANY: 1}

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_sizes", check_choice("group_sizes", self.group_sizes, GroupSizes))
        if self.origin is None:
            n, dp = self.num_sequences, max(self.dp_size, 1)
            origin = np.minimum(np.arange(n, dtype=np.int64) * dp // max(n, 1), dp - 1)
            object.__setattr__(self, "origin", origin)

    # -- shape -----------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        """``R = dp_size * cp_size``: the ranks every round partitions."""
        return self.dp_size * self.cp_size

    @property
    def num_microbatches(self) -> int:
        """Microbatches every rank runs: :attr:`num_rounds` (the name ``Schedule`` uses)."""
        return self.num_rounds

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

    def group_ids(self, group: int) -> np.ndarray:
        """The ids group ``group`` packs, in pack order."""
        return self.assigned[self.offsets[group] : self.offsets[group + 1]]

    def round_groups(self, round_index: int) -> range:
        """Indices of the groups of round ``round_index`` (ordered by first rank)."""
        lo, hi = np.searchsorted(self.group_round, [round_index, round_index + 1])
        return range(int(lo), int(hi))

    def rank_group(self) -> np.ndarray:
        """int64 ``[num_rounds, R]``: the group each rank belongs to in each round."""
        return np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_size).reshape(
            self.num_rounds, self.num_ranks
        )

    def group_tokens(self, padded: bool = True) -> np.ndarray:
        """Tokens every group packs, int64 ``[G]`` (padded under its own size's rule)."""
        group_of = np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_counts)
        per_seq = self.lengths[self.assigned]
        if padded:
            per_seq = group_padded_lengths(per_seq, self.group_size[group_of], self.pad_multiple)
        return np.bincount(group_of, weights=per_seq, minlength=self.num_groups).astype(np.int64)

    def placement(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global id: its group, round and CP size (-1 when not assigned)."""
        group = np.full(self.num_sequences, -1, dtype=np.int64)
        group[self.assigned] = np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_counts)
        known = group >= 0
        rounds, sizes = np.full_like(group, -1), np.full_like(group, -1)
        rounds[known] = self.group_round[group[known]]  # a plan may have no group (every sequence dropped)
        sizes[known] = self.group_size[group[known]]
        return group, rounds, sizes

    # -- wire ------------------------------------------------------------------------------
    def limits(self) -> np.ndarray:
        """int64 ``[6]``: :attr:`LIMITS` (``group_sizes`` as 0 = pow2, 1 = any)."""
        values = [self.num_rounds, self.dp_size, self.cp_size, self.max_tokens_per_rank, self.pad_multiple]
        return np.array([*values, self._MODE_CODE[self.group_sizes]], dtype=np.int64)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The plan as flat int64 arrays (what travels on the wire); :meth:`from_arrays`
        inverts it."""
        out = {"limits": self.limits()}
        for name in self.ARRAY_FIELDS:
            out[name] = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> DynamicCpSchedule:
        """Rebuild a plan from :meth:`to_arrays` (copies every array; :meth:`validate`
        checks the invariants).

        Raises:
            ScheduleError: Missing arrays, or arrays whose shapes do not add up.
        """
        if not isinstance(arrays, Mapping):
            raise SeqpackTypeError(f"dynamic CP plan arrays must be a mapping, got {type(arrays).__name__}")
        missing = [k for k in ("limits", *cls.ARRAY_FIELDS) if k not in arrays and k != "origin"]
        if missing:
            raise ScheduleError(f"dynamic CP plan arrays are missing {missing}")
        limits = _int64("limits", arrays["limits"])
        if limits.shape[0] != len(cls.LIMITS):
            raise ScheduleError(f"dynamic CP plan limits must hold {len(cls.LIMITS)} values, got {limits.tolist()}")
        modes = {code: GroupSizes(mode) for mode, code in cls._MODE_CODE.items()}
        if int(limits[5]) not in modes:
            raise ScheduleError(f"dynamic CP plan group_sizes code {int(limits[5])} is not one of {sorted(modes)}")
        got = {k: _int64(k, arrays[k]) for k in cls.ARRAY_FIELDS if k in arrays}
        origin = got.pop("origin", None)
        if origin is not None and origin.shape[0] != got["original_lengths"].shape[0]:
            raise ScheduleError(
                f"dynamic CP plan origin holds {origin.shape[0]} ranks for {got['original_lengths'].shape[0]} ids"
            )
        groups = got["group_size"].shape[0]
        if any(got[k].shape[0] != groups for k in ("group_round", "group_start", "group_counts")):
            raise ScheduleError("dynamic CP plan group arrays differ in length")
        if int(got["group_counts"].sum()) != got["assigned"].shape[0]:
            raise ScheduleError(
                f"dynamic CP plan group_counts sum to {int(got['group_counts'].sum())} "
                f"but {got['assigned'].shape[0]} ids are assigned"
            )
        dp, cp, mtpr, pm = (int(v) for v in limits[1:5])
        return cls(
            int(limits[0]),
            dp_size=dp,
            cp_size=cp,
            max_tokens_per_rank=mtpr,
            pad_multiple=pm,
            group_sizes=modes[int(limits[5])],
            origin=origin,
            **got,
        )

    def fingerprint(self) -> int:
        """A 63-bit hash of the whole plan, equal on ranks that computed the same one."""
        digest = hashlib.blake2b(digest_size=8)
        for name, array in self.to_arrays().items():
            if name == "origin":  # where samples came from does not change the plan
                continue
            digest.update(name.encode())
            digest.update(np.int64(array.shape[0]).tobytes())
            digest.update(array.tobytes())
        return int.from_bytes(digest.digest(), "little") >> 1

    # -- invariants ------------------------------------------------------------------------
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

        The limits match; the groups of every round partition the ranks into contiguous
        blocks (aligned powers of two, or the whole R, under ``"pow2"``); every id appears
        exactly once in assigned, deferred or dropped; lengths changed only by truncation
        or dropping; the padded tokens of every group fit ``size * max_tokens_per_rank``.
        """
        expected = {
            "dp_size": dp_size,
            "cp_size": cp_size,
            "max_tokens_per_rank": max_tokens_per_rank,
            "pad_multiple": pad_multiple,
        }
        _checks.check_limits(self, lengths, expected)
        _checks.check_arrays(self)
        _checks.check_partition(self)
        _checks.check_exactly_once(self)
        _checks.check_lengths(self)
        _checks.check_capacity(self)
