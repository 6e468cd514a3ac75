"""The exact torch reference of THD attention: masked attention inside each packed sequence.

Work goes query block by query block against only the keys each block's mask reaches, so
scores stay at most ``MAX_SCORE_BLOCK`` elements (never ``T x T``) and a sliding window costs
``s * W``, not ``s^2``. Under CP the keys are the whole pack (:func:`thd_attention`) or those
the CP exchange brought (``key_positions``, :mod:`~seqpack.compute.attention.kv_exchange`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from seqpack.compute.attention.masks import AttentionMask, attention_mask, block_mask, key_range
from seqpack.errors import SeqpackError
from seqpack.options import CpLayout
from seqpack.thd.cp import held_runs
from seqpack.thd.padding import layout_multiple
from seqpack.validation import check_choice

__all__ = ["MAX_SCORE_BLOCK", "attend", "thd_attention"]

# Largest score block (elements) one SDPA call builds: bounded memory, and buffers below
# glibc's mmap threshold, so freed memory is reused rather than faulted in again every call.
MAX_SCORE_BLOCK = 1 << 21

# Fewest query rows of a windowed block: each block is one SDPA call (and its backward).
MIN_WINDOW_ROWS = 128


def _block_rows(num_q: int, num_k: int, heads: int, mask: AttentionMask) -> int:
    """Query rows per block: ``heads * rows * keys(rows)`` stays within MAX_SCORE_BLOCK, and under
    a window blocks stay near the window's size, so the work is ``s * W``-shaped, not ``s^2``."""
    budget = max(1, MAX_SCORE_BLOCK // heads)
    # A block of r rows reaches at most r + extent keys (and never more than num_k).
    extent = (mask.left if mask.left >= 0 else num_k) + (mask.right if mask.right >= 0 else num_k)
    if extent >= num_k:  # unbounded on a side, or a window wider than the sequence: keys ~ num_k
        return max(1, min(num_q, budget // num_k))
    rows = int((math.sqrt(extent * extent + 4 * budget) - extent) / 2)  # r * (r + extent) <= budget
    rows = min(rows, max(extent, MIN_WINDOW_ROWS))  # about as many rows as the window is wide
    return max(1, min(rows, num_q))


def _keys(
    k: torch.Tensor, v: torch.Tensor, key_positions: np.ndarray | None, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values at global positions ``[lo, hi)``."""
    if key_positions is None:  # k, v hold the whole pack
        return k[lo:hi], v[lo:hi]
    first = int(np.searchsorted(key_positions, lo))
    # The exchange brought every key in reach, so the range is a contiguous run of rows.
    assert key_positions[first] == lo and key_positions[first + hi - lo - 1] == hi - 1, (lo, hi)
    return k[first : first + hi - lo], v[first : first + hi - lo]


def _attend_queries(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_positions: np.ndarray | None,
    position: int,
    seq_start: int,
    real_end: int,
    mask: AttentionMask,
    scale: float,
) -> torch.Tensor:
    """Real queries ``q`` ``[n, H, D]`` at global positions ``position ..`` of one sequence -> ``[n, H, Dv]``."""
    num_q, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    lo, hi = key_range(position, position + num_q, seq_start, real_end, mask)
    rows = _block_rows(num_q, int(hi - lo), heads, mask)
    blocks = []
    for first in range(0, num_q, rows):
        n = min(rows, num_q - first)
        q_pos = position + first
        k_lo, k_hi = (int(x) for x in key_range(q_pos, q_pos + n, seq_start, real_end, mask))
        keys, values = _keys(k, v, key_positions, k_lo, k_hi)  # (nk, Hkv, D)
        if group > 1:  # GQA: query head h reads key/value head h // group
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        allowed = block_mask(q_pos, n, k_lo, k_hi - k_lo, mask, q.device)  # (n, nk) or None
        out = F.scaled_dot_product_attention(
            q[first : first + n].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=allowed, scale=scale,
        )  # fmt: skip  # (H, n, Dv)
        blocks.append(out.transpose(0, 1))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    real: Sequence[int],
    padded: Sequence[int],
    *,
    mask: AttentionMask,
    scale: float,
    cp_size: int = 1,
    cp_rank: int = 0,
    layout: CpLayout = CpLayout.DUALCHUNK,
    key_positions: np.ndarray | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries (inputs already checked).

    Args:
        q: ``[T / cp_size, H, D]``, this rank's queries in ``layout``.
        k, v: ``[K, Hkv, D]``: the whole pack in global order (``key_positions=None``), or the
            keys at the increasing global positions ``key_positions`` (every key in reach).
        real, padded: ``cu_seqlens`` and ``cu_seqlens_padded`` as host lists (global).

    Returns:
        ``[T / cp_size, H, Dv]``; pad queries are 0.
    """
    pieces = []
    heads, dv = q.shape[1], v.shape[-1]
    offsets = np.asarray(padded, dtype=np.int64)
    positions, lengths = held_runs(offsets[:-1], np.diff(offsets), cp_size, cp_rank, layout)  # [N, k]
    per_seq = positions.shape[-1]
    rows = np.cumsum(lengths) - lengths.reshape(-1)  # this rank's runs sit back to back
    for run, (position, length, row) in enumerate(
        zip(positions.reshape(-1).tolist(), lengths.reshape(-1).tolist(), rows.tolist(), strict=True)
    ):
        i = run // per_seq
        start, real_end = padded[i], padded[i] + (real[i + 1] - real[i])
        num_real = min(max(real_end - position, 0), length)  # real queries: a prefix of the run
        if num_real:
            queries = q[row : row + num_real]
            pieces.append(_attend_queries(queries, k, v, key_positions, position, start, real_end, mask, scale))
        if num_real < length:
            pieces.append(q.new_zeros(length - num_real, heads, dv))
    out = torch.cat(pieces) if pieces else q.new_zeros(0, heads, dv)  # (T_local, H, Dv)
    # Keep q, k, v in the graph (an exact +0) even when every query is a pad: under CP the K/V
    # exchange's backward is a collective that every rank has to enter.
    return out + (q[:0].sum() + k[:0].sum() + v[:0].sum())


def thd_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: torch.Tensor,
    *,
    cp_size: int = 1,
    cp_rank: int = 0,
    softmax_scale: float | None = None,
    causal: bool = True,
    window: Sequence[int] | None = None,
    cp_layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> torch.Tensor:
    """Exact masked attention inside each packed sequence (the torch reference, functional).

    Args:
        q: ``[T / cp_size, H, D]``, this CP rank's queries in ``cp_layout`` (all of them when
            ``cp_size == 1``).
        k, v: ``[T, Hkv, D]``, the whole pack's keys and values in global order.
        cu_seqlens: Global real offsets ``[N+1]``; tokens past a sequence's real length are
            pads: never attended, and their outputs are 0.
        cu_seqlens_padded: Global padded offsets ``[N+1]``, ending at ``T``.
        cp_size, cp_rank: Which shard ``q`` is.
        softmax_scale: Defaults to ``1/sqrt(D)``.
        causal, window: The mask (:func:`~seqpack.compute.attention.masks.attention_mask`,
            TE's convention: query ``i`` sees keys ``i-left .. i+right``, -1 unbounded).
        cp_layout: ``"dualchunk"`` or ``"contiguous"`` (:mod:`seqpack.thd.cp`).

    Returns:
        ``[T / cp_size, H, Dv]``.
    """
    mask = attention_mask(causal, window)
    layout = check_choice("cp_layout", cp_layout, CpLayout)
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads != 0:
        raise SeqpackError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")
    real, padded = cu_seqlens.tolist(), cu_seqlens_padded.tolist()
    if padded[-1] != k.shape[0] or padded[-1] != q.shape[0] * cp_size:
        raise SeqpackError(
            f"cu_seqlens_padded ends at {padded[-1]} but k has {k.shape[0]} tokens and q has "
            f"{q.shape[0]} x cp_size={cp_size}; all three must be the pack's token count"
        )
    multiple = layout_multiple(cp_size, layout)
    if cp_size > 1 and any(offset % multiple for offset in padded):
        if layout == CpLayout.DUALCHUNK:
            what = f"2*cp_size={multiple} for DualChunkSwap"
        else:
            what = f"cp_size={multiple} (cp_layout='contiguous')"
        raise SeqpackError(
            f"every padded sequence length must be divisible by {what}, got cu_seqlens_padded={padded[:16]}"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    return attend(q, k, v, real, padded, mask=mask, scale=scale, cp_size=cp_size, cp_rank=cp_rank, layout=layout)
