"""Context parallelism: how a THD pack is cut over the ranks of a CP group.

Two layouts (:class:`~seqpack.options.CpLayout`), sequence by sequence: ``"dualchunk"``
(DualChunkSwap, the default and Transformer Engine's: rank ``r`` holds chunks ``r`` and
``2*cp-1-r`` of ``2*cp``, so causal attention costs the same on every rank) and
``"contiguous"`` (rank ``r`` holds chunk ``r`` of ``cp``: for local or linear attention).
One rule, :func:`held_runs`, says which runs of a sequence a rank holds; everything that
cuts CP shards (this module, the wrapper's exchange, the attention reference) uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX, CpLayout
from seqpack.thd.batch import BATCH_TOKEN_FIELDS, PackedBatch
from seqpack.thd.layout import Offsets, as_offsets, check_offsets, token_layout
from seqpack.thd.padding import check_cp, layout_multiple
from seqpack.validation import check_choice, check_int, check_tensor

__all__ = [
    "partition_indices",
    "held_runs",
    "run_indices",
    "gather_order",
    "shard_for_cp",
    "unshard_from_cp",
    "chunk_ids_before_attention",
    "chunk_ids_after_attention",
    "reorder_seq_chunks",
    "dualchunk_to_sequential",
    "sequential_to_dualchunk",
]


def _kinds(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {sorted({type(v).__name__ for v in value})}"
    return type(value).__name__


def _as_offsets(cu_seqlens_padded: Offsets) -> torch.Tensor:
    cu = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    if cu.numel() < 2:
        raise ConfigError(f"cu_seqlens_padded must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")
    return cu


def _check_divisible(cu: torch.Tensor, cp_size: int, layout: CpLayout) -> None:
    # At cp=1 the partition is the identity and any padded length is fine (TE asserts even
    # lengths even there, but never partitions at cp=1). One host sync on a GPU: cu is [N+1].
    multiple = layout_multiple(cp_size, layout)
    bad = torch.nonzero(cu % multiple != 0).flatten()
    if bad.numel():
        i = int(bad[0])
        lengths = (cu[1:] - cu[:-1]).tolist()
        what = f"2*cp_size={multiple}" if layout == CpLayout.DUALCHUNK else f"cp_size={multiple} (layout='contiguous')"
        raise ConfigError(
            f"cu_seqlens_padded[{i}]={int(cu[i])} is not divisible by {what}; every padded "
            f"sequence length must be (padded lengths: {lengths[:16]}{' ...' if len(lengths) > 16 else ''}). "
            f"Pack with pad_multiple=pad_multiple_for(cp_size={cp_size})"
        )


def _check_layout(cu: torch.Tensor, total_tokens: int, cp_size: int, layout: CpLayout) -> None:
    _check_divisible(cu, cp_size, layout)
    check_offsets(cu, None)
    if int(cu[-1]) != total_tokens:
        raise ConfigError(
            f"total_tokens={total_tokens} differs from cu_seqlens_padded[-1]={int(cu[-1])}: tokens outside "
            "every sequence would be split wrongly (TE maps them onto the last sequence); absorb the pack's "
            "tail into the last sequence's padding"
        )


def partition_indices(
    cu_seqlens_padded: Offsets,
    total_tokens: int,
    cp_size: int,
    cp_rank: int,
    *,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> torch.Tensor:
    """Token indices CP rank ``cp_rank`` holds.

    ``layout="dualchunk"`` (default): TE's ``thd_get_partitioned_indices``, for every sequence
    in order its chunk ``cp_rank`` then its chunk ``2*cp-1-cp_rank`` of ``2*cp``.
    ``layout="contiguous"``: for every sequence its chunk ``cp_rank`` of ``cp``.

    Args:
        cu_seqlens_padded: Global padded offsets ``[N+1]`` (integers), each divisible by
            ``2*cp_size`` (dualchunk) or ``cp_size`` (contiguous) when ``cp_size > 1``.
        total_tokens: Tokens in the pack; must equal ``cu_seqlens_padded[-1]``.

    Returns:
        int64 tensor of ``total_tokens // cp_size`` increasing indices, on
        ``cu_seqlens_padded``'s device.

    Raises:
        SeqpackTypeError: Float offsets, or non-integer sizes.
        ConfigError: A padded length not divisible as the layout needs, ``cp_rank`` out of
            range, an unknown layout, or ``total_tokens`` different from the last offset.
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    layout = check_choice("layout", layout, CpLayout)
    cu = _as_offsets(cu_seqlens_padded)
    total = check_int("total_tokens", total_tokens, minimum=0, maximum=INT32_MAX)
    _check_layout(cu, total, cp_size, layout)
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64, device=cu.device)
    return _chunk_indices(cu, cp_size, np.array([cp_rank]), layout)


def held_runs(
    starts: np.ndarray | int,
    lengths: np.ndarray | int,
    cp_size: np.ndarray | int,
    cp_rank: np.ndarray | int,
    layout: CpLayout,
) -> tuple[np.ndarray, np.ndarray]:
    """The CP index rule: which runs of its sequence a CP rank holds (inputs not checked).

    Every argument broadcasts against the others (numpy); sequence ``i`` spans
    ``lengths[i]`` tokens from ``starts[i]``, cut for a group of ``cp_size[i]`` ranks, and
    ``cp_rank[i]`` is the rank asking. A group of one holds the whole sequence, whatever the
    length.

    Returns:
        int64 ``(run_starts, run_lengths)`` of the broadcast shape plus a last axis of the
        runs in the rank's order: 2 (dualchunk) or 1 (contiguous).
    """
    starts, lengths, size, rank = np.broadcast_arrays(
        *(np.asarray(a, dtype=np.int64) for a in (starts, lengths, cp_size, cp_rank))
    )
    if layout == CpLayout.CONTIGUOUS:
        share = lengths // size
        return (starts + rank * share)[..., None], share[..., None]
    whole = size == 1
    chunk = np.where(whole, lengths, lengths // (2 * size))
    first = starts + rank * chunk
    second = starts + (2 * size - 1 - rank) * chunk  # past the end, empty, for a group of one
    return np.stack([first, second], axis=-1), np.stack([chunk, np.where(whole, 0, chunk)], axis=-1)


def run_indices(
    run_starts: np.ndarray, run_lengths: np.ndarray, device: torch.device | str | None = None
) -> torch.Tensor:
    """int64 indices of the runs ``(run_starts, run_lengths)`` back to back (flattened, C
    order), on ``device`` (CPU by default; elsewhere only the per-run arrays are copied)."""
    run_starts, run_lengths = run_starts.reshape(-1), run_lengths.reshape(-1)
    count = int(run_lengths.sum())
    shift = run_starts - (np.cumsum(run_lengths) - run_lengths)  # global minus concatenated start
    if device is None or torch.device(device).type == "cpu":
        return torch.from_numpy(np.repeat(shift, run_lengths) + np.arange(count, dtype=np.int64))
    shift_t, lengths_t = torch.from_numpy(shift).to(device), torch.from_numpy(run_lengths).to(device)
    index = torch.repeat_interleave(shift_t, lengths_t, output_size=count)
    return index + torch.arange(count, dtype=torch.int64, device=device)


def _chunk_indices(cu: torch.Tensor, cp_size: int, ranks: np.ndarray, layout: CpLayout) -> torch.Tensor:
    """Global index of every token held by ``ranks``, rank-major (offsets already checked)."""
    offsets = cu.cpu().numpy()
    runs = held_runs(offsets[:-1], np.diff(offsets), cp_size, ranks[:, None], layout)  # [R, N, k]
    return run_indices(*runs, device=cu.device)


def gather_order(
    cu_seqlens_padded: Offsets,
    total_tokens: int,
    cp_size: int,
    *,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> torch.Tensor:
    """Global token index of every row of the rank-major concatenation of all CP shards.

    ``torch.cat(shards)[i]`` is global token ``gather_order(...)[i]``: scatter with it to undo
    the layout, gather with it to redo it. Equals ``torch.cat([partition_indices(..., r,
    layout=layout) for r in range(cp_size)])``.
    """
    cp_size, _ = check_cp(cp_size)
    layout = check_choice("layout", layout, CpLayout)
    cu = _as_offsets(cu_seqlens_padded)
    total = check_int("total_tokens", total_tokens, minimum=0, maximum=INT32_MAX)
    _check_layout(cu, total, cp_size, layout)
    return _gather_order(cu, total, cp_size, layout)


def _gather_order(cu: torch.Tensor, total: int, cp_size: int, layout: CpLayout) -> torch.Tensor:
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64, device=cu.device)
    return _chunk_indices(cu, cp_size, np.arange(cp_size), layout)


def shard_for_cp(
    batch: PackedBatch,
    cp_size: int,
    cp_rank: int,
    *,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> PackedBatch:
    """This CP rank's tokens of ``batch`` in ``layout``; ``cu_seqlens*`` and ``max_seqlen`` stay
    global, and the shard's ``cp_layout`` records the layout for the compute stages.

    Raises:
        ConfigError: ``batch`` is already sharded, a padded length is not divisible as the
            layout needs (``2*cp_size`` dualchunk, ``cp_size`` contiguous), ``cp_rank`` is out
            of range, or ``layout`` is unknown.
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    layout = check_choice("layout", layout, CpLayout)
    if not isinstance(batch, PackedBatch):
        raise SeqpackTypeError(f"batch must be a seqpack.thd.PackedBatch, got {type(batch).__name__}")
    if batch.cp_size != 1:
        raise ConfigError(f"batch is already sharded (cp_size={batch.cp_size}, cp_rank={batch.cp_rank})")
    if cp_size == 1:  # the identity for every layout
        return batch if batch.cp_layout == layout else dataclasses.replace(batch, cp_layout=layout)
    index = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp_size, cp_rank, layout=layout)
    index = index.to(batch.position_ids.device)
    changes = {
        name: getattr(batch, name).index_select(0, index)
        for name in BATCH_TOKEN_FIELDS
        if getattr(batch, name) is not None
    }
    return dataclasses.replace(batch, **changes, cp_size=cp_size, cp_rank=cp_rank, cp_layout=layout)


def unshard_from_cp(
    parts: Sequence[torch.Tensor],
    cu_seqlens_padded: Offsets,
    cp_size: int,
    *,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> torch.Tensor:
    """Inverse of :func:`shard_for_cp` for one tensor: per-rank tensors (token axis first, in CP
    rank order, each ``cu_seqlens_padded[-1] / cp_size`` tokens) back to global token order.

    Raises:
        SeqpackTypeError: ``parts`` is not a list of tensors, or float offsets.
        ConfigError: Not ``cp_size`` parts, a part without a token axis or of the wrong length
            (named with the length it needs), parts of different dtypes, devices or trailing
            shapes, or offsets the layout cannot split.
    """
    cp_size, _ = check_cp(cp_size)
    layout = check_choice("layout", layout, CpLayout)
    if not isinstance(parts, Sequence) or not all(isinstance(part, torch.Tensor) for part in parts):
        raise SeqpackTypeError(f"parts must be a list of tensors (one per CP rank), got {_kinds(parts)}")
    if len(parts) != cp_size:
        raise ConfigError(f"expected {cp_size} parts (one per CP rank, cp_size={cp_size}), got {len(parts)}")
    if any(part.dim() == 0 for part in parts):
        raise ConfigError(f"parts must have a token axis (at least 1-D), got shapes {[tuple(p.shape) for p in parts]}")
    for rank, part in enumerate(parts[1:], start=1):  # torch.cat would promote dtypes or fail on shapes
        if part.dtype != parts[0].dtype or part.shape[1:] != parts[0].shape[1:] or part.device != parts[0].device:
            raise ConfigError(
                f"parts[{rank}] is {part.dtype} of shape {tuple(part.shape)} on {part.device} but parts[0] is "
                f"{parts[0].dtype} of shape {tuple(parts[0].shape)} on {parts[0].device}: every part must have one "
                "dtype, device and trailing shape"
            )
    cu = _as_offsets(cu_seqlens_padded)
    total = int(cu[-1])
    _check_layout(cu, total, cp_size, layout)
    for rank, part in enumerate(parts):
        if part.shape[0] != total // cp_size:
            raise ConfigError(
                f"parts[{rank}] has {part.shape[0]} tokens, expected {total // cp_size} "
                f"(cu_seqlens_padded[-1]={total} / cp_size={cp_size}); every part is one rank's whole shard"
            )
    if cp_size == 1:  # shard_for_cp(batch, 1, 0) is the identity
        return parts[0]
    stacked = torch.cat(list(parts), dim=0)
    order = _gather_order(cu, total, cp_size, layout).to(stacked.device)
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
