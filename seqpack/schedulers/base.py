"""The Scheduler base class and :func:`predicted_step_time`.

A scheduler turns one step's lengths into a :class:`~seqpack.schedulers.schedule.Schedule`.
The schedule itself lives in :mod:`seqpack.schedulers.schedule`, the checks before planning
in :mod:`seqpack.schedulers.request`; both are re-exported here (their old home).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.options import Sync
from seqpack.schedulers.dynamic_cp.cost import GroupCost
from seqpack.schedulers.dynamic_cp.cost import predicted_step_time as dynamic_step_time
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.schedulers.objective import microbatch_costs, step_objective
from seqpack.schedulers.request import (
    ON_OVERSIZE,
    apply_oversize,
    as_lengths,
    as_origin,
    check_microbatches,
    check_request,
    check_step_tokens,
    default_origin,
)
from seqpack.schedulers.schedule import Schedule, ScheduleLimits
from seqpack.validation import check_choice, check_number, check_positive_int

__all__ = [
    "ON_OVERSIZE",
    "Schedule",
    "ScheduleLimits",
    "Scheduler",
    "apply_oversize",
    "as_lengths",
    "as_origin",
    "check_microbatches",
    "check_request",
    "check_step_tokens",
    "default_origin",
    "predicted_step_time",
]


class Scheduler(ABC):
    """Turns one step's lengths into a :class:`Schedule`. Subclasses implement :meth:`_plan`.

    ``schedule`` validates its arguments, applies the oversize policy and hands the
    remaining ids to ``_plan``; it is pure and deterministic.
    """

    name: ClassVar[str] = ""
    uses_sync: ClassVar[bool] = False
    """Whether :meth:`_plan` takes ``sync`` (schedulers that choose the microbatch count
    for a predicted step time); others plan the same for every sync."""
    uses_bytes_per_token: ClassVar[bool] = False
    """Whether :meth:`_plan` takes ``bytes_per_token`` (schedulers that weigh the bytes a
    plan keeps from crossing the network against their own plan time)."""

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
        bytes_per_token: float | None = None,
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
            bytes_per_token: Bytes a sample's token carries through the exchange (the wrapper
                passes its samples'; ``None``: 20, token ids, labels and a loss mask), for
                schedulers that weigh it against their plan time (``balanced``'s locality).

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
        options = self._plan_options(sync, bytes_per_token)
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

    def _plan_options(self, sync: str | None, bytes_per_token: float | None) -> dict[str, object]:
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


def predicted_step_time(
    schedule: Schedule | DynamicCpSchedule, cost: CostModel | GroupCost, *, sync: str = "lockstep"
) -> float:
    """The step time ``cost`` predicts for ``schedule`` (in ``cost``'s units: seconds for a
    fitted model, FLOPs for :meth:`~seqpack.cost.CostModel.from_transformer`).

    Every microbatch costs ``constant + sum(linear*s + quadratic*s**2)`` over its padded
    lengths (an empty one, a padding-only filler, costs ``constant``).

    Args:
        schedule: A step's schedule, or a dynamic-CP plan (then ``cost`` is its
            :class:`~seqpack.schedulers.dynamic_cp.GroupCost`).
        cost: The cost model.
        sync: ``"lockstep"`` (FSDP, pipeline): ``sum_m max_d cost[m, d]``, every round
            waits for its slowest replica; ``"replica"`` (DDP, ZeRO-1):
            ``max_d sum_m cost[m, d]``, the slowest replica's total.

    Raises:
        SeqpackTypeError: ``cost`` is not a CostModel or ``schedule`` not a Schedule.
        ConfigError: Unknown ``sync``.
    """
    if isinstance(schedule, DynamicCpSchedule):
        if not isinstance(cost, GroupCost):
            raise SeqpackTypeError(f"a DynamicCpSchedule needs a GroupCost, got {type(cost).__name__}")
        return dynamic_step_time(schedule, cost, sync=sync)
    if not isinstance(schedule, Schedule):
        raise SeqpackTypeError(f"schedule must be a seqpack Schedule, got {type(schedule).__name__}")
    if not isinstance(cost, CostModel):
        raise SeqpackTypeError(f"cost must be a seqpack.CostModel, got {type(cost).__name__}")
    sync = check_choice("sync", sync, Sync)
    ids = schedule._flat[0]
    n = schedule.lengths.shape[0]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ScheduleError(
            f"schedule assigns sample ids up to {int(ids.max())} but holds {n} lengths: "
            "it was built for other lengths (check it with Schedule.validate)"
        )
    return step_objective(microbatch_costs(schedule, cost), sync)
