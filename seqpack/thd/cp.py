"""Context parallelism: the DualChunkSwap partition of a THD pack.

Each sequence of padded length ``L`` (a multiple of ``2*cp``) is cut into ``2*cp`` chunks of
``L/(2*cp)`` tokens; CP rank ``r`` holds chunks ``r`` and ``2*cp-1-r``, sequence by sequence,
so causal attention costs the same on every rank. :func:`partition_indices` returns exactly
the token indices of Transformer Engine's ``thd_get_partitioned_indices``. Everything here
is index arithmetic on whole tensors: no Python loop per token or per sequence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX
from seqpack.thd.batch import BATCH_TOKEN_FIELDS, PackedBatch
from seqpack.thd.layout import Offsets, as_offsets, check_offsets, seq_idx_from_cu_seqlens, token_layout
from seqpack.validation import check_int, check_positive_int, check_tensor

__all__ = [
    "partition_indices",
    "gather_order",
    "shard_for_cp",
    "unshard_from_cp",
    "chunk_ids_before_attention",
    "chunk_ids_after_attention",
    "reorder_seq_chunks",
    "dualchunk_to_sequential",
    "sequential_to_dualchunk",
]


MAX_CP_SIZE = 2**30
"""Largest CP size: every sequence holds ``2*cp`` chunks, and a pack's token count is int32."""


def check_cp(cp_size: object, cp_rank: object = 0) -> tuple[int, int]:
    """``(cp_size, cp_rank)`` as ints: a positive size, a rank in ``[0, cp_size)``."""
    size = check_positive_int("cp_size", cp_size, maximum=MAX_CP_SIZE)
    rank = check_int("cp_rank", cp_rank)
    if not 0 <= rank < size:
        raise ConfigError(f"cp_rank={rank} is out of range for cp_size={size} (valid: 0..{size - 1})")
    return size, rank


def _kinds(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {sorted({type(v).__name__ for v in value})}"
    return type(value).__name__


def _as_offsets(cu_seqlens_padded: Offsets) -> torch.Tensor:
    cu = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    if cu.numel() < 2:
        raise ConfigError(f"cu_seqlens_padded must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")
    return cu


def _check_layout(cu: torch.Tensor, total_tokens: int, cp_size: int) -> None:
    # At cp=1 the partition is the identity and any padded length is fine (TE asserts even
    # lengths even there, but never partitions at cp=1). One host sync on a GPU: cu is [N+1].
    multiple = 2 * cp_size if cp_size > 1 else 1
    bad = torch.nonzero(cu % multiple != 0).flatten()
    if bad.numel():
        i = int(bad[0])
        lengths = (cu[1:] - cu[:-1]).tolist()
        raise ConfigError(
            f"cu_seqlens_padded[{i}]={int(cu[i])} is not divisible by 2*cp_size={multiple}; every padded "
            f"sequence length must be (padded lengths: {lengths[:16]}{' ...' if len(lengths) > 16 else ''}). "
            f"Pack with pad_multiple=pad_multiple_for(cp_size={cp_size})"
        )
    check_offsets(cu, None)
    if int(cu[-1]) != total_tokens:
        raise ConfigError(
            f"total_tokens={total_tokens} differs from cu_seqlens_padded[-1]={int(cu[-1])}: tokens outside "
            "every sequence would be split wrongly (TE maps them onto the last sequence); absorb the pack's "
            "tail into the last sequence's padding"
        )


def partition_indices(cu_seqlens_padded: Offsets, total_tokens: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Token indices CP rank ``cp_rank`` holds (TE's ``thd_get_partitioned_indices``).

    For every sequence, in order: its chunk ``cp_rank`` then its chunk ``2*cp-1-cp_rank``.

    Args:
        cu_seqlens_padded: Global padded offsets ``[N+1]`` (integers), each divisible by
            ``2*cp_size`` when ``cp_size > 1``.
        total_tokens: Tokens in the pack; must equal ``cu_seqlens_padded[-1]``.
        cp_size: Context-parallel world size.
        cp_rank: This rank's index in the CP group.

    Returns:
        int64 tensor of ``total_tokens // cp_size`` indices, on ``cu_seqlens_padded``'s device.

    Raises:
        SeqpackTypeError: Float offsets, or non-integer sizes.
        ConfigError: A padded length not divisible by ``2*cp_size``, ``cp_rank`` out of range,
            or ``total_tokens`` different from the last offset.
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    cu = _as_offsets(cu_seqlens_padded)
    total = check_int("total_tokens", total_tokens, minimum=0, maximum=INT32_MAX)
    _check_layout(cu, total, cp_size)
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64, device=cu.device)
    # torch.full, not torch.tensor([cp_rank]): no host-to-device copy.
    return _dualchunk_indices(cu, total, cp_size, torch.full((1,), cp_rank, dtype=torch.int64, device=cu.device))


def _dualchunk_indices(cu: torch.Tensor, total: int, cp_size: int, ranks: torch.Tensor) -> torch.Tensor:
    """Global index of every token held by ``ranks``, rank-major (offsets already checked).

    The ranks' tokens are chunks, two per sequence per rank, back to back; ``local_cu`` is the
    layout of those chunks, and a token in chunk ``k`` sits at global index (its index in the
    concatenation) + ``shift[k]``.
    """
    num_ranks, num_seqs = ranks.numel(), cu.numel() - 1
    chunk = (cu[1:] - cu[:-1]) // (2 * cp_size)  # [N], one chunk's length
    held = torch.stack([ranks, 2 * cp_size - 1 - ranks], dim=1)  # [R, 2], chunks each rank holds
    lengths = chunk.view(1, num_seqs, 1).expand(num_ranks, num_seqs, 2).reshape(-1)  # [R*N*2]
    source = (cu[:-1].view(1, num_seqs, 1) + held.view(num_ranks, 1, 2) * chunk.view(1, num_seqs, 1)).reshape(-1)
    local_cu = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=cu.device)
    torch.cumsum(lengths, dim=0, out=local_cu[1:])  # [R*N*2 + 1]
    shift = source - local_cu[:-1]
    count = num_ranks * (total // cp_size)
    chunk_of_token = seq_idx_from_cu_seqlens(local_cu, count)  # no tail: local_cu[-1] == count
    return torch.arange(count, dtype=torch.int64, device=cu.device) + shift[chunk_of_token]


def gather_order(cu_seqlens_padded: Offsets, total_tokens: int, cp_size: int) -> torch.Tensor:
    """Global token index of every row of the rank-major concatenation of all CP shards.

    ``torch.cat(shards)[i]`` is global token ``gather_order(...)[i]``: scatter with it to undo
    DualChunkSwap and re-interleave sequences in one step (what Mamba's hidden-parallel CP
    needs after its all-to-all), gather with it to redo both. Equals
    ``torch.cat([partition_indices(..., r) for r in range(cp_size)])``, in one pass.
    """
    cp_size, _ = check_cp(cp_size)
    cu = _as_offsets(cu_seqlens_padded)
    total = check_int("total_tokens", total_tokens, minimum=0, maximum=INT32_MAX)
    _check_layout(cu, total, cp_size)
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64, device=cu.device)
    return _dualchunk_indices(cu, total, cp_size, torch.arange(cp_size, dtype=torch.int64, device=cu.device))


def shard_for_cp(batch: PackedBatch, cp_size: int, cp_rank: int) -> PackedBatch:
    """This CP rank's tokens of ``batch``; ``cu_seqlens*`` and ``max_seqlen`` stay global.

    Raises:
        ConfigError: ``batch`` is already sharded, a padded length is not divisible by
            ``2*cp_size``, or ``cp_rank`` is out of range.
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    if not isinstance(batch, PackedBatch):
        raise SeqpackTypeError(f"batch must be a seqpack.thd.PackedBatch, got {type(batch).__name__}")
    if batch.cp_size != 1:
        raise ConfigError(f"batch is already sharded (cp_size={batch.cp_size}, cp_rank={batch.cp_rank})")
    if cp_size == 1:
        return batch
    index = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp_size, cp_rank)
    index = index.to(batch.position_ids.device)
    changes = {
        name: getattr(batch, name).index_select(0, index)
        for name in BATCH_TOKEN_FIELDS
        if getattr(batch, name) is not None
    }
    return dataclasses.replace(batch, **changes, cp_size=cp_size, cp_rank=cp_rank)


def unshard_from_cp(parts: Sequence[torch.Tensor], cu_seqlens_padded: Offsets, cp_size: int) -> torch.Tensor:
    """Inverse of :func:`shard_for_cp` for one tensor: per-rank tensors (token axis first,
    in CP rank order) back to global token order."""
    cp_size, _ = check_cp(cp_size)
    if not isinstance(parts, Sequence) or not all(isinstance(part, torch.Tensor) for part in parts):
        raise SeqpackTypeError(f"parts must be a list of tensors (one per CP rank), got {_kinds(parts)}")
    if len(parts) != cp_size:
        raise ConfigError(f"expected {cp_size} parts (one per CP rank, cp_size={cp_size}), got {len(parts)}")
    if any(part.dim() == 0 for part in parts):
        raise ConfigError(f"parts must have a token axis (at least 1-D), got shapes {[tuple(p.shape) for p in parts]}")
    if cp_size == 1:  # shard_for_cp(batch, 1, 0) is the identity
        return parts[0]
    stacked = torch.cat(list(parts), dim=0)
    order = gather_order(cu_seqlens_padded, stacked.shape[0], cp_size).to(stacked.device)
    out = torch.empty_like(stacked)
    out[order] = stacked
    return out


def chunk_ids_before_attention(cp_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Gather order from DualChunkSwap chunk order to sequential: ``ids[r]=2r``,
    ``ids[r+cp]=2cp-2r-1`` (TE's ``get_seq_chunk_ids_for_reordering_before_attn``)."""
    cp_size, _ = check_cp(cp_size)
    r = torch.arange(cp_size, device=device)
    ids = torch.empty(2 * cp_size, dtype=torch.int64, device=device)
    ids[:cp_size] = 2 * r
    ids[cp_size:] = 2 * cp_size - 2 * r - 1
    return ids


def chunk_ids_after_attention(cp_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Gather order from sequential chunk order to DualChunkSwap: ``ids[2r]=r``,
    ``ids[2r+1]=2cp-r-1`` (TE's ``get_seq_chunk_ids_for_reordering_after_attn``)."""
    cp_size, _ = check_cp(cp_size)
    r = torch.arange(cp_size, device=device)
    ids = torch.empty(2 * cp_size, dtype=torch.int64, device=device)
    ids[0::2] = r
    ids[1::2] = 2 * cp_size - r - 1
    return ids


def reorder_seq_chunks(
    x: torch.Tensor,
    chunk_ids: torch.Tensor,
    cu_seqlens_padded: Offsets | None = None,
    dim: int = 0,
) -> torch.Tensor:
    """Reorder the equal chunks of every sequence: output chunk ``j`` is input chunk
    ``chunk_ids[j]``.

    With ``cu_seqlens_padded`` (THD), each sequence along ``dim`` is cut into
    ``len(chunk_ids)`` chunks; without it, the whole ``dim`` is one sequence.
    """
    check_tensor("x", x, min_dim=1)
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ConfigError(f"dim={dim} is out of range for x of shape {tuple(x.shape)}")
    chunk_ids = check_tensor("chunk_ids", chunk_ids, min_dim=1)
    if chunk_ids.is_floating_point() or chunk_ids.is_complex() or chunk_ids.dtype == torch.bool:
        raise SeqpackTypeError(f"chunk_ids must hold integers, got dtype {chunk_ids.dtype}")
    chunk_ids = chunk_ids.to(torch.int64).cpu().reshape(-1)
    num_chunks = chunk_ids.numel()
    if num_chunks == 0 or not torch.equal(torch.sort(chunk_ids).values, torch.arange(num_chunks)):
        raise ConfigError(f"chunk_ids must be a permutation of 0..{num_chunks - 1}, got {chunk_ids.tolist()[:16]}")
    total = x.shape[dim]
    cu = _as_offsets([0, total] if cu_seqlens_padded is None else cu_seqlens_padded).cpu()
    if int(cu[-1]) != total:
        raise ConfigError(f"cu_seqlens_padded ends at {int(cu[-1])} but x has {total} entries along dim {dim}")
    lengths = cu[1:] - cu[:-1]
    if bool((lengths % num_chunks != 0).any()):
        raise ConfigError(
            f"every sequence length must be divisible by {num_chunks} chunks (2*cp_size under DualChunkSwap), "
            f"got {lengths.tolist()[:16]}"
        )
    layout = token_layout(cu, total_tokens=total)  # checks the offsets
    seq = layout.seq_idx.long()
    chunk = lengths[seq] // num_chunks
    src = cu[seq] + chunk_ids[layout.position // chunk] * chunk + layout.position % chunk
    return x.index_select(dim, src.to(x.device))


def dualchunk_to_sequential(x: torch.Tensor, cu_seqlens_padded: Offsets, cp_size: int, dim: int = 0) -> torch.Tensor:
    """Undo DualChunkSwap on full sequences (chunk order ``0, 2cp-1, 1, 2cp-2, ...`` to
    ``0, 1, ..., 2cp-1``)."""
    return reorder_seq_chunks(x, chunk_ids_before_attention(cp_size), cu_seqlens_padded, dim)


def sequential_to_dualchunk(x: torch.Tensor, cu_seqlens_padded: Offsets, cp_size: int, dim: int = 0) -> torch.Tensor:
    """Redo DualChunkSwap on full sequences (inverse of :func:`dualchunk_to_sequential`)."""
    return reorder_seq_chunks(x, chunk_ids_after_attention(cp_size), cu_seqlens_padded, dim)
