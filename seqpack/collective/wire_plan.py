"""The plan a wire message carries (:mod:`seqpack.collective.wire`): a static
:class:`~seqpack.schedulers.Schedule` or a dynamic-CP
:class:`~seqpack.schedulers.dynamic_cp.DynamicCpSchedule`, as its ``to_arrays()`` in the
int64 payload, with the counts and limits in the step header (pure functions)."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

import numpy as np

from seqpack.errors import WireError
from seqpack.options import GroupSizes
from seqpack.schedulers.dynamic_cp import DynamicCpSchedule
from seqpack.schedulers.schedule import Schedule

__all__ = ["PlanKind", "decode_plan", "plan_header", "plan_payload"]

Plan = Schedule | DynamicCpSchedule


class PlanKind(IntEnum):
    """``plan_kind`` of the step header."""

    SCHEDULE = 0  # static CP: Schedule.to_arrays()
    DYNAMIC_CP = 1  # DynamicCpSchedule.to_arrays()


def plan_header(plan: Plan) -> dict[str, int]:
    """The step-header fields that describe ``plan`` (kind, limits, array lengths)."""
    arrays = plan.to_arrays()
    dynamic = isinstance(plan, DynamicCpSchedule)
    return {
        "plan_kind": PlanKind.DYNAMIC_CP if dynamic else PlanKind.SCHEDULE,
        "dp_size": plan.dp_size,
        "schedule_cp_size": plan.cp_size,
        "max_tokens_per_rank": plan.max_tokens_per_rank,
        "pad_multiple": plan.pad_multiple,
        "num_sequences": plan.num_sequences,
        "num_assigned": arrays["assigned"].shape[0],
        "num_deferred": arrays["deferred"].shape[0],
        "num_dropped": arrays["dropped"].shape[0],
        "num_truncated": arrays["truncated"].shape[0],
        "num_groups": plan.num_groups if isinstance(plan, DynamicCpSchedule) else 0,
        "group_sizes": list(GroupSizes).index(plan.group_sizes) if isinstance(plan, DynamicCpSchedule) else 0,
    }


def plan_payload(plan: Plan) -> list[np.ndarray]:
    """The plan's int64 arrays, in its ``ARRAY_FIELDS`` order."""
    arrays = plan.to_arrays()
    return [arrays[name] for name in type(plan).ARRAY_FIELDS]


def _lengths(kind: PlanKind, step: np.void, num_microbatches: int) -> dict[str, int]:
    n, g = int(step["num_sequences"]), int(step["num_groups"])
    counts = {
        "original_lengths": n,
        "lengths": n,
        "assigned": int(step["num_assigned"]),
        "deferred": int(step["num_deferred"]),
        "dropped": int(step["num_dropped"]),
        "truncated": int(step["num_truncated"]),
        "origin": n,
    }
    if kind == PlanKind.SCHEDULE:
        counts["cell_counts"] = num_microbatches * int(step["dp_size"])
    else:
        counts.update(group_round=g, group_start=g, group_size=g, group_counts=g)
    return counts


def decode_plan(take: Callable[[int, str], np.ndarray], step: np.void, num_microbatches: int, verify: bool) -> Plan:
    """Rebuild the plan from the step header and the payload (``take(n, name)`` returns the
    next ``n`` int64 words); ``verify`` compares its fingerprint with the header's.

    Raises:
        WireError: An unknown plan kind, arrays that do not add up, or (``verify``) another
            fingerprint.
    """
    code = int(step["plan_kind"])
    if code not in tuple(PlanKind):
        raise WireError(f"plan_kind {code} is not one of {[int(k) for k in PlanKind]}")
    kind = PlanKind(code)
    cls: type[Schedule] | type[DynamicCpSchedule] = Schedule if kind == PlanKind.SCHEDULE else DynamicCpSchedule
    counts = _lengths(kind, step, num_microbatches)
    arrays = {name: take(counts[name], name) for name in cls.ARRAY_FIELDS}
    limits = [num_microbatches, step["dp_size"], step["schedule_cp_size"], step["max_tokens_per_rank"]]
    limits.append(step["pad_multiple"])
    if kind == PlanKind.DYNAMIC_CP:
        limits.append(step["group_sizes"])
    arrays["limits"] = np.array(limits, dtype=np.int64)
    try:
        plan: Plan = cls.from_arrays(arrays)
    except ValueError as exc:
        raise WireError(f"corrupt schedule in wire message: {exc}") from exc
    if verify and plan.fingerprint() != int(step["fingerprint"]):
        raise WireError(
            f"schedule fingerprint {plan.fingerprint()} of the decoded message differs from the sent "
            f"{int(step['fingerprint'])}: the message was corrupted"
        )
    return plan
