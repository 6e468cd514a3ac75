"""The scheduler base classes: :class:`Scheduler` and :class:`GridScheduler`, the base of the
static-CP planners (``balanced``, ``dp_balanced``, ``empty``, yours; docs/schedulers.md)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from seqpack.cost import CostModel
from seqpack.options import GroupSizes, Sync
from seqpack.schedulers.request import Request, apply_static_oversize, check_capacity, check_step_tokens
from seqpack.schedulers.schedule import Grid, Schedule
from seqpack.schedulers.shape_limits import BucketPrice, fit_sequence_limit, trim_to_buckets
from seqpack.thd import padded_lengths
from seqpack.thd.static_shapes import StaticShapes

__all__ = ["GridScheduler", "Scheduler"]


class Scheduler(ABC):
    """Turns one step's lengths into a :class:`Schedule`, pure and deterministic (same input,
    same output, on every rank): subclasses implement :meth:`plan` of the checked :class:`Request`."""

    name: ClassVar[str] = ""
    group_sizes: GroupSizes = GroupSizes.STATIC
    """The rule of the CP groups this scheduler's plans use."""

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
        sync: str = Sync.LOCKSTEP,
        bytes_per_token: float | None = None,
        static_shapes: StaticShapes | None = None,
        sample_cost: Sequence[float] | np.ndarray | None = None,
    ) -> Schedule:
        """Assign every sequence to a microbatch and the ranks that run it: :meth:`plan` of
        the checked :meth:`Request.of <seqpack.schedulers.request.Request.of>` (docs/schedulers.md).

        Args:
            lengths: int64 ``[N]`` real lengths in global order (DP rank 0's samples first).
            max_tokens_per_rank: Padded tokens one rank holds in one microbatch.
            pad_multiple: Every sequence is padded to a multiple of this (a dynamic-CP
                group of ``c > 1`` ranks to ``2 * c`` times it).
            cost: A microbatch's cost on its CP group (:class:`~seqpack.cost.CostModel`).
            on_oversize: ``"error"``, ``"truncate"`` or ``"drop"`` a sequence too long for a microbatch.
            origin: DP rank each sample sits on (default: contiguous, equal blocks).
            sync: What the plan minimises: ``"lockstep"`` (every round's slowest group: FSDP,
                pipelines) or ``"replica"`` (the slowest rank's total: DDP, ZeRO-1).
            bytes_per_token: Bytes a token carries through the exchange (``None``: 20).
            static_shapes: Fixed pack shapes (:class:`~seqpack.thd.StaticShapes`) no microbatch exceeds.
            sample_cost: float64 ``[N]``: each sample's cost beside its tokens' (docs/multimodal.md).

        Raises:
            ValueError: Bad sizes, non-positive lengths, or an oversize sequence under
                ``on_oversize="error"``.
        """
        request = Request.of(
            lengths,
            dp_size=dp_size,
            cp_size=cp_size,
            max_tokens_per_rank=max_tokens_per_rank,
            pad_multiple=pad_multiple,
            cost=cost,
            on_oversize=on_oversize,
            origin=origin,
            sync=sync,
            bytes_per_token=bytes_per_token,
            static_shapes=static_shapes,
            sample_cost=sample_cost,
        )
        return self.plan(request)

    @abstractmethod
    def plan(self, request: Request) -> Schedule:
        """The schedule for ``request`` (:meth:`schedule`)."""

    def longest_sequence(self, dp_size: int, cp_size: int, max_tokens_per_rank: int, pad_multiple: int) -> int:
        """The longest sequence this scheduler's plans hold (``on_oversize="truncate"`` cuts to
        it): a static microbatch's capacity rounded down to ``pad_multiple``."""
        return (max_tokens_per_rank * cp_size // pad_multiple) * pad_multiple

    def resolve_cost(self, cost: CostModel | None) -> CostModel | None:
        """The cost model this scheduler balances for ``cost`` (unchanged where it ignores cost):
        the units its plans' stats are in."""
        return cost

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def static_schedule(
    request: Request,
    rounds: Sequence[Sequence[np.ndarray]],
    oversize: tuple[np.ndarray, np.ndarray, np.ndarray],
    deferred: np.ndarray | None = None,
) -> Schedule:
    """The static plan of ``request`` whose microbatches are ``rounds`` (``rounds[m][d]``: global
    ids), after the oversize policy (``apply_static_oversize``'s ``oversize``)."""
    effective, dropped, truncated = oversize
    return Schedule.from_assignment(
        rounds,
        lengths=effective,
        original_lengths=request.lengths,
        dp_size=request.dp_size,
        cp_size=request.cp_size,
        max_tokens_per_rank=request.max_tokens_per_rank,
        pad_multiple=request.pad_multiple,
        deferred=deferred,
        dropped=dropped,
        truncated=truncated,
        origin=request.origin,
        sample_cost=request.sample_cost,
    )


class GridScheduler(Scheduler):
    """A static-CP planner: :meth:`plan` applies the oversize policy and hands the remaining
    sequences, with the cost on the static group (:meth:`~seqpack.cost.CostModel.at`
    ``cp_size``), to :meth:`_plan`, which places them into rounds of ``dp_size`` microbatches."""

    def plan(self, request: Request) -> Schedule:
        """A static plan (:meth:`Scheduler.schedule`)."""
        cost = None if request.cost is None else request.cost.at(request.cp_size)  # its cost on the static group
        check_capacity(request.capacity, request.cp_size)
        effective, dropped, truncated = apply_static_oversize(request)
        check_step_tokens(effective, request.pad_multiple)
        placed = dataclasses.replace(request, lengths=effective, cost=cost)
        active = np.flatnonzero(effective > 0).astype(np.int64) if dropped.size else None
        rounds, deferred = self._plan(placed if active is None else placed.subset(active))
        deferred = np.ascontiguousarray(deferred, dtype=np.int64)
        if active is not None:  # positions index the sequences left: back to ids
            deferred = active[deferred]
            if isinstance(rounds, Grid):
                rounds = Grid(active[rounds.ids], rounds.counts, rounds.dp_size)
            else:
                rounds = [[active[np.asarray(cell, dtype=np.int64)] for cell in row] for row in rounds]
        shapes = request.static_shapes
        if shapes is not None:  # within its sequence limit, then, where plans_buckets, trimmed at bucket edges
            forced = getattr(self, "num_microbatches", None)
            rounds = fit_sequence_slots(self, rounds, placed, keep_replica=self.keeps_origin, fixed_rounds=forced)
            model = self.resolve_cost(cost) if self.plans_buckets else None
            price = None if model is None else BucketPrice.of(shapes, request.capacity, model.linear)
            if model is not None and price is not None:
                padded = padded_lengths(effective, request.pad_multiple)
                rounds = trim_to_buckets(
                    rounds,
                    padded,
                    model.cost(padded) + (0.0 if request.sample_cost is None else request.sample_cost),
                    price=price,
                    limit=shapes.max_real_sequences,
                    capacity=request.capacity,
                    constant=model.constant,
                    sync=request.sync,
                )
        return static_schedule(request, rounds, (effective, dropped, truncated), deferred)

    keeps_origin: ClassVar[bool] = False
    """Whether every sample stays on its DP rank (``"empty"``): the ``static_shapes`` repair keeps it there."""
    plans_buckets: ClassVar[bool] = False
    """Whether :meth:`_plan` prices the ``static_shapes`` buckets: its plan is then trimmed to them."""

    @abstractmethod
    def _plan(self, request: Request) -> tuple[Sequence[Sequence[np.ndarray]], np.ndarray]:
        """Return (``rounds[m][d]`` position arrays, deferred positions) for the sequences of
        ``request`` (docs/schedulers.md): every padded microbatch fits ``request.capacity``, every
        round lists ``dp_size`` arrays (empty ones allowed)."""


def fit_sequence_slots(
    scheduler: Scheduler,
    rounds: Sequence[Sequence[np.ndarray]],
    request: Request,
    *,
    keep_replica: bool,
    fixed_rounds: int | None,
) -> list[list[np.ndarray]]:
    """:func:`fit_sequence_limit` of ``rounds`` of ``request`` (after the oversize policy, cost
    on the static group) to its ``static_shapes``' sequence limit, each sequence weighed by its
    cost plus ``sample_cost`` (no cost model: its padded tokens), in ``microbatch_multiple``
    rounds; a ScheduleError when the ids need more than a forced ``fixed_rounds``."""
    assert request.static_shapes is not None
    padded = padded_lengths(request.lengths, request.pad_multiple)
    extra = 0.0 if request.sample_cost is None else request.sample_cost
    weight = padded.astype(np.float64) if request.cost is None else request.cost.cost(padded) + extra
    return fit_sequence_limit(
        rounds,
        padded,
        weight,
        limit=request.static_shapes.max_real_sequences,
        capacity=request.capacity,
        keep_replica=keep_replica,
        round_multiple=int(getattr(scheduler, "microbatch_multiple", 1)),
        fixed_rounds=fixed_rounds,
    )
