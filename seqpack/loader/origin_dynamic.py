"""``Step.to_origin`` under dynamic CP: values of a step's groups back to the reading ranks.

Under dynamic CP (docs/dynamic_cp.md) plane rank ``p`` runs, every round, DualChunkSwap shard
``p - start`` of each sequence of its group ``[start, start + c)`` (padded to a multiple of
``2 * c * pad_multiple``). :func:`dynamic_to_origin` sends every shard (with
``per_sequence``: the row of CP rank 0 of the group only) to every CP rank of the DP replica
that read the sequence, in one ``all_to_all_single`` over the model's process group of the
whole plane (a block every plan's group family holds), then each rank puts the ``c`` shards of
each of its sequences back together (``unshard_from_cp``) and strips the padding. What each
rank sends and receives is computed from the plan every rank holds (:func:`outgoing`, before
any collective): no size exchange.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.collective.cp_groups import CpGroups
from seqpack.collective.groups import collective, comm_device
from seqpack.errors import ConfigError
from seqpack.schedulers.schedule import Schedule
from seqpack.thd import group_padded_lengths
from seqpack.thd.cp import unshard_from_cp

if TYPE_CHECKING:
    from seqpack.thd import PackedBatch
    from seqpack.topology import Topology

__all__ = ["Outgoing", "dynamic_to_origin", "outgoing", "plane_group", "return_pieces"]


def return_pieces(plan: Schedule, per_sequence: bool) -> list[tuple[int, int, int, int, int]]:
    """Every piece of the step's values, in send order: ``(sender plane rank, round, global
    id, shard j, rows)`` ordered by sender, then round, then pack order; every piece goes to
    each CP rank of replica ``origin[id]``."""
    out = []
    rank_group = plan.rank_group()
    padded_all = np.zeros(plan.num_sequences, dtype=np.int64)
    group_of = np.repeat(np.arange(plan.num_groups, dtype=np.int64), plan.group_counts)
    padded_all[plan.assigned] = group_padded_lengths(
        plan.lengths[plan.assigned], plan.group_size[group_of], plan.pad_multiple
    )
    for p in range(plan.num_ranks):
        for m in range(plan.num_microbatches):
            g = int(rank_group[m, p])
            c, j = int(plan.group_size[g]), p - int(plan.group_start[g])
            if per_sequence and j:
                continue
            for gid in plan.group_ids(g).tolist():
                out.append((p, m, gid, j, 1 if per_sequence else int(padded_all[gid]) // c))
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
) -> Outgoing:
    """This rank's part of the return, computed from the plan alone (no collective);
    ``values`` are checked against ``batches`` already.

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
    for p, m, gid, j, rows in return_pieces(plan, per_sequence):
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


def dynamic_to_origin(
    plan: Schedule, out: Outgoing, like: torch.Tensor, groups: CpGroups | None, *, per_sequence: bool
) -> dict[int, torch.Tensor]:
    """Run the return (module docstring): the values of every sequence this rank's DP
    replica read that ran this step, by global id (pads removed, shards joined)."""
    got = _all_to_all(out.send, out.send_rows, out.recv_rows, groups, like)
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
            whole[gid] = (parts[0] if c == 1 else _unshard(parts, c))[: int(plan.lengths[gid])]
    return whole


def plane_group(groups: CpGroups | None, step: int) -> Any:
    """The model's process group of the whole plane the return runs on (``None`` for one
    rank).

    Raises:
        ConfigError: The iterator ended or was closed, which freed its process groups.
    """
    if groups is None or groups.num_ranks == 1:
        return None
    if groups.released or not dist.is_initialized():
        raise ConfigError(
            f"to_origin of step {step} under dynamic_cp after its iterator ended or was closed: the dynamic-CP "
            "process groups it runs on are freed then; call to_origin before the next() that ends the data, or "
            "before close()"
        )
    return groups.group(0, groups.num_ranks)


def _unshard(parts: dict[int, torch.Tensor], c: int) -> torch.Tensor:
    padded = parts[0].shape[0] * c
    return unshard_from_cp([parts[j] for j in range(c)], torch.tensor([0, padded], dtype=torch.int64), c)


def _all_to_all(
    send: torch.Tensor, send_rows: np.ndarray, recv_rows: np.ndarray, groups: CpGroups | None, like: torch.Tensor
) -> torch.Tensor:
    """One ``all_to_all_single`` over the model's group of the whole plane (rows in plane-rank
    order); a one-rank plane keeps what it sends."""
    if groups is None or groups.num_ranks == 1:
        return send
    group = groups.group(0, groups.num_ranks)
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
