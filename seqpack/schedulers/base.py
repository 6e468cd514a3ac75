"""The scheduler base classes.

A scheduler turns one step's lengths into a :class:`~seqpack.schedulers.schedule.Schedule`
(:meth:`Scheduler.schedule`). :class:`GridScheduler` is the base of the static-CP planners
(``balanced``, ``dp_balanced``, ``empty``, yours): they place ids into ``num_microbatches x
dp_size`` microbatches (:meth:`GridScheduler._plan`) and it builds the schedule. The checks
before planning live in :mod:`seqpack.schedulers.request`, the step time in
:mod:`seqpack.schedulers.step_time`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from seqpack.cost import CostModel, GroupCost
from seqpack.options import GroupSizes, Sync
from seqpack.schedulers.request import (
    apply_oversize,
    as_lengths,
    as_origin,
    check_request,
    check_step_tokens,
)
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.static_limits import BucketPrice, bucket_capacity, fit_sequence_limit, trim_to_buckets
from seqpack.thd import padded_lengths
from seqpack.thd.static_shapes import StaticShapes, as_static_shapes
from seqpack.validation import check_choice, check_number, check_positive_int

__all__ = ["GridScheduler", "Scheduler"]


class Scheduler(ABC):
    """Turns one step's lengths into a :class:`Schedule`: pure and deterministic (same
    input, same output, on every rank).

    Subclasses implement :meth:`schedule`; static-CP planners subclass
    :class:`GridScheduler` and implement its ``_plan`` instead.
    """

    name: ClassVar[str] = ""
    uses_sync: ClassVar[bool] = False
    """Whether the scheduler plans for ``sync`` (schedulers that choose the microbatch count
    for a predicted step time); others plan the same for every sync."""
    uses_bytes_per_token: ClassVar[bool] = False
    """Whether the scheduler takes ``bytes_per_token`` (schedulers that weigh the bytes a
    plan keeps from crossing the network against their own plan time)."""

    @abstractmethod
    def schedule(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: CostModel | GroupCost | None = None,
        on_oversize: str = "error",
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str = Sync.LOCKSTEP,
        bytes_per_token: float | None = None,
        static_shapes: StaticShapes | None = None,
    ) -> Schedule:
        """Assign every sequence to a microbatch and the ranks that run it.

        Args:
            lengths: int64 ``[N]`` real lengths in global order (DP rank 0's samples first).
            dp_size: Data-parallel replicas.
            cp_size: Context-parallel ranks per replica; a static microbatch holds up to
                ``max_tokens_per_rank * cp_size`` padded tokens.
            max_tokens_per_rank: Token capacity of one rank for one microbatch.
            pad_multiple: Every sequence is padded to a multiple of this (a dynamic-CP
                group of ``c > 1`` ranks to ``2 * c`` times it).
            cost: Cost model: a :class:`~seqpack.cost.CostModel` (a microbatch's cost on a
                static CP group) or a :class:`~seqpack.cost.GroupCost` (CP ring included).
            on_oversize: ``"error"`` (default), ``"truncate"`` or ``"drop"`` for sequences
                longer than the largest microbatch.
            origin: DP rank each sample currently sits on (default: ``N`` split into
                ``dp_size`` contiguous, equal blocks). Schedulers may use it to keep samples
                where they are; ``"empty"`` never moves them.
            sync: What a step waits for, so what the scheduler minimises
                (:func:`~seqpack.schedulers.predicted_step_time`): ``"lockstep"`` (FSDP,
                pipeline: every microbatch round waits for its slowest group), ``"replica"``
                (DDP, ZeRO-1: the slowest rank's total), or ``None`` (the scheduler's
                default; ``balanced`` then minimises the sum of both).
            bytes_per_token: Bytes a sample's token carries through the exchange (the wrapper
                passes its samples'; ``None``: 20, token ids, labels and a loss mask), for
                schedulers that weigh it against their plan time (``balanced``'s locality).
            static_shapes: Fixed pack shapes (:class:`~seqpack.thd.StaticShapes`, the
                packer's): no microbatch holds more than its ``max_real_sequences``
                sequences or more padded tokens than its largest bucket (hard limits, like
                the capacity; :mod:`seqpack.schedulers.static_limits`). ``None``: no limit.

        Raises:
            ValueError: Bad sizes, non-positive lengths, or an oversize sequence under
                ``on_oversize="error"``.
        """

    @property
    def group_sizes(self) -> GroupSizes:
        """The CP groups this scheduler's plans use (:class:`~seqpack.options.GroupSizes`):
        ``"static"`` (every microbatch on one replica's CP block), or a dynamic-CP rule."""
        return GroupSizes.STATIC

    def longest_sequence(self, dp_size: int, cp_size: int, max_tokens_per_rank: int, pad_multiple: int) -> int:
        """The longest sequence this scheduler's plans hold (what ``on_oversize="truncate"``
        cuts a longer one to): the most a static microbatch of ``max_tokens_per_rank *
        cp_size`` tokens holds once padded to ``pad_multiple``."""
        return (max_tokens_per_rank * cp_size // pad_multiple) * pad_multiple

    def resolve_cost(self, cost: CostModel | GroupCost | None) -> CostModel | GroupCost | None:
        """The cost model this scheduler balances for ``cost``; pass it to
        ``StepStats.from_schedule`` so stats are in the units the schedule was balanced in.
        Schedulers that ignore cost return ``cost`` unchanged."""
        return cost

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GridScheduler(Scheduler):
    """A static-CP planner: every microbatch runs on one DP replica's CP block.

    :meth:`schedule` validates its arguments, applies the oversize policy and hands the
    remaining ids to :meth:`_plan`, which places them into ``num_microbatches`` rounds of
    ``dp_size`` microbatches. A :class:`~seqpack.cost.GroupCost` is balanced as its cost on
    the static group (:meth:`~seqpack.cost.GroupCost.at` ``cp_size``).
    """

    def schedule(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        dp_size: int,
        cp_size: int = 1,
        max_tokens_per_rank: int,
        pad_multiple: int = 1,
        cost: CostModel | GroupCost | None = None,
        on_oversize: str = "error",
        origin: Sequence[int] | np.ndarray | None = None,
        sync: str = Sync.LOCKSTEP,
        bytes_per_token: float | None = None,
        static_shapes: StaticShapes | None = None,
    ) -> Schedule:
        """A static plan (:meth:`Scheduler.schedule`)."""
        original = as_lengths(lengths)
        dp_size = check_positive_int("dp_size", dp_size)
        cp_size = check_positive_int("cp_size", cp_size)
        max_tokens_per_rank = check_positive_int("max_tokens_per_rank", max_tokens_per_rank)
        pad_multiple = check_positive_int("pad_multiple", pad_multiple)
        sync = check_choice("sync", sync, Sync)
        if isinstance(cost, GroupCost):
            cost = cost.at(cp_size)
        capacity = max_tokens_per_rank * cp_size
        shapes = as_static_shapes(static_shapes)
        if shapes is not None:
            capacity = bucket_capacity(shapes, capacity)
        check_request(original.shape[0], dp_size=dp_size, cp_size=cp_size, capacity=capacity, cost=cost)
        effective, dropped, truncated = apply_oversize(original, capacity, pad_multiple, on_oversize)
        check_step_tokens(effective, pad_multiple)
        origin_arr = as_origin(origin, original.shape[0], dp_size)
        active = np.flatnonzero(effective > 0).astype(np.int64)
        options = self._plan_options(sync, bytes_per_token)
        if shapes is not None and self.uses_static_shapes:
            options["static_shapes"] = shapes
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
        if shapes is not None:
            rounds = self._fit_static_shapes(
                rounds, shapes, padded_lengths(effective, pad_multiple), capacity, cost, sync
            )
        return Schedule.from_assignment(
            rounds,
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

    def _fit_static_shapes(
        self,
        rounds: Sequence[Sequence[np.ndarray]],
        shapes: StaticShapes,
        padded: np.ndarray,
        capacity: int,
        cost: CostModel | None,
        sync: str,
    ) -> Sequence[Sequence[np.ndarray]]:
        """``rounds`` within ``shapes``' sequence limit (:func:`fit_sequence_limit`), then, for
        schedulers that plan with the buckets, trimmed at bucket edges (:func:`trim_to_buckets`)."""
        weight = padded.astype(np.float64) if cost is None else cost.cost(padded)
        rounds = fit_sequence_limit(
            rounds,
            padded,
            weight,
            limit=shapes.max_real_sequences,
            capacity=capacity,
            keep_replica=self.keeps_origin,
            round_multiple=self._round_multiple(),
            fixed_rounds=self._fixed_rounds(),
        )
        model = self.resolve_cost(cost)
        price = None if not isinstance(model, CostModel) else BucketPrice.of(shapes, capacity, model.linear)
        if self.uses_static_shapes and price is not None and isinstance(model, CostModel):
            rounds = trim_to_buckets(
                rounds,
                padded,
                model.cost(padded),
                price=price,
                limit=shapes.max_real_sequences,
                capacity=capacity,
                constant=model.constant,
                sync=sync,
            )
        return rounds

    keeps_origin: ClassVar[bool] = False
    """Whether every sample stays on the DP rank that read it (``"empty"``): the
    ``static_shapes`` repair then moves sequences only between its own microbatches."""
    uses_static_shapes: ClassVar[bool] = False
    """Whether :meth:`_plan` takes ``static_shapes`` (plans for its limits and bucket
    padding itself; its plan is then trimmed to the buckets,
    :func:`~seqpack.schedulers.static_limits.trim_to_buckets`); every grid plan is repaired
    to its limits anyway."""

    def _round_multiple(self) -> int:
        """The multiple the microbatch count keeps (rounds the ``static_shapes`` repair adds
        come in multiples of it)."""
        return int(getattr(self, "microbatch_multiple", 1))

    def _fixed_rounds(self) -> int | None:
        """A microbatch count the plan must keep (the repair may not add rounds), or None."""
        return None

    def _plan_options(self, sync: str, bytes_per_token: float | None) -> dict[str, object]:
        """The keywords :meth:`_plan` takes besides the request (``uses_sync``,
        ``uses_bytes_per_token``), ``bytes_per_token`` checked.

        Raises:
            ConfigError: ``bytes_per_token`` negative or not finite. SeqpackTypeError: Not a number.
        """
        options: dict[str, object] = {"sync": sync} if self.uses_sync else {}
        if bytes_per_token is not None:
            bytes_per_token = check_number("bytes_per_token", bytes_per_token, minimum=0.0)
        if self.uses_bytes_per_token:
            options["bytes_per_token"] = bytes_per_token
        return options

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
    ) -> tuple[Sequence[Sequence[np.ndarray]], np.ndarray]:
        """Return (``rounds[m][d]`` id arrays, deferred ids) for ``ids`` with ``lengths``
        (``origin[i]``: DP rank holding ``ids[i]``). Every padded microbatch must fit
        ``capacity``; every round must list ``dp_size`` arrays (empty ones allowed)."""
