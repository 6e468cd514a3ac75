"""Collectives of the distributed wrapper, each callable on its own.

- :func:`gather_lengths`: every DP rank's lengths in global order, with a fixed-size int64
  header per rank (status, count, caller fields) so that a rank with bad input or no data
  makes *every* rank raise or stop, instead of leaving one waiting in a collective.
- :func:`agree_status`: one small all-reduce that makes the ranks of a group agree on a
  status (ok / end of data / error, with the failing rank's message) and, optionally, on a
  schedule fingerprint.
- :func:`plan_exchange` (pure) and :func:`exchange_samples`: move samples to the replica
  the schedule chose with ``all_to_all_single`` over one DP group (the ranks of one CP
  lane), one flat buffer per dtype; split sizes follow from the global lengths every rank
  already has, so no count is exchanged; samples already on their replica do not travel.
- :func:`broadcast_step` (:func:`broadcast_tp`, :func:`broadcast_pp`): one step's
  microbatches from TP rank 0 to the other TP ranks (tokens and layout) or from the first
  pipeline stage to the others (layout only), in the wire format below.
- :func:`encode_step` / :func:`decode_step`: the wire format as pure functions.

Wire format (version 1)
-----------------------
Everything that describes a step is int64; floats only carry float data (``loss_mask``).
No sentinel values: every variable-length field has its length in the header.

A message is up to four buffers, broadcast in this order:

1. ``prefix``: int64[8], fixed size, so a receiver knows what to allocate::

       [0] format version (1)        [4] int64 payload words after the header
       [1] kind (1 batch, 2 layout)  [5] float32 payload words
       [2] status (0 ok, 1 end of    [6] message bytes (UTF-8; only with status 2)
           data, 2 error)            [7] num_microbatches M
       [3] header_len: int64 words of the whole header, prefix included

2. ``ints``: int64, the rest of the header followed by the int64 payload.
   Header (``header_len - 8`` words): 16 step words ::

       step, flags (1 = tokens, 2 = position_ids), schedule fingerprint, empty samples,
       sequences dropped at end of data, dp_size and cp_size of the schedule, cp_size and
       cp_rank of the shards, max_tokens_per_rank, pad_multiple, N (global sequences),
       assigned ids A, deferred D, dropped R, truncated U

   then 3 words per microbatch: ``total padded tokens T_m (all CP ranks), sequences n_m,
   max_seqlen_m``. Payload: the schedule (``original_lengths[N]``, ``lengths[N]``, id counts per
   (microbatch, replica) cell ``[M*dp]``, assigned ids ``[A]``, deferred ``[D]``, dropped
   ``[R]``, truncated ``[U]``) so every receiver rebuilds the exact ``Schedule`` and
   ``StepStats``; then per microbatch ``cu_seqlens[n_m+1]``, ``cu_seqlens_padded[n_m+1]``,
   ``sample_ids[n_m]``; then, with flag 1, ``input_ids`` and ``labels`` of this CP rank's
   shard (``sum T_m / cp`` each), and with flag 2 ``position_ids`` (only when samples carry
   their own).
3. ``floats``: float32 ``loss_mask`` of the shard (flag 1 only).
4. ``message``: uint8, the error text (status 2 only).

``position_ids`` (by default), ``seq_idx`` and ``padding_mask`` are not sent: receivers
rebuild them from ``cu_seqlens*`` and cut this CP rank's DualChunkSwap shard
(:func:`batch_from_layout`). Kind 2 (layout, to middle pipeline stages) has no flag 1 and
yields batches whose ``input_ids``, ``labels``, ``loss_mask`` are ``None``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.cp import partition_indices
from seqpack.schedulers.base import Schedule
from seqpack.thd import PackedBatch

__all__ = [
    "FORMAT_VERSION",
    "KIND_BATCH",
    "KIND_LAYOUT",
    "STATUS_OK",
    "STATUS_END",
    "STATUS_ERROR",
    "ExchangePlan",
    "Exchanged",
    "GatheredLengths",
    "StepMessage",
    "WireBuffers",
    "agree_status",
    "batch_from_layout",
    "broadcast_pp",
    "broadcast_step",
    "broadcast_tp",
    "decode_prefix",
    "decode_step",
    "encode_step",
    "exchange_samples",
    "gather_lengths",
    "plan_exchange",
]

FORMAT_VERSION = 1
KIND_BATCH = 1  # TP broadcast: tokens and layout
KIND_LAYOUT = 2  # PP broadcast: layout only
STATUS_OK = 0
STATUS_END = 1
STATUS_ERROR = 2
FLAG_TOKENS = 1
FLAG_POSITION_IDS = 2

PREFIX_WORDS = 8
P_VERSION, P_KIND, P_STATUS, P_HEADER_LEN, P_INT_WORDS, P_FLOAT_WORDS, P_MESSAGE_BYTES, P_NUM_MICROBATCHES = range(8)
STEP_WORDS = 16
(
    S_STEP,
    S_FLAGS,
    S_FINGERPRINT,
    S_EMPTY,
    S_DROPPED_AT_END,
    S_DP,
    S_SCHEDULE_CP,
    S_CP,
    S_CP_RANK,
    S_MAX_TOKENS,
    S_PAD_MULTIPLE,
    S_NUM_SEQ,
    S_NUM_ASSIGNED,
    S_NUM_DEFERRED,
    S_NUM_DROPPED,
    S_NUM_TRUNCATED,
) = range(STEP_WORDS)
MB_WORDS = 3
_FP_MAX = (1 << 63) - 1
_STATUS_NAMES = {STATUS_OK: "ok", STATUS_END: "end of data", STATUS_ERROR: "error"}


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def _group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


def _comm_device(group: Any) -> torch.device:
    """Device collectives on ``group`` need: CUDA for NCCL, CPU otherwise."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_objects(obj: Any, group: Any) -> list[Any]:
    out: list[Any] = [None] * _group_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


# ---------------------------------------------------------------------------------------
# agreement and length gathering
# ---------------------------------------------------------------------------------------


def agree_status(
    status: int,
    message: str | None = None,
    group: Any = None,
    *,
    fingerprint: int | None = None,
    axis: str = "",
    what: str = "schedules",
) -> tuple[int, str | None]:
    """Make the ranks of ``group`` agree on a status; all ranks must call it.

    One int64 all-reduce (MAX) of ``[status, fingerprint, 2**63-1-fingerprint, has_fp]``.
    The agreed status is the worst one (error > end of data > ok); on error every rank
    fetches the messages (``all_gather_object``, on this path only) and returns the one of
    the lowest group rank that failed. Ranks that pass a fingerprint must all pass the
    same one, else the agreed status is an error naming every rank's fingerprint (``what``
    says what was fingerprinted).

    Returns:
        ``(status, message)``, identical on every rank of the group.
    """
    if status not in _STATUS_NAMES:
        raise ValueError(f"status must be one of {sorted(_STATUS_NAMES)}, got {status!r}")
    if _group_size(group) == 1:
        return status, message if status == STATUS_ERROR else None
    fp = -1 if fingerprint is None else int(fingerprint)
    if fingerprint is not None and not 0 <= fp <= _FP_MAX:
        raise ValueError(f"fingerprint must be in 0..2**63-1, got {fingerprint!r}")
    has = fingerprint is not None
    vec = torch.tensor([status, fp if has else 0, _FP_MAX - fp if has else 0, int(has)], dtype=torch.int64)
    vec = vec.to(_comm_device(group))
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
    agreed, fp_max, fp_min_c, any_fp = (int(v) for v in vec.cpu())
    if agreed == STATUS_ERROR:
        messages = _all_gather_objects(message if status == STATUS_ERROR else None, group)
        first = next((m for m in messages if m), None)
        return STATUS_ERROR, first or "a rank reported an error without a message"
    if any_fp and fp_max != _FP_MAX - fp_min_c:
        fps = _all_gather_objects(fingerprint, group)
        listed = ", ".join(f"{axis or 'group'} rank {r}: {v}" for r, v in enumerate(fps) if v is not None)
        return STATUS_ERROR, f"ranks of the {axis or 'same'} group disagree on {what} (fingerprints {listed})"

    return agreed, None


@dataclasses.dataclass(frozen=True)
class GatheredLengths:
    """Lengths of every DP rank, in global order (DP rank 0's samples first).

    Attributes:
        lengths: int64 ``[N]``.
        counts: int64 ``[dp]`` samples per DP rank.
        extras: int64 ``[dp, k]`` the caller's header fields of every rank.
    """

    lengths: np.ndarray
    counts: np.ndarray
    extras: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        """int64 ``[dp+1]``: global ids of DP rank ``r`` are ``offsets[r]:offsets[r+1]``."""
        out = np.zeros(self.counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.counts, out=out[1:])
        return out

    def origin(self) -> np.ndarray:
        """DP rank holding each global id (int64 ``[N]``)."""
        return np.repeat(np.arange(self.counts.shape[0], dtype=np.int64), self.counts)


def gather_lengths(
    lengths: Sequence[int] | np.ndarray,
    group: Any = None,
    *,
    error: str | None = None,
    extras: Sequence[int] | np.ndarray = (),
) -> GatheredLengths:
    """All-gather every DP rank's lengths over ``group``; all ranks must call it.

    First an int64 header per rank (``[version, status, count, k, *extras]``), then the
    lengths padded to the largest count. Validate local samples *before* calling and pass
    the problem as ``error``: then no rank is left in a collective, every rank raises.

    Args:
        lengths: This rank's sample lengths.
        group: The DP group (``None``: a single rank).
        error: This rank's bad-input message, or ``None``.
        extras: Caller fields (ints) every rank passes the same number of, returned per
            rank in ``GatheredLengths.extras``.

    Raises:
        ValueError: On every rank when any rank passed ``error`` (the lowest failing DP
            rank's message), or when ranks disagree on the format version or on ``k``.
    """
    local = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64).reshape(-1))
    extra = np.asarray(extras, dtype=np.int64).reshape(-1)
    status = STATUS_OK if error is None else STATUS_ERROR
    header = np.concatenate([np.array([FORMAT_VERSION, status, local.shape[0], extra.shape[0]], np.int64), extra])
    size = _group_size(group)
    if size == 1:
        if error is not None:
            raise ValueError(error)
        return GatheredLengths(local.copy(), np.array([local.shape[0]], np.int64), extra[None, :].copy())
    device = _comm_device(group)
    mine = torch.from_numpy(header).to(device)
    parts = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(parts, mine, group=group)
    headers = torch.stack(parts).cpu().numpy()
    if np.any(headers[:, 0] != FORMAT_VERSION) or np.any(headers[:, 3] != extra.shape[0]):
        raise ValueError(
            f"DP ranks run different seqpack versions or wrappers: header versions {headers[:, 0].tolist()}, "
            f"extra field counts {headers[:, 3].tolist()}"
        )
    if np.any(headers[:, 1] == STATUS_ERROR):
        messages = _all_gather_objects(error, group)
        raise ValueError(next(m for m in messages if m))
    counts = headers[:, 2].copy()
    width = int(counts.max(initial=0))
    if width == 0:
        gathered = np.zeros(0, dtype=np.int64)
    else:
        padded = torch.zeros(width, dtype=torch.int64)
        padded[: local.shape[0]] = torch.from_numpy(local)
        padded = padded.to(device)
        rows = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(rows, padded, group=group)
        table = torch.stack(rows).cpu().numpy()
        gathered = np.concatenate([table[r, : counts[r]] for r in range(size)])
    return GatheredLengths(gathered, counts, headers[:, 4:].copy())


# ---------------------------------------------------------------------------------------
# sample exchange
# ---------------------------------------------------------------------------------------


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


def plan_exchange(
    destination: np.ndarray, sizes: np.ndarray, counts: np.ndarray, rank: int
) -> ExchangePlan:
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
        raise ValueError(
            f"destination ({destination.shape[0]}), sizes ({sizes.shape[0]}) and sum(counts) "
            f"({int(counts.sum())}) must all be the number of samples"
        )
    if not 0 <= rank < dp:
        raise ValueError(f"rank={rank} is out of range for {dp} DP ranks")
    if destination.size and (destination.min() < -1 or destination.max() >= dp):
        raise ValueError(f"destination must hold replicas in -1..{dp - 1}")
    origin = np.repeat(np.arange(dp, dtype=np.int64), counts)
    ids = np.arange(destination.shape[0], dtype=np.int64)
    moving = (destination >= 0) & (destination != origin)
    mine = origin == rank
    to_me = destination == rank
    send_ids = [ids[mine & moving & (destination == d)] for d in range(dp)]
    recv_ids = [ids[to_me & moving & (origin == s)] for s in range(dp)]
    keep_ids = ids[mine & to_me]
    send_tokens = np.array([int(sizes[i].sum()) for i in send_ids], dtype=np.int64)
    recv_tokens = np.array([int(sizes[i].sum()) for i in recv_ids], dtype=np.int64)
    return ExchangePlan(rank, send_ids, recv_ids, keep_ids, send_tokens, recv_tokens, int(sizes[moving].sum()))


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
    group: Any = None,
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
        ValueError: A sample shorter than its size, or a missing key.
    """
    counts = np.asarray(counts, dtype=np.int64)
    rank = _group_rank(group)
    if isinstance(schedule, Schedule):
        destination = schedule.placement()[0]
        sizes = schedule.lengths if sizes is None else sizes
    else:
        destination = np.asarray(schedule, dtype=np.int64)
        if sizes is None:
            raise ValueError("sizes is required when a destination array is given instead of a Schedule")
    if len(samples) != int(counts[rank]):
        raise ValueError(f"this rank holds {len(samples)} samples but counts[{rank}]={int(counts[rank])}")
    if schema is None:
        local = _schema_of(samples[0]) if samples else None
        schemas = [local] if _group_size(group) == 1 else _all_gather_objects(local, group)
        known = [s for s in schemas if s is not None]
        if any(s != known[0] for s in known):
            raise ValueError(f"DP ranks hold samples with different keys/dtypes: {schemas}")
        schema = known[0] if known else []
    plan = plan_exchange(destination, np.asarray(sizes, dtype=np.int64), counts, rank)
    sizes = np.asarray(sizes, dtype=np.int64)
    offset = int(counts[:rank].sum())

    def take(gid: int, key: str, dtype: torch.dtype) -> torch.Tensor:
        value = samples[gid - offset][key]
        n = int(sizes[gid])
        if value.shape[0] < n:
            raise ValueError(f"sample {gid} has {value.shape[0]} tokens in {key!r} but is scheduled with {n}")
        return value[:n].to(dtype)

    received: dict[int, dict[str, torch.Tensor]] = {}
    bytes_kept = 0
    for gid in plan.keep_ids.tolist():
        received[gid] = {key: take(gid, key, dtype) for key, dtype in schema}
        bytes_kept += sum(t.numel() * t.element_size() for t in received[gid].values())

    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, dtype in schema:
        by_dtype.setdefault(dtype, []).append(key)
    recv_order = np.concatenate(plan.recv_ids) if plan.recv_ids else np.zeros(0, np.int64)
    for gid in recv_order.tolist():
        received[gid] = {}
    bytes_sent = bytes_received = 0
    device = _comm_device(group)
    for dtype, keys in by_dtype.items():
        if plan.moved_tokens == 0:
            break  # nothing crosses the wire anywhere: every rank skips the collective
        width = len(keys)
        parts = [take(gid, key, dtype) for ids in plan.send_ids for gid in ids.tolist() for key in keys]
        send = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
        out = torch.empty(int(plan.recv_tokens.sum()) * width, dtype=dtype, device=device)
        dist.all_to_all_single(
            out,
            send.to(device),
            output_split_sizes=(plan.recv_tokens * width).tolist(),
            input_split_sizes=(plan.send_tokens * width).tolist(),
            group=group,
        )
        out = out.cpu()
        bytes_sent += send.numel() * send.element_size()
        bytes_received += out.numel() * out.element_size()
        if recv_order.size:
            pieces = torch.split(out, np.repeat(sizes[recv_order], width).tolist())
            for i, gid in enumerate(recv_order.tolist()):
                for j, key in enumerate(keys):
                    received[gid][key] = pieces[i * width + j]
    for gid in recv_order.tolist():  # zero-token samples never touch a buffer
        for key, dtype in schema:
            received[gid].setdefault(key, torch.zeros(0, dtype=dtype))
    return Exchanged(received, bytes_sent, bytes_received, bytes_kept)


# ---------------------------------------------------------------------------------------
# layout -> batch
# ---------------------------------------------------------------------------------------


def batch_from_layout(
    cu_seqlens: torch.Tensor | np.ndarray,
    cu_seqlens_padded: torch.Tensor | np.ndarray,
    max_seqlen: int,
    sample_ids: torch.Tensor | np.ndarray,
    cp_size: int = 1,
    cp_rank: int = 0,
    *,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> PackedBatch:
    """A (CP-sharded) ``PackedBatch`` whose layout fields are rebuilt from ``cu_seqlens*``.

    ``position_ids`` (unless given), ``seq_idx`` and ``padding_mask`` follow from the
    layout exactly as :func:`seqpack.thd.pack_sequences` builds them, then this CP rank's
    DualChunkSwap shard is taken. Token tensors, when given, must already be the shard.
    Without them the batch is metadata-only (what middle pipeline stages get).
    """
    cu = torch.as_tensor(cu_seqlens).to(torch.int64)
    cu_padded = torch.as_tensor(cu_seqlens_padded).to(torch.int64)
    padded = cu_padded[1:] - cu_padded[:-1]  # [N]
    real = cu[1:] - cu[:-1]  # [N]
    total = int(cu_padded[-1])
    num_seqs = int(padded.shape[0])
    starts = torch.repeat_interleave(cu_padded[:-1], padded, output_size=total)  # [T]
    within = torch.arange(total, dtype=torch.int64) - starts  # [T]
    seq_idx = torch.repeat_interleave(torch.arange(num_seqs, dtype=torch.int32), padded, output_size=total)
    padding_mask = within >= torch.repeat_interleave(real, padded, output_size=total)
    if cp_size > 1:
        index = partition_indices(cu_padded, total, cp_size, cp_rank)
        within, seq_idx, padding_mask = within[index], seq_idx[index], padding_mask[index]
    cu32 = cu.to(torch.int32)
    cu_padded32 = cu32 if torch.equal(cu, cu_padded) else cu_padded.to(torch.int32)
    local = total // cp_size
    tokens = {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    for name, value in tokens.items():
        if value is not None and value.shape[0] != local:
            raise ValueError(f"{name} has {value.shape[0]} tokens but the layout gives {local} to CP rank {cp_rank}")
    return PackedBatch(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=within if position_ids is None else position_ids,
        seq_idx=seq_idx,
        padding_mask=padding_mask,
        cu_seqlens=cu32,
        cu_seqlens_padded=cu_padded32,
        max_seqlen=int(max_seqlen),
        sample_ids=torch.as_tensor(sample_ids).to(torch.int64),
        cp_size=cp_size,
        cp_rank=cp_rank,
    )


# ---------------------------------------------------------------------------------------
# wire format
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class StepMessage:
    """One step as it travels over TP / PP: status, schedule and this CP rank's batches.

    Attributes:
        status: ``STATUS_OK``, ``STATUS_END`` or ``STATUS_ERROR``.
        step: Step index.
        schedule: The step's schedule (``None`` unless status is ok).
        microbatches: This CP rank's microbatches (token fields ``None`` for layout).
        empty_samples: Zero-length samples dropped this step (global).
        dropped_at_end: Sequences dropped with the partial last step (global).
        message: Error text (status error only).
        position_ids: Samples carried their own ``position_ids`` (sent on the wire).
    """

    status: int
    step: int = 0
    schedule: Schedule | None = None
    microbatches: list[PackedBatch] = dataclasses.field(default_factory=list)
    empty_samples: int = 0
    dropped_at_end: int = 0
    message: str = ""
    position_ids: bool = False

    @property
    def fingerprint(self) -> int:
        return self.schedule.fingerprint() if self.schedule is not None else 0


@dataclasses.dataclass
class WireBuffers:
    """The buffers of one message: ``prefix`` int64[8], ``ints`` int64 (header rest and
    payload), ``floats`` float32, ``message`` uint8."""

    prefix: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    message: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.prefix, self.ints, self.floats, self.message))


def encode_step(msg: StepMessage, *, kind: int = KIND_BATCH) -> WireBuffers:
    """Serialise ``msg`` (pure). ``kind=KIND_LAYOUT`` leaves the tokens out.

    Raises:
        ValueError: Unknown kind or status, a batch without tokens for ``KIND_BATCH``, or
            microbatches sharded for different CP ranks.
    """
    if kind not in (KIND_BATCH, KIND_LAYOUT):
        raise ValueError(f"kind must be KIND_BATCH (1) or KIND_LAYOUT (2), got {kind!r}")
    if msg.status not in _STATUS_NAMES:
        raise ValueError(f"status must be one of {sorted(_STATUS_NAMES)}, got {msg.status!r}")
    step = np.zeros(STEP_WORDS, dtype=np.int64)
    step[S_STEP] = msg.step
    step[S_EMPTY] = msg.empty_samples
    step[S_DROPPED_AT_END] = msg.dropped_at_end
    message = np.frombuffer(msg.message.encode("utf-8"), dtype=np.uint8) if msg.status == STATUS_ERROR else None
    if msg.status != STATUS_OK:
        prefix = np.array(
            [FORMAT_VERSION, kind, msg.status, PREFIX_WORDS + STEP_WORDS, 0, 0,
             0 if message is None else message.size, 0],
            dtype=np.int64,
        )
        return WireBuffers(
            torch.from_numpy(prefix),
            torch.from_numpy(step),
            torch.zeros(0, dtype=torch.float32),
            torch.from_numpy(message.copy()) if message is not None else torch.zeros(0, dtype=torch.uint8),
        )
    sched = msg.schedule
    if sched is None:
        raise ValueError("a message with status ok needs its schedule")
    batches = msg.microbatches
    if len(batches) != sched.num_microbatches:
        raise ValueError(f"{len(batches)} microbatches for a schedule of {sched.num_microbatches}")
    tokens = kind == KIND_BATCH
    cp_size = batches[0].cp_size if batches else sched.cp_size
    cp_rank = batches[0].cp_rank if batches else 0
    for m, b in enumerate(batches):
        if (b.cp_size, b.cp_rank) != (cp_size, cp_rank):
            raise ValueError(f"microbatch {m} is shard {b.cp_rank}/{b.cp_size}, microbatch 0 is {cp_rank}/{cp_size}")
        if tokens and b.input_ids is None:
            raise ValueError(f"microbatch {m} has no tokens; a KIND_BATCH message needs them")
    flags = (FLAG_TOKENS if tokens else 0) | (FLAG_POSITION_IDS if msg.position_ids else 0)
    cells = [ids for row in sched.assignment for ids in row]
    assigned = np.concatenate(cells) if cells else np.zeros(0, np.int64)
    step[S_FLAGS] = flags
    step[S_FINGERPRINT] = sched.fingerprint()
    step[S_DP] = sched.dp_size
    step[S_SCHEDULE_CP] = sched.cp_size
    step[S_CP] = cp_size
    step[S_CP_RANK] = cp_rank
    step[S_MAX_TOKENS] = sched.max_tokens_per_rank
    step[S_PAD_MULTIPLE] = sched.pad_multiple
    step[S_NUM_SEQ] = sched.num_sequences
    step[S_NUM_ASSIGNED] = assigned.shape[0]
    step[S_NUM_DEFERRED] = sched.deferred.shape[0]
    step[S_NUM_DROPPED] = sched.dropped.shape[0]
    step[S_NUM_TRUNCATED] = sched.truncated.shape[0]
    per_mb = np.array(
        [[int(b.cu_seqlens_padded[-1]), b.num_sequences, b.max_seqlen] for b in batches], dtype=np.int64
    ).reshape(-1)
    int_parts: list[torch.Tensor] = [
        torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        for a in (
            step,
            per_mb,
            sched.original_lengths,
            sched.lengths,
            np.array([ids.shape[0] for ids in cells], dtype=np.int64),
            assigned,
            sched.deferred,
            sched.dropped,
            sched.truncated,
        )
    ]
    for b in batches:
        int_parts += [b.cu_seqlens.to(torch.int64), b.cu_seqlens_padded.to(torch.int64), b.sample_ids.to(torch.int64)]
    header_words = STEP_WORDS + per_mb.shape[0]
    if tokens:
        int_parts += [b.input_ids.to(torch.int64) for b in batches] + [b.labels.to(torch.int64) for b in batches]
    if msg.position_ids:
        int_parts += [b.position_ids.to(torch.int64) for b in batches]
    ints = torch.cat([p.reshape(-1).cpu() for p in int_parts])
    floats = (
        torch.cat([b.loss_mask.to(torch.float32).cpu() for b in batches]) if tokens and batches
        else torch.zeros(0, dtype=torch.float32)
    )
    prefix = torch.tensor(
        [
            FORMAT_VERSION,
            kind,
            STATUS_OK,
            PREFIX_WORDS + header_words,
            ints.shape[0] - header_words,
            floats.shape[0],
            0,
            len(batches),
        ],
        dtype=torch.int64,
    )
    return WireBuffers(prefix, ints, floats, torch.zeros(0, dtype=torch.uint8))


@dataclasses.dataclass(frozen=True)
class WirePrefix:
    """The decoded fixed prefix: what to allocate for the rest of the message."""

    kind: int
    status: int
    header_len: int
    int_words: int
    float_words: int
    message_bytes: int
    num_microbatches: int

    @property
    def ints_len(self) -> int:
        """Words of the ``ints`` buffer: header after the prefix, then the int64 payload."""
        return self.header_len - PREFIX_WORDS + self.int_words


def decode_prefix(prefix: torch.Tensor | np.ndarray) -> WirePrefix:
    """Check and decode the fixed prefix.

    Raises:
        ValueError: Wrong size, another format version, unknown kind or status, or
            negative lengths.
    """
    p = np.asarray(prefix.cpu() if isinstance(prefix, torch.Tensor) else prefix, dtype=np.int64).reshape(-1)
    if p.shape[0] != PREFIX_WORDS:
        raise ValueError(f"wire prefix has {p.shape[0]} words, expected {PREFIX_WORDS}")
    if p[P_VERSION] != FORMAT_VERSION:
        raise ValueError(
            f"wire format version {int(p[P_VERSION])} received, this seqpack speaks version {FORMAT_VERSION}: "
            "every rank must run the same seqpack"
        )
    if p[P_KIND] not in (KIND_BATCH, KIND_LAYOUT):
        raise ValueError(f"unknown message kind {int(p[P_KIND])} in wire prefix")
    if p[P_STATUS] not in _STATUS_NAMES:
        raise ValueError(f"unknown status {int(p[P_STATUS])} in wire prefix")
    sizes = (p[P_INT_WORDS], p[P_FLOAT_WORDS], p[P_MESSAGE_BYTES], p[P_NUM_MICROBATCHES])
    if p[P_HEADER_LEN] < PREFIX_WORDS + STEP_WORDS or min(sizes) < 0:
        raise ValueError(f"corrupt wire prefix {p.tolist()}")
    expected = PREFIX_WORDS + STEP_WORDS + MB_WORDS * int(p[P_NUM_MICROBATCHES])
    if p[P_HEADER_LEN] != expected:
        raise ValueError(
            f"wire header_len={int(p[P_HEADER_LEN])} but {int(p[P_NUM_MICROBATCHES])} microbatches need "
            f"{PREFIX_WORDS} + {STEP_WORDS} + {MB_WORDS}*{int(p[P_NUM_MICROBATCHES])} = {expected}"
        )
    return WirePrefix(
        kind=int(p[P_KIND]),
        status=int(p[P_STATUS]),
        header_len=int(p[P_HEADER_LEN]),
        int_words=int(p[P_INT_WORDS]),
        float_words=int(p[P_FLOAT_WORDS]),
        message_bytes=int(p[P_MESSAGE_BYTES]),
        num_microbatches=int(p[P_NUM_MICROBATCHES]),
    )


class _Cursor:
    """Consecutive slices of a 1-D buffer with bound checks."""

    def __init__(self, buf: torch.Tensor, what: str):
        self.buf, self.pos, self.what = buf, 0, what

    def take(self, n: int, field: str) -> torch.Tensor:
        if n < 0 or self.pos + n > self.buf.shape[0]:
            raise ValueError(
                f"truncated {self.what} buffer: {field} needs words {self.pos}..{self.pos + n} "
                f"but the buffer has {self.buf.shape[0]}"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def decode_step(buffers: WireBuffers, *, verify: bool = True) -> StepMessage:
    """Rebuild a :class:`StepMessage` from its buffers (pure).

    Args:
        buffers: The four buffers as sent.
        verify: Recompute the schedule fingerprint and compare it with the header's.

    Raises:
        ValueError: Version mismatch, truncated or oversized buffers, inconsistent
            counts, or (``verify``) a fingerprint mismatch.
    """
    p = decode_prefix(buffers.prefix)
    ints = buffers.ints.reshape(-1).to(torch.int64).cpu()
    floats = buffers.floats.reshape(-1).cpu()
    for name, got, want in (
        ("int64", ints.shape[0], p.ints_len),
        ("float32", floats.shape[0], p.float_words),
        ("message", buffers.message.numel(), p.message_bytes),
    ):
        if got != want:
            kind = "truncated" if got < want else "oversized"
            raise ValueError(f"{kind} {name} buffer: the wire prefix declares {want} words, got {got}")
    cur = _Cursor(ints, "int64")
    step = cur.take(STEP_WORDS, "step header").numpy()
    common = dict(step=int(step[S_STEP]), empty_samples=int(step[S_EMPTY]), dropped_at_end=int(step[S_DROPPED_AT_END]))
    if p.status != STATUS_OK:
        text = bytes(buffers.message.cpu().numpy().astype(np.uint8)).decode("utf-8", errors="replace")
        return StepMessage(status=p.status, message=text, **common)
    flags = int(step[S_FLAGS])
    if flags & FLAG_TOKENS and p.kind != KIND_BATCH:
        raise ValueError("a layout message must not carry tokens")
    per_mb = cur.take(MB_WORDS * p.num_microbatches, "microbatch header").reshape(-1, MB_WORDS).numpy()
    n, dp, m_count = int(step[S_NUM_SEQ]), int(step[S_DP]), p.num_microbatches
    original = cur.take(n, "original_lengths").numpy().copy()
    lengths = cur.take(n, "lengths").numpy().copy()
    cell_counts = cur.take(m_count * dp, "cell counts").numpy()
    assigned = cur.take(int(step[S_NUM_ASSIGNED]), "assigned ids").numpy().copy()
    if int(cell_counts.sum()) != assigned.shape[0]:
        raise ValueError(f"cell counts sum to {int(cell_counts.sum())} but {assigned.shape[0]} ids are assigned")
    deferred = cur.take(int(step[S_NUM_DEFERRED]), "deferred").numpy().copy()
    dropped = cur.take(int(step[S_NUM_DROPPED]), "dropped").numpy().copy()
    truncated = cur.take(int(step[S_NUM_TRUNCATED]), "truncated").numpy().copy()
    cells = np.split(assigned, np.cumsum(cell_counts)[:-1]) if cell_counts.size else []
    schedule = Schedule(
        num_microbatches=m_count,
        assignment=[[np.ascontiguousarray(cells[m * dp + d]) for d in range(dp)] for m in range(m_count)],
        lengths=lengths,
        original_lengths=original,
        dp_size=dp,
        cp_size=int(step[S_SCHEDULE_CP]),
        max_tokens_per_rank=int(step[S_MAX_TOKENS]),
        pad_multiple=int(step[S_PAD_MULTIPLE]),
        deferred=deferred,
        dropped=dropped,
        truncated=truncated,
    )
    if verify and schedule.fingerprint() != int(step[S_FINGERPRINT]):
        raise ValueError(
            f"schedule fingerprint {schedule.fingerprint()} of the decoded message differs from the sent "
            f"{int(step[S_FINGERPRINT])}: the message was corrupted"
        )
    cp_size, cp_rank = int(step[S_CP]), int(step[S_CP_RANK])
    layouts = []
    for m in range(m_count):
        total, num_seqs, _ = (int(v) for v in per_mb[m])
        cu = cur.take(num_seqs + 1, f"cu_seqlens of microbatch {m}")
        cu_padded = cur.take(num_seqs + 1, f"cu_seqlens_padded of microbatch {m}")
        ids = cur.take(num_seqs, f"sample_ids of microbatch {m}")
        if int(cu_padded[-1]) != total or total % cp_size:
            raise ValueError(f"microbatch {m}: cu_seqlens_padded ends at {int(cu_padded[-1])}, header says {total}")
        layouts.append((cu, cu_padded, ids))
    local = [int(per_mb[m, 0]) // cp_size for m in range(m_count)]
    token_fields: dict[str, list[torch.Tensor | None]] = {}
    if flags & FLAG_TOKENS:
        token_fields["input_ids"] = list(torch.split(cur.take(sum(local), "input_ids"), local))
        token_fields["labels"] = list(torch.split(cur.take(sum(local), "labels"), local))
        token_fields["loss_mask"] = list(torch.split(floats, local)) if m_count else []
    if flags & FLAG_POSITION_IDS:
        token_fields["position_ids"] = list(torch.split(cur.take(sum(local), "position_ids"), local))
    if cur.pos != ints.shape[0]:
        raise ValueError(f"int64 buffer has {ints.shape[0] - cur.pos} words past the declared fields")
    batches = []
    for m, (cu, cu_padded, ids) in enumerate(layouts):
        fields = {name: values[m].clone() for name, values in token_fields.items()}
        batches.append(
            batch_from_layout(cu, cu_padded, int(per_mb[m, 2]), ids.clone(), cp_size, cp_rank, **fields)
        )
    return StepMessage(
        status=STATUS_OK,
        schedule=schedule,
        microbatches=batches,
        position_ids=bool(flags & FLAG_POSITION_IDS),
        **common,
    )


def broadcast_step(
    msg: StepMessage | None,
    group: Any,
    *,
    kind: int = KIND_BATCH,
    src: int = 0,
    verify: bool = True,
    decode: bool = True,
    timings: dict[str, float] | None = None,
) -> StepMessage | None:
    """Broadcast one step from group rank ``src`` to the rest of ``group``; all ranks call it.

    The source passes its message and gets it back unchanged; receivers pass ``None`` and
    get the decoded message. Up to four broadcasts: the fixed prefix, the int64 buffer,
    then (only when non-empty) the float32 payload and the error text. The source's global
    rank is read from the group (``dist.get_global_rank``), never computed. A receiver
    that only has to take part (``decode=False``) gets ``None``. ``timings``, when given,
    accumulates ``"wait"``: seconds a receiver spent in the prefix broadcast, i.e. waiting
    for the source to be ready.
    """
    if _group_size(group) == 1:
        if msg is None:
            raise ValueError("a single-rank broadcast needs the message")
        return msg
    me = _group_rank(group)
    src_global = dist.get_global_rank(group, src)
    device = _comm_device(group)
    if me == src:
        if msg is None:
            raise ValueError(f"group rank {src} is the broadcast source and must pass the message")
        wire = encode_step(msg, kind=kind)
        dist.broadcast(wire.prefix.to(device), src_global, group=group)
        dist.broadcast(wire.ints.to(device), src_global, group=group)
        if wire.floats.numel():
            dist.broadcast(wire.floats.to(device), src_global, group=group)
        if wire.message.numel():
            dist.broadcast(wire.message.to(device), src_global, group=group)
        return msg
    prefix = torch.empty(PREFIX_WORDS, dtype=torch.int64, device=device)
    tick = time.perf_counter()
    dist.broadcast(prefix, src_global, group=group)
    if timings is not None:
        timings["wait"] = timings.get("wait", 0.0) + time.perf_counter() - tick
    p = decode_prefix(prefix)
    ints = torch.empty(p.ints_len, dtype=torch.int64, device=device)
    dist.broadcast(ints, src_global, group=group)
    floats = torch.empty(p.float_words, dtype=torch.float32, device=device)
    if p.float_words:
        dist.broadcast(floats, src_global, group=group)
    message = torch.empty(p.message_bytes, dtype=torch.uint8, device=device)
    if p.message_bytes:
        dist.broadcast(message, src_global, group=group)
    if not decode:
        return None
    return decode_step(WireBuffers(prefix.cpu(), ints.cpu(), floats.cpu(), message.cpu()), verify=verify)


def broadcast_tp(
    msg: StepMessage | None, group: Any, *, verify: bool = True, timings: dict[str, float] | None = None
) -> StepMessage:
    """TP broadcast: TP rank 0's microbatches (tokens and layout) to the other TP ranks."""
    return broadcast_step(msg, group, kind=KIND_BATCH, src=0, verify=verify, timings=timings)


def broadcast_pp(
    msg: StepMessage | None,
    group: Any,
    *,
    verify: bool = True,
    decode: bool = True,
    timings: dict[str, float] | None = None,
) -> StepMessage | None:
    """PP broadcast: the first stage's layout to the other stages (receivers get batches
    whose ``input_ids``, ``labels`` and ``loss_mask`` are ``None``; the last stage, which
    reads its own data, passes ``decode=False``)."""
    return broadcast_step(msg, group, kind=KIND_LAYOUT, src=0, verify=verify, decode=decode, timings=timings)
