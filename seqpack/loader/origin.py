"""Outputs back to where their samples came from: :func:`to_origin`, behind ``Step.to_origin``.

A forward pass over packed, rebalanced microbatches produces per-token values (log-probs,
values, rewards) in the order of the packs on the replica that ran them. An RL loop needs them
on the rank that read each sample, in the order it read them. :func:`to_origin` cuts each
microbatch's values into its sequences, sends every sequence back to its origin DP rank in one
``all_to_all_single`` (the reverse of the step's exchange, :func:`~seqpack.collective.exchange.
plan_return`), puts the CP shards of a sequence back together (one all-gather over the CP
group) and strips the padding.

It runs on the model's process groups (the topology's), on the training thread, like any
collective of the model: every rank of the DP x CP lanes calls it for the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from seqpack.collective.exchange import plan_return, return_values
from seqpack.collective.groups import collective, comm_device
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.origin_dynamic import dynamic_to_origin
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.thd import padded_lengths
from seqpack.thd.cp import unshard_from_cp

if TYPE_CHECKING:
    from seqpack.collective.cp_groups import CpGroups
    from seqpack.loader.step import Step
    from seqpack.schedulers import Schedule
    from seqpack.topology import Topology

__all__ = ["origin_ids", "to_origin"]


def origin_ids(schedule: Schedule | DynamicCpSchedule, dp_rank: int) -> np.ndarray:
    """Global ids of the sequences DP rank ``dp_rank`` contributed to this step and gets back
    from :func:`to_origin`: its pool in pool order (samples read this step, pre-packed ones
    split into their sequences, after any held back from the previous step), without those
    held back for the next step."""
    assert schedule.origin is not None  # both plans fill it in __post_init__
    ids = np.flatnonzero(schedule.origin == dp_rank).astype(np.int64)
    return ids[~np.isin(ids, schedule.deferred)]


def to_origin(
    step: Step,
    values: Sequence[torch.Tensor],
    topology: Topology,
    *,
    per_sequence: bool = False,
    cp_groups: CpGroups | None = None,
) -> list[torch.Tensor]:
    """See :meth:`seqpack.loader.step.Step.to_origin` (``cp_groups``: the iterator's dynamic-CP
    process groups, for a :class:`DynamicCpSchedule`)."""
    schedule, batches = step.schedule, step.microbatches
    if schedule is None:
        raise ConfigError("to_origin needs the step's schedule (a Step from wrap_data_iterator)")
    like = _check_values(values, batches, per_sequence)
    if isinstance(schedule, DynamicCpSchedule):
        mine = origin_ids(schedule, topology.dp_rank)
        return dynamic_to_origin(schedule, batches, values, like, topology, cp_groups, mine, per_sequence=per_sequence)
    cp = topology.cp_size
    pieces: dict[int, torch.Tensor] = {}
    for m, batch in enumerate(batches):
        local = batch.cu_seqlens_padded.to(torch.int64) // cp  # this rank's rows of each sequence
        for i, gid in enumerate(batch.sample_ids.tolist()):
            if gid >= 0:
                pieces[gid] = values[m][i : i + 1] if per_sequence else values[m][int(local[i]) : int(local[i + 1])]
    replica = schedule.placement()[0]
    padded = padded_lengths(schedule.lengths, schedule.pad_multiple)
    sizes = np.ones_like(padded) if per_sequence else padded // cp
    assert schedule.origin is not None  # Schedule fills it in __post_init__
    plan = plan_return(replica, schedule.origin, sizes, topology.dp_rank, topology.dp_size)
    got = return_values(pieces, plan, sizes, topology.group("dp"), like=like)
    mine = origin_ids(schedule, topology.dp_rank)
    ran = mine[replica[mine] >= 0]
    if not per_sequence and cp > 1:
        got = _join_cp_shards(got, ran, padded, topology, like)
    empty = like.new_empty((0, *like.shape[1:]))
    out = []
    for gid in mine.tolist():
        if replica[gid] < 0:  # dropped (on_oversize="drop"): nothing ran
            out.append(empty)
        else:
            out.append(got[gid][0] if per_sequence else got[gid][: int(schedule.lengths[gid])])
    return out


def _check_values(values: Sequence[torch.Tensor], batches: Sequence, per_sequence: bool) -> torch.Tensor:
    """The first microbatch's values (dtype, device, trailing shape) after checking them all."""
    if not isinstance(values, Sequence) or not all(isinstance(v, torch.Tensor) for v in values):
        raise SeqpackTypeError(f"values must be a list of tensors, one per microbatch, got {type(values).__name__}")
    if len(values) != len(batches):
        raise ConfigError(f"values holds {len(values)} tensors but this step has {len(batches)} microbatches")
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


def _join_cp_shards(
    got: dict[int, torch.Tensor], ids: np.ndarray, padded: np.ndarray, topology: Topology, like: torch.Tensor
) -> dict[int, torch.Tensor]:
    """Every CP rank of a replica holds its shard of the same sequences: all-gather them and
    undo the CP partition, giving each sequence's padded values in token order."""
    group, cp = topology.group("cp"), topology.cp_size
    trailing = tuple(like.shape[1:])
    mine = torch.cat([got[int(g)] for g in ids.tolist()]) if ids.size else like.new_empty((0, *trailing))
    device = comm_device(group)
    parts = [torch.empty_like(mine, device=device) for _ in range(cp)]
    collective(dist.all_gather, parts, mine.to(device), group=group)
    offsets = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(padded[ids], out=offsets[1:])
    whole = unshard_from_cp([part.to(like.device) for part in parts], torch.from_numpy(offsets), cp)
    return {int(g): whole[int(offsets[i]) : int(offsets[i + 1])] for i, g in enumerate(ids.tolist())}
