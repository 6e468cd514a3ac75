"""Agreement: the ranks of a group settle on one status (ok / end of data / error) and,
optionally, check that they computed the same schedule, in one small all-reduce.

This is what keeps a bad sample on one rank from stranding the others in a collective: every
rank reaches the same agreement call, and every rank leaves it with the same answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from seqpack.collective.fields import Header
from seqpack.collective.groups import all_gather_objects, collective, comm_device, global_rank, group_rank, group_size
from seqpack.errors import ConfigError

__all__ = ["Agreement", "Status", "agree", "agree_axes"]


class Status(IntEnum):
    """Status of a step; the agreed status is the worst one any rank reports."""

    OK = 0
    END = 1  # end of data
    ERROR = 2


_FP_MAX = (1 << 63) - 1

AGREEMENT = Header(
    "agreement vector (int64, reduced by MAX over the group, then the payload words)",
    (
        ("status", "0 ok, 1 end of data, 2 error: the worst one wins"),
        ("fingerprint", "the rank's fingerprint (0 without one): MAX is the largest"),
        ("fingerprint_complement", "2**63-1 minus the fingerprint: MAX gives the smallest; all equal iff both agree"),
        ("has_fingerprint", "1 when the rank passed a fingerprint"),
    ),
)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every rank of the group left :func:`agree` with.

    Attributes:
        status: The worst status any rank reported.
        message: The failing rank's message (lowest group rank that failed), else ``None``.
        rank: Global rank of that failing rank; ``None`` when nobody failed or when the error
            is a disagreement between ranks (no single culprit).
        payload: The element-wise int64 MAX of the ranks' ``payload`` (``None`` without one).
    """

    status: Status
    message: str | None = None
    rank: int | None = None
    payload: np.ndarray | None = None  # the element-wise MAX of every rank's payload (see agree)


def _status(value: int) -> Status:
    try:
        return Status(value)
    except ValueError:
        raise ConfigError(f"status must be one of {[int(s) for s in Status]}, got {value!r}") from None


def agree(
    status: int,
    message: str | None = None,
    group: ProcessGroup | None = None,
    *,
    fingerprint: int | None = None,
    axis: str = "",
    what: str = "schedules",
    origin: int | None = None,
    payload: np.ndarray | None = None,
    details: Mapping[str, str] | None = None,
) -> Agreement:
    """Make the ranks of ``group`` agree on a status; all ranks must call it.

    One int64 all-reduce (MAX) of the :data:`AGREEMENT` vector; on error every rank fetches
    the messages and keeps the lowest failing group rank's. Ranks that pass a fingerprint must
    all pass the same one, else the agreement is an error naming, field by field from
    ``details`` where given, how they differ (``what`` says what was fingerprinted).

    Args:
        origin: Global rank a relayed error comes from (default: this rank).
        payload: int64 words every rank passes the same number of (or every rank ``None``),
            reduced by element-wise MAX in the same all-reduce.
    """
    status = _status(status)
    words = None if payload is None else np.ascontiguousarray(payload, dtype=np.int64).reshape(-1)
    if group_size(group) == 1:
        if status == Status.ERROR:
            return Agreement(status, message, global_rank(group, 0) if origin is None else origin, words)
        return Agreement(status, payload=words)
    fp = -1 if fingerprint is None else int(fingerprint)
    if fingerprint is not None and not 0 <= fp <= _FP_MAX:
        raise ConfigError(f"fingerprint must be in 0..2**63-1, got {fingerprint!r}")
    has = fingerprint is not None
    vec = torch.from_numpy(
        AGREEMENT.pack(
            status=status,
            fingerprint=fp if has else 0,
            fingerprint_complement=_FP_MAX - fp if has else 0,
            has_fingerprint=has,
        )
    )
    if words is not None:
        vec = torch.cat([vec, torch.from_numpy(words)])
    vec = vec.to(comm_device(group))
    collective(dist.all_reduce, vec, op=dist.ReduceOp.MAX, group=group)
    reduced = vec.cpu().numpy()
    agreed, fp_max, fp_min_c, any_fp = (int(v) for v in reduced[: AGREEMENT.words])
    # Returned on every path, errors included: agree_axes passes it on to the next axis.
    reduced_payload = None if words is None else reduced[AGREEMENT.words :].copy()
    if agreed == Status.ERROR:
        me = global_rank(group, group_rank(group)) if origin is None else origin
        reports = all_gather_objects((message, me) if status == Status.ERROR else None, group)
        first = next((report for report in reports if report and report[0]), None)
        if first is None:
            return Agreement(Status.ERROR, "a rank reported an error without a message", payload=reduced_payload)
        return Agreement(Status.ERROR, first[0], first[1], reduced_payload)
    if any_fp and fp_max != _FP_MAX - fp_min_c:
        message = _disagreement(fingerprint, details, group, axis, what)
        return Agreement(Status.ERROR, message, payload=reduced_payload)
    return Agreement(Status(agreed), payload=reduced_payload)


_DEFAULT = "the default"  # a field a rank's details leave out (PackingConfig.summary omits defaults)


def _disagreement(
    fingerprint: int | None, details: Mapping[str, str] | None, group: ProcessGroup | None, axis: str, what: str
) -> str:
    """The message of a fingerprint mismatch: the fields that differ, else the fingerprints."""
    reports = all_gather_objects((fingerprint, dict(details) if details is not None else None), group)
    who = axis or "group"
    described = [d for _, d in reports if d is not None]
    fields = sorted({k for d in described for k in d})
    differ = [k for k in fields if len({d.get(k) for d in described}) > 1]
    if differ:
        listed = "; ".join(
            f"{k}: "
            + ", ".join(f"{d.get(k, _DEFAULT)} on {who} rank {r}" for r, (_, d) in enumerate(reports) if d is not None)
            for k in differ
        )
        return f"ranks of the {axis or 'same'} group disagree on {what}: {listed}"
    listed = ", ".join(f"{who} rank {r}: {fp}" for r, (fp, _) in enumerate(reports) if fp is not None)
    return f"ranks of the {axis or 'same'} group disagree on {what} (fingerprints {listed})"


def agree_axes(
    topology: Any,
    axes: Iterable[str],
    status: int,
    message: str | None,
    fingerprint: int | None,
    *,
    what: str,
    origin: int | None = None,
    payload: np.ndarray | None = None,
    details: Mapping[str, str] | None = None,
) -> Agreement:
    """:func:`agree` over each axis of ``topology`` in turn (axes of size 1 skipped): after
    the last one every rank of those axes holds the same result (and the MAX of every
    rank's ``payload``)."""
    result = None
    for axis in axes:
        if topology.size(axis) > 1:
            result = agree(
                status,
                message,
                topology.group(axis),
                fingerprint=fingerprint,
                axis=axis,
                what=what,
                origin=origin,
                payload=payload,
                details=details,
            )
            status, message, origin, payload = result.status, result.message, result.rank, result.payload
    return result if result is not None else agree(status, message, None, origin=origin, payload=payload)
