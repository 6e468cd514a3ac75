"""The sample exchange of dynamic CP: every rank of a sequence's CP group gets its shard.

Under dynamic CP (docs/dynamic_cp.md) a sequence runs on a CP group, a block of the
``R = dp x cp`` plane ranks (DP-major); each rank of the group needs one DualChunkSwap shard
of it, a *piece*, cut and sent by one CP rank of the DP replica that read it
(:mod:`seqpack.schedulers.dynamic_cp.pieces`: who cuts which piece).

:func:`plan_shard_exchange` (pure) says who sends which piece to whom, from the plan and the
gathered counts that every rank has; :func:`exchange_shards` packs this rank's outgoing
sequences (:func:`~seqpack.thd.pack_sequences`, one call per group size, so every piece is
exactly what packing the whole microbatch and sharding it would give), cuts the pieces and
runs one ``all_to_all_single`` per dtype over the plane group. A receiver concatenates its
pieces in pack order: that is its shard of the microbatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from seqpack.collective.exchange import Exchanged, ExchangePlan
from seqpack.collective.groups import collective, comm_device
from seqpack.errors import ConfigError, SampleError
from seqpack.options import LabelFormat
from seqpack.schedulers import Schedule
from seqpack.schedulers.dynamic_cp.pieces import Pieces, shard_layout
from seqpack.thd import group_pad_multiple, pack_sequences

__all__ = ["SHARD_KEYS", "exchange_shards", "plan_shard_exchange"]

SHARD_KEYS: tuple[tuple[str, torch.dtype], ...] = (
    ("input_ids", torch.int64),
    ("labels", torch.int64),
    ("position_ids", torch.int64),
    ("loss_mask", torch.float32),
)
"""The packed token fields a piece carries (``position_ids`` only when the samples carry
their own; receivers rebuild it from the layout otherwise)."""


def plan_shard_exchange(
    start: np.ndarray,
    size: np.ndarray,
    tokens: np.ndarray,
    origin: np.ndarray,
    *,
    cp_size: int,
    num_ranks: int,
    rank: int,
) -> ExchangePlan:
    """Plan the pieces of one step (pure; module docstring).

    Args:
        start, size: int64 ``[N]`` first plane rank and size of each id's group (size ``-1``:
            not assigned).
        tokens: int64 ``[N]`` tokens of one shard of each id.
        origin: int64 ``[N]`` DP rank that read each id.
        cp_size: CP ranks per DP replica (plane rank ``d * cp + k``).
        num_ranks: Plane ranks ``dp * cp``.
        rank: This plane rank.

    Returns:
        An :class:`~seqpack.collective.exchange.ExchangePlan` over plane ranks: ``send_ids[d]``
        the ids whose shard for plane rank ``d`` this rank sends, ``recv_ids[s]`` the ids whose
        shard for this rank comes from ``s`` (both ascending), ``keep_ids`` the ids whose shard
        this rank cuts for itself; ``send_tokens`` / ``recv_tokens`` per peer.
    """
    start, size, tokens, origin = (np.asarray(a, dtype=np.int64) for a in (start, size, tokens, origin))
    if not start.shape == size.shape == tokens.shape == origin.shape:
        raise ConfigError("start, size, tokens and origin must have one entry per id")
    if not 0 <= rank < num_ranks:
        raise ConfigError(f"rank={rank} is out of range for {num_ranks} plane ranks")
    assigned = size > 0
    if assigned.any() and (start[assigned].min() < 0 or (start + size)[assigned].max() > num_ranks):
        raise ConfigError(f"a group reaches outside the {num_ranks} plane ranks")
    if origin.size and (origin.min() < 0 or (origin.max() + 1) * cp_size > num_ranks):
        raise ConfigError(f"origin holds DP ranks outside 0..{num_ranks // cp_size - 1}")
    p = Pieces.of(start, size, tokens, origin, cp_size)
    moving = p.moving
    out = np.flatnonzero(moving & (p.src == rank))
    out = out[np.lexsort((p.gid[out], p.dst[out]))]
    inc = np.flatnonzero(moving & (p.dst == rank))
    inc = inc[np.lexsort((p.gid[inc], p.src[inc]))]
    bounds = np.arange(num_ranks + 1, dtype=np.int64)
    send_at = np.searchsorted(p.dst[out], bounds)
    recv_at = np.searchsorted(p.src[inc], bounds)
    piece_tokens = p.tokens
    return ExchangePlan(
        rank,
        [p.gid[out[send_at[d] : send_at[d + 1]]] for d in range(num_ranks)],
        [p.gid[inc[recv_at[s] : recv_at[s + 1]]] for s in range(num_ranks)],
        np.sort(p.gid[(p.src == rank) & (p.dst == rank)]),
        np.bincount(p.dst[out], weights=piece_tokens[out], minlength=num_ranks).astype(np.int64),
        np.bincount(p.src[inc], weights=piece_tokens[inc], minlength=num_ranks).astype(np.int64),
        int(piece_tokens[moving].sum()),
    )


def _dualchunk_runs(base: np.ndarray, length: np.ndarray, size: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Source indices of pieces back to back: piece ``i`` is chunks ``j`` and ``2c-1-j`` of the
    ``length[i]`` tokens at ``base[i]`` (the whole run when ``c = 1``)."""
    chunk = length // (2 * size)
    alone = size == 1
    first = np.where(alone, base, base + j * chunk)
    first_len = np.where(alone, length, chunk)
    second = base + (2 * size - 1 - j) * chunk
    second_len = np.where(alone, 0, chunk)
    starts = np.stack([first, second], axis=1).reshape(-1)
    lengths = np.stack([first_len, second_len], axis=1).reshape(-1)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


class _Source:
    """This rank's outgoing sequences packed per group size (one ``pack_sequences`` each),
    concatenated: every packed token field, and where each id's padded tokens start."""

    def __init__(
        self,
        samples: Sequence[Mapping[str, torch.Tensor]],
        offset: int,
        ids: np.ndarray,
        plan: Schedule,
        size: np.ndarray,
        keys: Sequence[str],
    ) -> None:
        self.base: dict[int, int] = {}
        parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
        at = 0
        for c in np.unique(size[ids]).tolist():
            chosen = ids[size[ids] == c]
            truncated = []
            for gid in chosen.tolist():
                sample, n = samples[gid - offset], int(plan.lengths[gid])
                if sample["input_ids"].shape[0] < n:
                    raise SampleError(f"global sample {gid} has {sample['input_ids'].shape[0]} tokens, scheduled {n}")
                truncated.append({key: value[:n] for key, value in sample.items()})
            # Labels were checked and brought to seqpack's form where read: packed as given.
            batch = pack_sequences(
                truncated,
                pad_multiple=group_pad_multiple(c, plan.pad_multiple),
                label_format=LabelFormat.POSITION_ALIGNED,
            )
            cu = batch.cu_seqlens_padded.to(torch.int64).numpy()
            self.base.update(zip(chosen.tolist(), (at + cu[:-1]).tolist(), strict=True))
            for key in keys:
                parts[key].append(getattr(batch, key))
            at += int(cu[-1])
        self.fields = {key: torch.cat(values) for key, values in parts.items() if values}

    def indices(self, gids: np.ndarray, tokens: np.ndarray, size: np.ndarray, j: np.ndarray) -> torch.Tensor:
        base = np.array([self.base[g] for g in gids.tolist()], dtype=np.int64)
        return torch.from_numpy(_dualchunk_runs(base, tokens[gids] * size[gids], size[gids], j))


def exchange_shards(
    samples: Sequence[Mapping[str, torch.Tensor]],
    plan: Schedule,
    counts: Sequence[int] | np.ndarray,
    group: ProcessGroup | None,
    *,
    rank: int,
    position_ids: bool = False,
) -> Exchanged:
    """Send every piece of the step where it runs (module docstring); every plane rank calls it.

    Args:
        samples: This DP replica's samples (global ids ``offsets[dp_rank]...``), the same on
            every CP rank of the replica.
        plan: The step's plan (``plan.lengths``: truncated lengths).
        counts: Samples per DP rank (``GatheredLengths.counts``).
        group: The plane group (plane-rank order; ``None`` when the plane is one rank).
        rank: This plane rank.
        position_ids: The samples carry their own ``position_ids`` (sent too).

    Returns:
        ``Exchanged.samples``: for every id whose group holds this rank, its shard for this
        rank (``input_ids``, ``labels``, ``loss_mask`` as packed, ``position_ids`` when
        sent). One ``all_to_all_single`` per dtype, skipped on every rank when nothing moves.
    """
    counts = np.asarray(counts, dtype=np.int64)
    cp = plan.cp_size
    start, size, tokens = shard_layout(plan)
    origin = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    exchange = plan_shard_exchange(start, size, tokens, origin, cp_size=cp, num_ranks=plan.num_ranks, rank=rank)
    keys = [key for key, _ in SHARD_KEYS if key != "position_ids" or position_ids]
    offset = int(counts[: rank // cp].sum())
    produced = np.unique(np.concatenate([*exchange.send_ids, exchange.keep_ids]))
    source = _Source(samples, offset, produced, plan, size, keys)
    received: dict[int, dict[str, torch.Tensor]] = {}
    keep = exchange.keep_ids
    if keep.size:
        index = source.indices(keep, tokens, size, rank - start[keep])
        cut = {key: torch.split(source.fields[key].index_select(0, index), tokens[keep].tolist()) for key in keys}
        for i, gid in enumerate(keep.tolist()):
            received[gid] = {key: cut[key][i] for key in keys}
    token_bytes = sum(dtype.itemsize for key, dtype in SHARD_KEYS if key in keys)
    kept = int(tokens[keep].sum()) * token_bytes
    sent = got = 0
    if exchange.moved_tokens:
        for dtype in (torch.int64, torch.float32):
            chosen = [key for key, kind in SHARD_KEYS if kind == dtype and key in keys]
            a, b = _move(exchange, source, chosen, dtype, (start, size, tokens), received, group)
            sent, got = sent + a, got + b
    return Exchanged(received, bytes_sent=sent, bytes_received=got, bytes_kept=kept)


def _move(
    exchange: ExchangePlan,
    source: _Source,
    keys: list[str],
    dtype: torch.dtype,
    layout: tuple[np.ndarray, np.ndarray, np.ndarray],
    received: dict[int, dict[str, torch.Tensor]],
    group: ProcessGroup | None,
) -> tuple[int, int]:
    """One ``all_to_all_single`` of the ``keys`` of one dtype. The block for each peer is
    key-major: every key's tokens of all pieces for that peer (ids ascending)."""
    start, size, tokens = layout
    width = len(keys)
    stacked = torch.stack([source.fields[key] for key in keys]) if source.fields else None  # [K, S]
    blocks = []
    for dst, ids in enumerate(exchange.send_ids):
        if ids.size:
            assert stacked is not None
            index = source.indices(ids, tokens, size, dst - start[ids])
            blocks.append(stacked.index_select(1, index).reshape(-1))
    send = torch.cat(blocks) if blocks else torch.zeros(0, dtype=dtype)
    device = comm_device(group)
    out = torch.empty(int(exchange.recv_tokens.sum()) * width, dtype=dtype, device=device)
    collective(
        dist.all_to_all_single,
        out,
        send.to(device),
        output_split_sizes=(exchange.recv_tokens * width).tolist(),
        input_split_sizes=(exchange.send_tokens * width).tolist(),
        group=group,
    )
    out = out.cpu()
    at = 0
    for src, ids in enumerate(exchange.recv_ids):
        n = int(exchange.recv_tokens[src])
        if not ids.size:
            continue
        block = out[at : at + n * width].view(width, n)
        at += n * width
        for key, row in zip(keys, block, strict=True):
            for gid, piece in zip(ids.tolist(), torch.split(row, tokens[ids].tolist()), strict=True):
                received.setdefault(gid, {})[key] = piece
    return send.numel() * send.element_size(), out.numel() * out.element_size()
