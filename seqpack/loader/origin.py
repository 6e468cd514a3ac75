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
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.collective.agree import Status, agree, agree_axes
from seqpack.collective.exchange import plan_return, return_values
from seqpack.collective.groups import collective, comm_device, this_rank
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError, from_typed_message, typed_message
from seqpack.loader.origin_dynamic import dynamic_to_origin, outgoing, plane_group
from seqpack.options import fingerprint_text
from seqpack.schedulers.schedule import Schedule
from seqpack.thd import padded_lengths
from seqpack.thd.cp import unshard_from_cp

if TYPE_CHECKING:
    from seqpack.collective.cp_groups import CpGroups
    from seqpack.loader.step import Step
    from seqpack.schedulers import Schedule
    from seqpack.topology import Topology

__all__ = ["origin_ids", "origin_slots", "to_origin"]


def origin_ids(schedule: Schedule, dp_rank: int) -> np.ndarray:
    """Global ids of the sequences DP rank ``dp_rank`` contributed to this step and gets back
    from :func:`to_origin`: its pool in pool order (samples read this step, pre-packed ones
    split into their sequences, after any held back from the previous step), without those
    held back for the next step."""
    assert schedule.origin is not None  # both plans fill it in __post_init__
    ids = np.flatnonzero(schedule.origin == dp_rank).astype(np.int64)
    return ids[~np.isin(ids, schedule.deferred)]


def origin_slots(schedule: Schedule, dp_rank: int, empty_at: Sequence[int] = ()) -> np.ndarray:
    """What :func:`to_origin` returns on DP rank ``dp_rank``, in order: :func:`origin_ids`
    with ``-1`` wherever a zero-length sequence was read (``empty_at``: the pool index of
    each, ascending; one that no sequence follows is ``len(pool)``)."""
    assert schedule.origin is not None
    pool = np.flatnonzero(schedule.origin == dp_rank).astype(np.int64)
    at = np.asarray(empty_at, dtype=np.int64).reshape(-1)
    assert not at.size or (0 <= at[0] and at[-1] <= pool.size and bool(np.all(np.diff(at) >= 0))), (at, pool.size)
    slots = np.insert(pool, at, -1) if at.size else pool
    return slots[~np.isin(slots, schedule.deferred)]


def to_origin(
    step: Step,
    values: Sequence[torch.Tensor],
    topology: Topology,
    *,
    per_sequence: bool = False,
    cp_groups: CpGroups | None = None,
    empty_at: Sequence[int] = (),
) -> list[torch.Tensor]:
    """See :meth:`seqpack.loader.step.Step.to_origin` (``cp_groups``: the iterator's dynamic-CP
    process groups, for a :class:`Schedule`; ``empty_at``: the pool index of each
    zero-length sequence this DP rank read, :func:`origin_slots`)."""
    schedule, batches = step.schedule, step.microbatches
    if schedule is None:
        raise ConfigError("to_origin needs the step's schedule (a Step from wrap_data_iterator)")
    dynamic = cp_groups is not None  # the wrapper runs dynamic CP
    plane = plane_group(cp_groups, step.step) if dynamic else None  # the same answer on every rank
    error: SeqpackError | None = None
    like: torch.Tensor | None = None
    out = None
    try:
        like = _check_values(values, batches, per_sequence)
        if dynamic:
            out = outgoing(schedule, batches, values, like, topology, per_sequence=per_sequence)
    except SeqpackError as exc:
        error = exc
    _agree(step.step, error, like, per_sequence, topology, plane, dynamic)
    assert like is not None
    if dynamic:
        assert out is not None
        got = dynamic_to_origin(schedule, out, like, cp_groups, per_sequence=per_sequence)
    else:
        got = _static_to_origin(schedule, batches, values, like, topology, per_sequence)
    empty = like.new_empty((0, *like.shape[1:]))
    # Zero-length samples (-1) and sequences dropped for their length (ran nowhere) get `empty`.
    return [got.get(gid, empty) for gid in origin_slots(schedule, topology.dp_rank, empty_at).tolist()]


def _agree(
    step: int,
    error: SeqpackError | None,
    like: torch.Tensor | None,
    per_sequence: bool,
    topology: Topology,
    plane: Any,
    dynamic: bool,
) -> None:
    """Every rank of the return agrees, in one small all-reduce per group, that every rank's
    values are fine and describe the same step the same way (dtype, trailing shape,
    ``per_sequence``) before any rank enters its collectives: a mistake on one rank raises
    the same error, naming that rank, on all of them instead of leaving them in a collective.

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
    what = "to_origin calls"
    if dynamic:
        agreed = agree(status, message, plane, fingerprint=fingerprint, axis="plane", what=what, details=details)
    else:
        agreed = agree_axes(topology, ("dp", "cp"), status, message, fingerprint, what=what, details=details)
    if agreed.status == Status.ERROR:
        raise from_typed_message(agreed.message or "") from error


def _static_to_origin(
    schedule: Schedule,
    batches: Sequence,
    values: Sequence[torch.Tensor],
    like: torch.Tensor,
    topology: Topology,
    per_sequence: bool,
) -> dict[int, torch.Tensor]:
    """The values of every sequence this DP rank read that ran this step, by global id: one
    all-to-all over DP and, under CP, one all-gather over CP."""
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
    if per_sequence:
        return {gid: got[gid][0] for gid in ran.tolist()}
    return {gid: got[gid][: int(schedule.lengths[gid])] for gid in ran.tolist()}


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


def _join_cp_shards(
    got: dict[int, torch.Tensor], ids: np.ndarray, padded: np.ndarray, topology: Topology, like: torch.Tensor
) -> dict[int, torch.Tensor]:
    """Every CP rank of a replica holds its shard of the same sequences: all-gather them and
    undo the CP partition, giving each sequence's padded values in token order."""
    if not ids.size:  # nothing of this DP rank ran: nor of its CP peers' (the same ids), none gathers
        return {}
    group, cp = topology.group("cp"), topology.cp_size
    mine = torch.cat([got[int(g)] for g in ids.tolist()])
    device = comm_device(group)
    parts = [torch.empty_like(mine, device=device) for _ in range(cp)]
    collective(dist.all_gather, parts, mine.to(device), group=group)
    offsets = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(padded[ids], out=offsets[1:])
    whole = unshard_from_cp([part.to(like.device) for part in parts], torch.from_numpy(offsets), cp)
    return {int(g): whole[int(offsets[i]) : int(offsets[i + 1])] for i, g in enumerate(ids.tolist())}
