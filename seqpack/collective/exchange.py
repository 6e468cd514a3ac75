"""The wrapper's sample exchange: every rank of a sequence's CP group gets its shard.

Every plan is rounds of CP groups, blocks of the ``R = dp x cp`` plane ranks (DP-major).
Each rank of a sequence's group needs one shard of it, a *piece*, cut from the sequence
padded to its span (``Schedule.packed_spans``) by the CP rank of the same index of the DP
replica that read it (:mod:`seqpack.schedulers.dynamic_cp.pieces`). :func:`plan_shard_exchange`
(pure) says who sends which piece to whom; :func:`exchange_shards` packs this rank's outgoing
sequences (so every piece is exactly what packing the whole microbatch and sharding it would
give), cuts the pieces and runs one ``all_to_all_single`` per dtype. A receiver concatenates
its pieces in pack order: that is its shard of the microbatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch.distributed import ProcessGroup

from seqpack.collective.groups import all_to_all
from seqpack.errors import ConfigError, SampleError
from seqpack.options import CpLayout, LabelFormat
from seqpack.schedulers import Schedule
from seqpack.schedulers.dynamic_cp.pieces import Pieces, shard_layout
from seqpack.thd import pack_sequences
from seqpack.thd.cp import held_runs, run_indices
from seqpack.validation import check_choice

__all__ = ["SHARD_KEYS", "ExchangePlan", "Exchanged", "exchange_shards", "plan_shard_exchange"]

SHARD_KEYS: tuple[tuple[str, torch.dtype], ...] = (
    ("input_ids", torch.int64),
    ("labels", torch.int64),
    ("position_ids", torch.int64),
    ("loss_mask", torch.float32),
)
"""The packed token fields a piece carries (``position_ids`` only when the samples carry
their own; receivers rebuild it from the layout otherwise)."""


@dataclasses.dataclass(frozen=True)
class ExchangePlan:
    """Who sends what to whom, computed identically and locally on every rank.

    Attributes:
        rank: This rank's index in the exchange's group.
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


@dataclasses.dataclass
class Exchanged:
    """What :func:`exchange_shards` delivered to this rank.

    Attributes:
        samples: Global id to sample (``{key: 1-D tensor}``) for every id scheduled on this
            replica, truncated to its scheduled length.
        bytes_sent, bytes_received: Over the wire, this rank.
        bytes_kept: Payload of samples that stayed on this rank (not sent).
        payloads: Global id to the sample's payload beside its tokens (a vision-language
            sample's, :mod:`seqpack.loader.vision_payload`), for every id run here that has one.
    """

    samples: dict[int, dict[str, torch.Tensor]]
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_kept: int = 0
    payloads: dict[int, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)


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
        An :class:`ExchangePlan` over plane ranks.
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
    send_at = np.searchsorted(p.dst[out], bounds).tolist()
    recv_at = np.searchsorted(p.src[inc], bounds).tolist()
    sent, got = p.gid[out], p.gid[inc]  # per peer: slices (views) of these
    piece_tokens = p.tokens
    return ExchangePlan(
        rank,
        [sent[send_at[d] : send_at[d + 1]] for d in range(num_ranks)],
        [got[recv_at[s] : recv_at[s + 1]] for s in range(num_ranks)],
        np.sort(p.gid[(p.src == rank) & (p.dst == rank)]),
        np.bincount(p.dst[out], weights=piece_tokens[out], minlength=num_ranks).astype(np.int64),
        np.bincount(p.src[inc], weights=piece_tokens[inc], minlength=num_ranks).astype(np.int64),
        int(piece_tokens[moving].sum()),
    )


class _Source:
    """This rank's outgoing sequences, each padded to its span (one ``pack_sequences`` per
    padding multiple, and one per sequence whose span is longer), concatenated: every packed
    token field, and where each id's tokens start."""

    def __init__(
        self,
        samples: Sequence[Mapping[str, torch.Tensor]],
        offset: int,
        ids: np.ndarray,
        plan: Schedule,
        spans: np.ndarray,
        keys: Sequence[str],
        layout: CpLayout,
    ) -> None:
        self.base: dict[int, int] = {}
        self._parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
        self._at = 0
        multiple = plan.pad_multiples()
        plain = -(-plan.lengths // multiple) * multiple
        longer = ids[spans[ids] > plain[ids]]
        for m in np.unique(multiple[ids]).tolist():
            chosen = ids[(multiple[ids] == m) & (spans[ids] == plain[ids])]
            if chosen.size:
                self._pack(samples, offset, chosen, plan, m, None)
        for gid in longer.tolist():
            self._pack(samples, offset, np.array([gid]), plan, int(multiple[gid]), int(spans[gid]))
        self.fields = {
            key: torch.cat(values) if len(values) > 1 else values[0] for key, values in self._parts.items() if values
        }
        self._layout = layout

    def _pack(
        self,
        samples: Sequence[Mapping[str, torch.Tensor]],
        offset: int,
        chosen: np.ndarray,
        plan: Schedule,
        multiple: int,
        pad_to: int | None,
    ) -> None:
        truncated = []
        for gid in chosen.tolist():
            sample, n = samples[gid - offset], int(plan.lengths[gid])
            if sample["input_ids"].shape[0] < n:
                raise SampleError(f"global sample {gid} has {sample['input_ids'].shape[0]} tokens, scheduled {n}")
            truncated.append({key: value[:n] for key, value in sample.items()})
        # Labels were checked and brought to seqpack's form where read: packed as given.
        batch = pack_sequences(
            truncated, pad_multiple=multiple, pad_to=pad_to, label_format=LabelFormat.POSITION_ALIGNED
        )
        cu = batch.cu_seqlens_padded.to(torch.int64).numpy()
        self.base.update(zip(chosen.tolist(), (self._at + cu[:-1]).tolist(), strict=True))
        for key, parts in self._parts.items():
            parts.append(getattr(batch, key))
        self._at += int(cu[-1])

    def indices(self, gids: np.ndarray, tokens: np.ndarray, size: np.ndarray, j: np.ndarray) -> torch.Tensor:
        base = np.array([self.base[g] for g in gids.tolist()], dtype=np.int64)
        return run_indices(*held_runs(base, tokens[gids] * size[gids], size[gids], j, self._layout))


def exchange_shards(
    samples: Sequence[Mapping[str, torch.Tensor]],
    plan: Schedule,
    counts: Sequence[int] | np.ndarray,
    group: ProcessGroup | None,
    *,
    rank: int,
    position_ids: bool = False,
    spans: np.ndarray | None = None,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
    lane: bool = False,
) -> Exchanged:
    """Send every piece of the step where it runs (module docstring); every plane rank calls it.

    Args:
        samples: This DP replica's samples (global ids ``offsets[dp_rank]...``), the same on
            every CP rank of the replica.
        plan: The step's plan (``plan.lengths``: truncated lengths).
        counts: Samples per DP rank (``GatheredLengths.counts``).
        group: The plane group (plane-rank order; ``None`` when the plane is one rank), or
            with ``lane`` this rank's CP lane over DP (the DP group, replica order).
        rank: This plane rank.
        position_ids: The samples carry their own ``position_ids`` (sent too).
        spans: Tokens each id spans in its pack (default ``Schedule.packed_spans()``).
        layout: How a sequence is cut into its group's shards (:class:`~seqpack.options.CpLayout`).
        lane: Every piece moves within its CP lane (a static plan): run the all-to-all over
            ``group``, the lane's ranks only.

    Returns:
        ``Exchanged.samples``: for every id whose group holds this rank, its shard for this
        rank. The all-to-alls are skipped on every rank when nothing moves.
    """
    counts = np.asarray(counts, dtype=np.int64)
    cp = plan.cp_size
    spans = plan.packed_spans() if spans is None else np.asarray(spans, dtype=np.int64)
    start, size, tokens = shard_layout(plan, spans)
    origin = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    exchange = plan_shard_exchange(start, size, tokens, origin, cp_size=cp, num_ranks=plan.num_ranks, rank=rank)
    peers = np.arange(plan.num_ranks, dtype=np.int64)
    if lane:
        exchange, peers = _lane(exchange, rank, cp)
    keys = [key for key, _ in SHARD_KEYS if key != "position_ids" or position_ids]
    offset = int(counts[: rank // cp].sum())
    produced = np.unique(np.concatenate([*exchange.send_ids, exchange.keep_ids]))
    received: dict[int, dict[str, torch.Tensor]] = {}
    try:
        source: _Source | None = _Source(
            samples, offset, produced, plan, spans, keys, check_choice("layout", layout, CpLayout)
        )
    except Exception as exc:  # send zeros, then raise: no peer is left waiting in the all-to-all
        failure, source = exc, None
    token_bytes = sum(dtype.itemsize for key, dtype in SHARD_KEYS if key in keys)
    keep = exchange.keep_ids
    kept = int(tokens[keep].sum()) * token_bytes
    sent = got = 0
    if exchange.moved_tokens:
        for dtype in (torch.int64, torch.float32):
            chosen = [key for key, kind in SHARD_KEYS if kind == dtype and key in keys]
            a, b = _move(exchange, source, chosen, dtype, (start, size, tokens), received, group, peers)
            sent, got = sent + a, got + b
    if source is None:
        raise failure
    whole = keep[size[keep] == 1]  # a group of one: its piece is the whole run, a view
    for gid, n in zip(whole.tolist(), tokens[whole].tolist(), strict=True):
        at = source.base[gid]
        received[gid] = {key: source.fields[key][at : at + n] for key in keys}
    cut_here = keep[size[keep] > 1]
    if cut_here.size:
        index = source.indices(cut_here, tokens, size, rank - start[cut_here])
        cut = {key: torch.split(source.fields[key].index_select(0, index), tokens[cut_here].tolist()) for key in keys}
        for i, gid in enumerate(cut_here.tolist()):
            received[gid] = {key: cut[key][i] for key in keys}
    return Exchanged(received, bytes_sent=sent, bytes_received=got, bytes_kept=kept)


def _lane(exchange: ExchangePlan, rank: int, cp: int) -> tuple[ExchangePlan, np.ndarray]:
    """``exchange`` over this rank's CP lane (the plane ranks of its CP index, one per
    replica), and those plane ranks.

    Raises:
        ConfigError: A piece to or from another lane (a plan that is not static).
    """
    peers = np.arange(rank % cp, exchange.send_tokens.shape[0], cp, dtype=np.int64)
    others = np.setdiff1d(np.arange(exchange.send_tokens.shape[0]), peers)
    if exchange.send_tokens[others].any() or exchange.recv_tokens[others].any():
        raise ConfigError("a lane exchange got pieces that cross CP lanes: the plan is not static")
    lane = ExchangePlan(
        rank // cp,
        [exchange.send_ids[p] for p in peers.tolist()],
        [exchange.recv_ids[p] for p in peers.tolist()],
        exchange.keep_ids,
        exchange.send_tokens[peers],
        exchange.recv_tokens[peers],
        exchange.moved_tokens,
    )
    return lane, peers


def _move(
    exchange: ExchangePlan,
    source: _Source | None,
    keys: list[str],
    dtype: torch.dtype,
    layout: tuple[np.ndarray, np.ndarray, np.ndarray],
    received: dict[int, dict[str, torch.Tensor]],
    group: ProcessGroup | None,
    peers: np.ndarray,
) -> tuple[int, int]:
    """One ``all_to_all_single`` of the ``keys`` of one dtype over ``group`` (its ranks are
    the plane ranks ``peers``). The block for each peer is key-major: every key's tokens of
    all pieces for that peer (ids ascending); zeros of the same sizes without a ``source``
    (this rank failed to cut its pieces)."""
    start, size, tokens = layout
    width = len(keys)
    blocks = [torch.zeros(int(exchange.send_tokens.sum()) * width, dtype=dtype)]
    if source is not None:
        stacked = torch.stack([source.fields[key] for key in keys]) if source.fields else None  # [K, S]
        blocks = []
        for dst, ids in zip(peers.tolist(), exchange.send_ids, strict=True):
            if ids.size:
                assert stacked is not None
                index = source.indices(ids, tokens, size, dst - start[ids])
                blocks.append(stacked.index_select(1, index).reshape(-1))
    send = torch.cat(blocks) if blocks else torch.zeros(0, dtype=dtype)
    out = all_to_all(send, (exchange.send_tokens * width).tolist(), (exchange.recv_tokens * width).tolist(), group)
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
