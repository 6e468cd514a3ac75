"""The plan a wire message carries (:mod:`seqpack.collective.wire`): a
:class:`~seqpack.schedulers.Schedule` (static or dynamic CP: every plan is groups), as its
``to_arrays()`` in the int64 payload, with the counts and limits in the step header (pure
functions)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from seqpack.errors import WireError
from seqpack.options import GroupSizes
from seqpack.schedulers import Schedule

__all__ = ["decode_plan", "plan_header", "plan_payload"]


def plan_header(plan: Schedule) -> dict[str, int]:
    """The step-header fields that describe ``plan`` (limits, array lengths)."""
    arrays = plan.to_arrays()
    return {
        "dp_size": plan.dp_size,
        "schedule_cp_size": plan.cp_size,
        "max_tokens_per_rank": plan.max_tokens_per_rank,
        "pad_multiple": plan.pad_multiple,
        "num_sequences": plan.num_sequences,
        "num_assigned": arrays["assigned"].shape[0],
        "num_deferred": arrays["deferred"].shape[0],
        "num_dropped": arrays["dropped"].shape[0],
        "num_truncated": arrays["truncated"].shape[0],
        "num_groups": plan.num_groups,
        "group_sizes": list(GroupSizes).index(plan.group_sizes),
    }


def plan_payload(plan: Schedule) -> list[np.ndarray]:
    """The plan's int64 arrays, in :attr:`Schedule.ARRAY_FIELDS` order."""
    arrays = plan.to_arrays()
    return [arrays[name] for name in Schedule.ARRAY_FIELDS]


def _lengths(step: np.void) -> dict[str, int]:
    n, g = int(step["num_sequences"]), int(step["num_groups"])
    return {
        "original_lengths": n,
        "lengths": n,
        "group_round": g,
        "group_start": g,
        "group_size": g,
        "group_counts": g,
        "assigned": int(step["num_assigned"]),
        "deferred": int(step["num_deferred"]),
        "dropped": int(step["num_dropped"]),
        "truncated": int(step["num_truncated"]),
        "origin": n,
    }


def decode_plan(take: Callable[[int, str], np.ndarray], step: np.void, num_microbatches: int) -> Schedule:
    """Rebuild the plan from the step header and the payload (``take(n, name)`` returns the
    next ``n`` int64 words), and check its fingerprint against the header's.

    Raises:
        WireError: Arrays that do not add up, an unknown group rule, or another fingerprint.
    """
    counts = _lengths(step)
    arrays = {name: take(counts[name], name) for name in Schedule.ARRAY_FIELDS}
    limits = [num_microbatches, step["dp_size"], step["schedule_cp_size"], step["max_tokens_per_rank"]]
    limits += [step["pad_multiple"], step["group_sizes"]]
    arrays["limits"] = np.array(limits, dtype=np.int64)
    try:
        plan = Schedule.from_arrays(arrays)
    except ValueError as exc:
        raise WireError(f"corrupt schedule in wire message: {exc}") from exc
    if plan.fingerprint() != int(step["fingerprint"]):
        raise WireError(
            f"schedule fingerprint {plan.fingerprint()} of the decoded message differs from the sent "
            f"{int(step['fingerprint'])}: the message was corrupted"
        )
    return plan
