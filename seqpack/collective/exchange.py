"""Whole-sample exchange over DP: move samples to the replica the schedule chose.

:func:`plan_exchange` (pure) computes who sends what to whom from the global lengths every
rank already has, so no count is exchanged; :func:`exchange_samples` runs one
``all_to_all_single`` per dtype over one DP group, one flat buffer per dtype. Samples already
on their replica do not travel. A piece for loops of one's own (docs/wrapper.md, "Using the
pieces"); the wrapper sends every rank only its CP shard of each sequence
(:mod:`seqpack.collective.cp_exchange`), whose :class:`Exchanged` and :class:`ExchangePlan`
are these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from seqpack.collective.groups import all_gather_objects, collective, comm_device, group_rank, group_size
from seqpack.errors import ConfigError, SampleError
from seqpack.schedulers.schedule import Schedule

__all__ = ["ExchangePlan", "Exchanged", "exchange_samples", "plan_exchange"]


@dataclasses.dataclass(frozen=True)
class ExchangePlan:
    """Who sends what to whom, computed identically and locally on every rank.

    Attributes:
        rank: This rank's index in the DP group.
        send_ids: Per destination replica, the global ids this rank sends (ascending; empty
            for itself).
        recv_ids: Per source replica, the global ids this rank receives (ascending).
        keep_ids: This rank's ids that stay here (no copy over the wire).
        send_tokens, recv_tokens: int64 ``[dp]`` tokens per peer (per key).
        moved_tokens: Tokens crossing the wire in the whole group (per key).
    """

    rank: int
    send_ids: list[np.ndarray]
    recv_ids: list[np.ndarray]
    keep_ids: np.ndarray
    send_tokens: np.ndarray
    recv_tokens: np.ndarray
    moved_tokens: int


def plan_exchange(destination: np.ndarray, sizes: np.ndarray, counts: np.ndarray, rank: int) -> ExchangePlan:
    """Plan the all-to-all of one step (pure).

    Args:
        destination: int64 ``[N]`` replica of every global id, ``-1`` for ids that go
            nowhere (deferred, dropped).
        sizes: int64 ``[N]`` tokens each id carries (per key).
        counts: int64 ``[dp]`` samples held by each DP rank (global ids are contiguous
            blocks in rank order).
        rank: This rank.
    """
    destination = np.asarray(destination, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    dp = counts.shape[0]
    if destination.shape != sizes.shape or destination.shape[0] != int(counts.sum()):
        raise ConfigError(
            f"destination ({destination.shape[0]}), sizes ({sizes.shape[0]}) and sum(counts) "
            f"({int(counts.sum())}) must all be the number of samples"
        )
    if not 0 <= rank < dp:
        raise ConfigError(f"rank={rank} is out of range for {dp} DP ranks")
    if destination.size and (destination.min() < -1 or destination.max() >= dp):
        raise ConfigError(f"destination must hold replicas in -1..{dp - 1}")
    # O(N log N + dp): one sort of this rank's outgoing ids by destination, one scan for the
    # incoming ones (ids are contiguous per origin, so they arrive grouped by source).
    starts = np.zeros(dp + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    origin = np.repeat(np.arange(dp, dtype=np.int64), counts)
    moving = (destination >= 0) & (destination != origin)
    lo, hi = int(starts[rank]), int(starts[rank + 1])
    block = np.arange(lo, hi, dtype=np.int64)
    outgoing = block[moving[lo:hi]]
    order = np.argsort(destination[outgoing], kind="stable")  # ids stay ascending per peer
    outgoing = outgoing[order]
    send_bounds = np.searchsorted(destination[outgoing], np.arange(dp + 1, dtype=np.int64))
    incoming = np.flatnonzero(moving & (destination == rank)).astype(np.int64)
    recv_bounds = np.searchsorted(incoming, starts)
    send_ids = [outgoing[send_bounds[d] : send_bounds[d + 1]] for d in range(dp)]
    recv_ids = [incoming[recv_bounds[s] : recv_bounds[s + 1]] for s in range(dp)]
    keep_ids = block[destination[lo:hi] == rank]
    send_tokens = _sums_between(sizes[outgoing], send_bounds)
    recv_tokens = _sums_between(sizes[incoming], recv_bounds)
    return ExchangePlan(rank, send_ids, recv_ids, keep_ids, send_tokens, recv_tokens, int(sizes[moving].sum()))


def _sums_between(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64 sums of ``values[bounds[i]:bounds[i + 1]]`` for every ``i``."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[bounds[1:]] - csum[bounds[:-1]]


@dataclasses.dataclass
class Exchanged:
    """What :func:`exchange_samples` delivered to this rank.

    Attributes:
        samples: Global id to sample (``{key: 1-D tensor}``) for every id scheduled on this
            replica, truncated to its scheduled length.
        bytes_sent, bytes_received: Over the wire, this rank.
        bytes_kept: Payload of samples that stayed on this rank (not sent).
    """

    samples: dict[int, dict[str, torch.Tensor]]
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_kept: int = 0


def _schema_of(sample: Mapping[str, Any]) -> list[tuple[str, torch.dtype]]:
    return [(key, torch.as_tensor(value).dtype) for key, value in sorted(sample.items()) if value is not None]


def exchange_samples(
    samples: Sequence[Mapping[str, torch.Tensor]],
    schedule: Schedule | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    group: ProcessGroup | None = None,
    *,
    schema: Sequence[tuple[str, torch.dtype]] | None = None,
    sizes: np.ndarray | None = None,
) -> Exchanged:
    """Move this DP rank's samples to the replicas the schedule chose; all ranks call it.

    One ``all_to_all_single`` per dtype over ``group`` (the DP group of one CP lane): the
    keys of one dtype travel in one flat buffer, sample-major, ids ascending. Split sizes
    come from the global lengths, which every rank knows; ranks that send or receive
    nothing take part with empty buffers, and a dtype nothing crosses the wire for skips
    its collective on every rank.

    Args:
        samples: This rank's samples, in local order (global ids ``offsets[rank]...``).
        schedule: The step's ``Schedule``, or an int64 ``[N]`` array of destination
            replicas (``-1``: goes nowhere).
        counts: Samples per DP rank (``GatheredLengths.counts``).
        group: The DP group (``None``: one rank).
        schema: ``(key, dtype)`` pairs every rank moves, identical on all ranks. ``None``
            agrees on it with an ``all_gather_object`` (one extra collective).
        sizes: Tokens each id carries (default ``schedule.lengths``: truncated lengths).

    Raises:
        SampleError: A sample shorter than its size, or ranks holding different keys.
    """
    counts = np.asarray(counts, dtype=np.int64)
    rank = group_rank(group)
    destination, sizes = _destinations(schedule, sizes)
    if len(samples) != int(counts[rank]):
        raise ConfigError(f"this rank holds {len(samples)} samples but counts[{rank}]={int(counts[rank])}")
    if schema is None:
        schema = _agreed_schema(samples, group)
    plan = plan_exchange(destination, sizes, counts, rank)
    take = _Taker(samples, sizes, offset=int(counts[:rank].sum()))
    received: dict[int, dict[str, torch.Tensor]] = {}
    bytes_kept = 0
    for gid in plan.keep_ids.tolist():
        received[gid] = {key: take(gid, key, dtype) for key, dtype in schema}
        bytes_kept += sum(t.numel() * t.element_size() for t in received[gid].values())
    recv_order = np.concatenate(plan.recv_ids) if plan.recv_ids else np.zeros(0, np.int64)
    for gid in recv_order.tolist():
        received[gid] = {}
    bytes_sent = bytes_received = 0
    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, dtype in schema:
        by_dtype.setdefault(dtype, []).append(key)
    for dtype, keys in by_dtype.items():
        if plan.moved_tokens == 0:
            break  # nothing crosses the wire anywhere: every rank skips the collective
        sent, got = _move(plan, take, recv_order, dtype, keys, received, group)
        bytes_sent, bytes_received = bytes_sent + sent, bytes_received + got
    for gid in recv_order.tolist():  # zero-token samples never touch a buffer
        for key, dtype in schema:
            received[gid].setdefault(key, torch.zeros(0, dtype=dtype))
    return Exchanged(received, bytes_sent, bytes_received, bytes_kept)


def _destinations(schedule: Schedule | np.ndarray, sizes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The replica of every global id and the tokens it carries."""
    if isinstance(schedule, Schedule):
        destination = schedule.replica_of()
        sizes = schedule.lengths if sizes is None else sizes
    else:
        destination = np.asarray(schedule, dtype=np.int64)
        if sizes is None:
            raise ConfigError("sizes is required when a destination array is given instead of a Schedule")
    return destination, np.asarray(sizes, dtype=np.int64)


def _agreed_schema(
    samples: Sequence[Mapping[str, torch.Tensor]], group: ProcessGroup | None
) -> list[tuple[str, torch.dtype]]:
    """The keys and dtypes every rank moves, agreed with one ``all_gather_object``."""
    local = _schema_of(samples[0]) if samples else None
    schemas = [local] if group_size(group) == 1 else all_gather_objects(local, group)
    known = [s for s in schemas if s is not None]
    if any(s != known[0] for s in known):
        raise SampleError(f"DP ranks hold samples with different keys/dtypes: {schemas}")
    return list(known[0]) if known else []


class _Taker:
    """The first ``sizes[gid]`` tokens of one key of this rank's sample ``gid``, in ``dtype``."""

    def __init__(self, samples: Sequence[Mapping[str, torch.Tensor]], sizes: np.ndarray, offset: int) -> None:
        self.samples, self.sizes, self.offset = samples, sizes, offset

    def __call__(self, gid: int, key: str, dtype: torch.dtype) -> torch.Tensor:
        value = self.samples[gid - self.offset][key]
        n = int(self.sizes[gid])
        if value.shape[0] < n:
            raise SampleError(
                f"global sample {gid} of this step has {value.shape[0]} tokens in {key!r} but is scheduled with {n}"
            )
        return value[:n].to(dtype)


def _move(
    plan: ExchangePlan,
    take: _Taker,
    recv_order: np.ndarray,
    dtype: torch.dtype,
    keys: list[str],
    received: dict[int, dict[str, torch.Tensor]],
    group: ProcessGroup | None,
) -> tuple[int, int]:
    """One ``all_to_all_single`` moving the ``keys`` of one dtype (sample-major, ids
    ascending) into ``received``; returns the bytes sent and received."""
    width = len(keys)
    parts = [take(gid, key, dtype) for ids in plan.send_ids for gid in ids.tolist() for key in keys]
    send = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
    device = comm_device(group)
    out = torch.empty(int(plan.recv_tokens.sum()) * width, dtype=dtype, device=device)
    collective(
        dist.all_to_all_single,
        out,
        send.to(device),
        output_split_sizes=(plan.recv_tokens * width).tolist(),
        input_split_sizes=(plan.send_tokens * width).tolist(),
        group=group,
    )
    out = out.cpu()
    if recv_order.size:
        pieces = torch.split(out, np.repeat(take.sizes[recv_order], width).tolist())
        for i, gid in enumerate(recv_order.tolist()):
            for j, key in enumerate(keys):
                received[gid][key] = pieces[i * width + j]
    return send.numel() * send.element_size(), out.numel() * out.element_size()
