"""Outputs back to where their samples came from: :func:`to_origin`, behind ``Step.to_origin``.

An RL loop needs the per-token values of a forward pass over packed, rebalanced microbatches
on the rank that read each sample, in read order. Plane rank ``p`` runs shard ``p - start``
of each sequence of its group ``[start, start + c)``; :func:`to_origin` sends every shard to
every CP rank of the DP replica that read the sequence in one ``all_to_all_single`` over the
model's plane group, then joins each sequence's shards and strips the padding. What each rank
sends and receives follows from the plan every rank holds (:func:`outgoing`): no size
exchange.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.collective.agree import Status, agree_axes
from seqpack.collective.cp_groups import CpGroups
from seqpack.collective.groups import collective, comm_device, this_rank
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError, from_typed_message, typed_message
from seqpack.options import CpLayout, fingerprint_text
from seqpack.schedulers.schedule import Schedule
from seqpack.thd.cp import unshard_from_cp

if TYPE_CHECKING:
    from seqpack.loader.step import Step
    from seqpack.thd import PackedBatch
    from seqpack.topology import Topology

__all__ = ["origin_slots", "to_origin"]


def origin_slots(schedule: Schedule, dp_rank: int, empty_at: Sequence[int] = ()) -> np.ndarray:
    """``Step.origin_ids`` of DP rank ``dp_rank`` (``empty_at``: the pool index of each
    zero-length sequence, ascending; one that no sequence follows is ``len(pool)``)."""
    assert schedule.origin is not None
    pool = np.flatnonzero(schedule.origin == dp_rank).astype(np.int64)
    at = np.asarray(empty_at, dtype=np.int64).reshape(-1)
    assert not at.size or (0 <= at[0] and at[-1] <= pool.size and bool(np.all(np.diff(at) >= 0))), (at, pool.size)
    slots = np.insert(pool, at, -1) if at.size else pool
    return slots[~np.isin(slots, schedule.deferred)]


def to_origin(step: Step, values: Sequence[torch.Tensor], *, per_sequence: bool = False) -> list[torch.Tensor]:
    """:meth:`seqpack.loader.step.Step.to_origin` (it reads the step's topology, CP groups,
    zero-length slots and static shapes, which the iterator set)."""
    schedule, batches, topology, cp_groups = step.schedule, step.microbatches, step._topology, step._cp_groups
    if schedule is None or topology is None or cp_groups is None:
        raise ConfigError("to_origin needs a Step from wrap_data_iterator")
    plane = plane_group(cp_groups, step.step)  # the same answer on every rank
    error: SeqpackError | None = None
    like: torch.Tensor | None = None
    out = None
    try:
        like = _check_values(values, batches, per_sequence)
        spans = schedule.packed_spans(step._static_shapes)
        out = outgoing(schedule, batches, values, like, topology, per_sequence=per_sequence, spans=spans)
    except SeqpackError as exc:
        error = exc
    _agree(step.step, error, like, per_sequence, topology)
    assert like is not None and out is not None
    layout = batches[0].cp_layout if batches else CpLayout.DUALCHUNK
    got = _returned(schedule, out, like, plane, per_sequence=per_sequence, layout=layout)
    empty = like.new_empty((0, *like.shape[1:]))
    # Zero-length samples (-1) and sequences dropped for their length (ran nowhere) get `empty`.
    return [got.get(gid, empty) for gid in origin_slots(schedule, topology.dp_rank, step._empty_at).tolist()]


def _agree(
    step: int,
    error: SeqpackError | None,
    like: torch.Tensor | None,
    per_sequence: bool,
    topology: Topology,
) -> None:
    """Every rank of the return agrees that every rank's values are fine and describe the same
    step the same way before any rank enters its collectives (one small all-reduce per group).

    Raises:
        ConfigError, SeqpackTypeError: Some rank's values were refused (its error), or the
            ranks disagree (the fields that differ, each rank's value).
    """
    message, fingerprint, details = None, None, None
    if error is not None:
        name, _, text = typed_message(error).partition(": ")
        where = f"DP rank {topology.dp_rank}, CP rank {topology.cp_rank} (global rank {this_rank()})"
        message = f"{name}: to_origin of step {step} on {where}: {text}"
    else:
        assert like is not None
        details = {
            "step": str(step),
            "per_sequence": str(per_sequence),
            "dtype": str(like.dtype),
            "trailing shape": str(tuple(like.shape[1:])),
        }
        fingerprint = fingerprint_text(repr(sorted(details.items())))
    status = Status.ERROR if error is not None else Status.OK
    agreed = agree_axes(topology, ("dp", "cp"), status, message, fingerprint, what="to_origin calls", details=details)
    if agreed.status == Status.ERROR:
        raise from_typed_message(agreed.message or "") from error


def _check_values(values: Sequence[torch.Tensor], batches: Sequence, per_sequence: bool) -> torch.Tensor:
    """The first microbatch's values (dtype, device, trailing shape) after checking them all;
    ``torch.empty(0)`` for a step without microbatches."""
    if not isinstance(values, Sequence) or not all(isinstance(v, torch.Tensor) for v in values):
        raise SeqpackTypeError(f"values must be a list of tensors, one per microbatch, got {type(values).__name__}")
    if len(values) != len(batches):
        raise ConfigError(f"values holds {len(values)} tensors but this step has {len(batches)} microbatches")
    if not values:  # every sequence of the step was empty, dropped or held back
        return torch.empty(0)
    what = "sequences (sample_ids)" if per_sequence else "tokens of this rank's shard"
    for m, (value, batch) in enumerate(zip(values, batches, strict=True)):
        rows = int(batch.sample_ids.shape[0]) if per_sequence else batch.num_tokens
        if value.dim() == 0 or value.shape[0] != rows:
            raise ConfigError(
                f"values[{m}] has shape {tuple(value.shape)} but microbatch {m} holds {rows} {what}: "
                "values must be aligned with it on their first axis"
            )
        first = values[0]
        if (value.dtype, value.shape[1:], value.device) != (first.dtype, first.shape[1:], first.device):
            raise ConfigError(
                f"values[{m}] is {value.dtype} {tuple(value.shape)} on {value.device} but values[0] is "
                f"{first.dtype} {tuple(first.shape)} on {first.device}: one dtype, trailing shape and device"
            )
    return values[0]


def return_pieces(plan: Schedule, per_sequence: bool, spans: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """Every piece of the step's values, in send order: ``(sender plane rank, round, global
    id, shard j, rows)`` ordered by sender, then round, then pack order; every piece goes to
    each CP rank of replica ``origin[id]`` (``spans``: ``Schedule.packed_spans``)."""
    out = []
    rank_group = plan.rank_group()
    for p in range(plan.num_ranks):
        for m in range(plan.num_microbatches):
            g = int(rank_group[m, p])
            c, j = int(plan.group_size[g]), p - int(plan.group_start[g])
            if per_sequence and j:
                continue
            for gid in plan.group_ids(g).tolist():
                out.append((p, m, gid, j, 1 if per_sequence else int(spans[gid]) // c))
    return out


@dataclasses.dataclass(frozen=True)
class Outgoing:
    """What this rank sends in the return's all-to-all and what it receives (:func:`outgoing`)."""

    send: torch.Tensor  # this rank's rows, destination by destination (plane rank order)
    send_rows: np.ndarray  # int64 [R]: rows to each plane rank
    recv_rows: np.ndarray  # int64 [R]: rows from each plane rank
    received: list[tuple[int, int, int]]  # (global id, shard, rows) in arrival order


def outgoing(
    plan: Schedule,
    batches: Sequence[PackedBatch],
    values: Sequence[torch.Tensor],
    like: torch.Tensor,
    topology: Topology,
    *,
    per_sequence: bool,
    spans: np.ndarray,
) -> Outgoing:
    """This rank's part of the return, computed from the plan alone (no collective);
    ``values`` are checked against ``batches`` already; ``spans``: ``Schedule.packed_spans``.

    Raises:
        ConfigError: A microbatch that holds another number of rows of a sequence than the
            plan gives it (batches that are not this step's).
    """
    cp = topology.cp_size
    me = topology.dp_rank * cp + topology.cp_rank
    replica = me // cp
    assert plan.origin is not None
    parts: list[list[torch.Tensor]] = [[] for _ in range(plan.num_ranks)]
    offsets = {}
    for m, batch in enumerate(batches):
        local = batch.cu_seqlens_padded.to(torch.int64) // batch.cp_size
        for i, gid in enumerate(batch.sample_ids.tolist()):
            if gid >= 0:
                offsets[(m, gid)] = (i, i + 1) if per_sequence else (int(local[i]), int(local[i + 1]))
    send_rows = np.zeros(plan.num_ranks, dtype=np.int64)
    recv_rows = np.zeros(plan.num_ranks, dtype=np.int64)
    received: list[tuple[int, int, int]] = []
    for p, m, gid, j, rows in return_pieces(plan, per_sequence, spans):
        d = int(plan.origin[gid])
        if p == me:
            lo, hi = offsets.get((m, gid), (0, 0))
            if hi - lo != rows:
                raise ConfigError(f"microbatch {m} holds {hi - lo} rows of sample {gid}, the plan gives it {rows}")
            for q in range(d * cp, (d + 1) * cp):
                parts[q].append(values[m][lo:hi])
                send_rows[q] += rows
        if d == replica:
            received.append((gid, j, rows))  # by sender, then in its send order: the all-to-all's order
            recv_rows[p] += rows
    empty = like.new_empty((0, *like.shape[1:]))
    send = torch.cat([t for dest in parts for t in dest]) if int(send_rows.sum()) else empty
    return Outgoing(send, send_rows, recv_rows, received)


def _returned(
    plan: Schedule, out: Outgoing, like: torch.Tensor, plane: Any, *, per_sequence: bool, layout: CpLayout
) -> dict[int, torch.Tensor]:
    """The values of every sequence this rank's DP replica read that ran this step, by global
    id (pads removed, shards joined)."""
    got = _all_to_all(out.send, out.send_rows, out.recv_rows, plane, like)
    shards: dict[int, dict[int, torch.Tensor]] = {}
    row = 0
    for gid, j, rows in out.received:
        shards.setdefault(gid, {})[j] = got[row : row + rows]
        row += rows
    whole = {}
    for gid, parts in shards.items():
        if per_sequence:
            whole[gid] = parts[0][0]
        else:
            c = len(parts)
            whole[gid] = (parts[0] if c == 1 else _unshard(parts, c, layout))[: int(plan.lengths[gid])]
    return whole


def plane_group(groups: CpGroups, step: int) -> Any:
    """The model's process group of the whole plane the return runs on (``None`` for one
    rank).

    Raises:
        ConfigError: The iterator ended or was closed, which freed the plane group it
            created (the topology's own groups stay).
    """
    if groups.num_ranks == 1:
        return None
    group = groups.blocks.get((0, groups.num_ranks))
    created = group is not None and not any(group is e for e in groups.external)
    if created and (groups.released or not dist.is_initialized()):
        raise ConfigError(
            f"to_origin of step {step} after its iterator ended or was closed: the plane process group it runs on "
            "is freed then; call to_origin before the next() that ends the data, or before close()"
        )
    return groups.group(0, groups.num_ranks)


def _unshard(parts: dict[int, torch.Tensor], c: int, layout: CpLayout) -> torch.Tensor:
    padded = parts[0].shape[0] * c
    offsets = torch.tensor([0, padded], dtype=torch.int64)
    return unshard_from_cp([parts[j] for j in range(c)], offsets, c, layout=layout)


def _all_to_all(
    send: torch.Tensor, send_rows: np.ndarray, recv_rows: np.ndarray, group: Any, like: torch.Tensor
) -> torch.Tensor:
    """One ``all_to_all_single`` over ``group`` (``None``: a one-rank plane keeps what it sends)."""
    if group is None:
        return send
    device = comm_device(group)
    out = torch.empty((int(recv_rows.sum()), *send.shape[1:]), dtype=send.dtype, device=device)
    collective(
        dist.all_to_all_single,
        out,
        send.to(device),
        output_split_sizes=recv_rows.tolist(),
        input_split_sizes=send_rows.tolist(),
        group=group,
    )
    return out.to(like.device)
