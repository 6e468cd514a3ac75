"""THD attention: causal attention inside each packed sequence, pads never attended.

Two backends with the same semantics:

- ``"torch"``: an exact reference that runs anywhere (CPU, float64). It works one sequence
  at a time (one DualChunkSwap chunk at a time under CP), so memory is at most
  ``chunk x sequence`` scores, never ``T x T``. Under context parallelism it all-gathers
  K/V over the CP group; the gather's backward reduce-scatters their gradients.
- ``"te"``: Transformer Engine ``DotProductAttention`` in THD format with
  ``pad_between_seqs`` stated explicitly (TE issue #3331) and TE's own CP.

``"auto"`` uses TE for fp16/bf16 CUDA inputs when TE imports, the torch reference otherwise;
it never falls back silently (:mod:`seqpack.compute.backends` says when it warns).
Pad queries output exactly 0 on both backends.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from seqpack._logging import warn_once
from seqpack.compute import backends
from seqpack.compute._collectives import all_gather_tokens, check_cp_shard, cp_token_orders
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.options import AttentionBackend, CpCommType
from seqpack.thd import PackedBatch
from seqpack.validation import check_choice, check_number, check_positive_int

__all__ = ["ThdAttention", "thd_attention", "select_backend", "BACKENDS", "CP_COMM_TYPES"]

logger = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = tuple(member.value for member in AttentionBackend)
CP_COMM_TYPES: tuple[str, ...] = tuple(member.value for member in CpCommType)


def select_backend(
    backend: AttentionBackend | str,
    *,
    te_ready: bool,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
) -> AttentionBackend:
    """The backend one forward call runs: ``"te"`` or ``"torch"``.

    ``"auto"`` picks TE only when a TE module was built (CUDA and TE present at
    construction) and the inputs are fp16/bf16 on a CUDA device (TE's THD kernels take no
    fp32/fp64; those run the exact reference).

    Raises:
        ConfigError: ``backend`` is not one of ``"auto"``, ``"te"``, ``"torch"``.
    """
    backend = check_choice("backend", backend, AttentionBackend)
    if backend == AttentionBackend.AUTO:
        te_inputs = backends.attention_kernel_applies(device, dtype)
        return AttentionBackend.TE if te_ready and te_inputs else AttentionBackend.TORCH
    return backend


def _segments(start: int, end: int, cp_size: int, cp_rank: int) -> list[tuple[int, int, int]]:
    """``(local_row, global_position, length)`` of this rank's pieces of one padded sequence."""
    if cp_size == 1:
        return [(start, start, end - start)]
    chunk = (end - start) // (2 * cp_size)
    local = start // cp_size
    return [
        (local, start + cp_rank * chunk, chunk),
        (local + chunk, start + (2 * cp_size - 1 - cp_rank) * chunk, chunk),
    ]


# Largest score block (elements) one SDPA call builds: long sequences are cut into query
# blocks so that memory stays bounded and buffers stay below glibc's mmap threshold (32 MB),
# where freed memory is reused instead of being returned to the OS and faulted in again on
# every call (that alone doubled step times of long sequences on some CPU VMs).
MAX_SCORE_BLOCK = 1 << 21


def _causal_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int, scale: float) -> torch.Tensor:
    """Queries at positions ``offset .. offset+nq-1`` of one sequence against its keys ``0..``.

    q: [nq, H, D]; k, v: [offset + nq, H, D] -> [nq, H, Dv]. Query i sees keys j <= offset + i,
    so every row has at least one key (no all-masked row, no NaN).
    """
    num_queries, heads = q.shape[0], q.shape[1]
    rows = max(1, MAX_SCORE_BLOCK // (heads * k.shape[0]))
    if rows < num_queries:  # query blocks; block [s, e) needs keys up to offset + e
        return torch.cat(
            [
                _causal_block(q[s : s + rows], k[: offset + s + rows], v[: offset + s + rows], offset + s, scale)
                for s in range(0, num_queries, rows)
            ]
        )
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (H, n, D)
    if offset == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril(offset)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)  # (nq, H, Dv)


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
) -> torch.Tensor:
    """Exact causal attention inside each packed sequence (the torch reference, functional).

    Args:
        q: ``[T / cp_size, H, D]``, this CP rank's queries in DualChunkSwap order (all of
            them when ``cp_size == 1``).
        k, v: ``[T, Hkv, D]``, the whole pack's keys and values in global order.
        cu_seqlens: Global real offsets ``[N+1]``; tokens past a sequence's real length are
            pads: never attended, and their outputs are 0.
        cu_seqlens_padded: Global padded offsets ``[N+1]``, ending at ``T``.
        cp_size, cp_rank: Which DualChunkSwap shard ``q`` is.
        softmax_scale: Defaults to ``1/sqrt(D)``.

    Returns:
        ``[T / cp_size, H, Dv]``.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads != 0:
        raise SeqpackError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")
    # cu_seqlens are tiny ([N+1]); reading them on the host costs one sync per call on a GPU.
    real = cu_seqlens.tolist()
    padded = cu_seqlens_padded.tolist()
    if padded[-1] != k.shape[0] or padded[-1] != q.shape[0] * cp_size:
        raise SeqpackError(
            f"cu_seqlens_padded ends at {padded[-1]} but k has {k.shape[0]} tokens and q has "
            f"{q.shape[0]} x cp_size={cp_size}; all three must be the pack's token count"
        )
    if cp_size > 1 and any(offset % (2 * cp_size) for offset in padded):
        raise SeqpackError(
            f"every padded sequence length must be divisible by 2*cp_size={2 * cp_size} for "
            f"DualChunkSwap, got cu_seqlens_padded={padded[:16]}"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    group = num_heads // num_kv_heads
    pieces = []
    for i in range(len(padded) - 1):
        start, end = padded[i], padded[i + 1]
        real_end = start + (real[i + 1] - real[i])
        for row, position, length in _segments(start, end, cp_size, cp_rank):
            num_real = min(max(real_end - position, 0), length)  # real queries: a prefix
            if num_real:
                keys = slice(start, position + num_real)  # causal: nothing past the last query
                k_seq, v_seq = k[keys], v[keys]
                if group > 1:  # GQA: query head h reads key/value head h // group
                    k_seq = k_seq.repeat_interleave(group, dim=1)
                    v_seq = v_seq.repeat_interleave(group, dim=1)
                pieces.append(_causal_block(q[row : row + num_real], k_seq, v_seq, position - start, scale))
            if num_real < length:
                pieces.append(q.new_zeros(length - num_real, num_heads, v.shape[-1]))
    out = torch.cat(pieces) if pieces else q.new_zeros(0, num_heads, v.shape[-1])  # (T_local, H, Dv)
    # Keep q, k, v in the graph (an exact +0) even when every query is a pad: a padding-only
    # microbatch must still give its inputs (zero) gradients, and under CP the K/V gather's
    # backward is a collective that every rank has to enter.
    return out + (q[:0].sum() + k[:0].sum() + v[:0].sum())


class ThdAttention(nn.Module):
    """Causal self-attention over a THD pack (one :class:`~seqpack.thd.PackedBatch`).

    Args:
        num_heads: Query heads ``H``.
        head_dim: Channels per head ``D``.
        num_kv_heads: Key/value heads (GQA); defaults to ``num_heads``. Query head ``h``
            reads key/value head ``h // (num_heads // num_kv_heads)``.
        backend: ``"auto"``, ``"te"`` or ``"torch"`` (a :class:`~seqpack.options.AttentionBackend`
            or its string; see the module docstring).
        cp_group: Context-parallel group; the batch must be this rank's DualChunkSwap shard
            (``seqpack.cp.shard_for_cp``) with ``cp_size`` / ``cp_rank`` of this group.
        softmax_scale: Defaults to ``1/sqrt(head_dim)``.
        cp_comm_type: TE's CP communication: ``"p2p"``, ``"all_gather"``, ``"a2a"`` or
            ``"a2a+p2p"`` (then ``cp_subgroups=(a2a_group, p2p_group)`` is required). The torch
            backend always all-gathers K/V.
        cp_subgroups: TE's hierarchical groups for ``"a2a+p2p"``.
        te_options: Extra keyword arguments for TE's ``DotProductAttention`` constructor
            (``layer_number``, ``attention_dropout``, ...).

    Raises:
        ConfigError: Bad head counts, backend or ``cp_comm_type`` (a ``ValueError``).
        BackendUnavailableError: ``backend="te"`` and Transformer Engine does not import (an
            ``ImportError``; the import error is its ``__cause__``).
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        backend: AttentionBackend | str = AttentionBackend.AUTO,
        cp_group: dist.ProcessGroup | None = None,
        *,
        softmax_scale: float | None = None,
        cp_comm_type: CpCommType | str = CpCommType.P2P,
        cp_subgroups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None,
        te_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        num_heads = check_positive_int("num_heads", num_heads)
        head_dim = check_positive_int("head_dim", head_dim)
        num_kv_heads = num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ConfigError(
                f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads} "
                "(each key/value head serves a whole group of query heads)"
            )
        self.backend = check_choice("backend", backend, AttentionBackend)
        self.cp_comm_type = check_choice("cp_comm_type", cp_comm_type, CpCommType)
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.softmax_scale = None if softmax_scale is None else check_number("softmax_scale", softmax_scale)
        self.cp_group = cp_group
        self.cp_size = 1 if cp_group is None else dist.get_world_size(cp_group)
        self.cp_rank = 0 if cp_group is None else dist.get_rank(cp_group)
        if self.cp_comm_type == CpCommType.A2A_P2P and self.cp_size > 1 and cp_subgroups is None:
            raise ConfigError("cp_comm_type='a2a+p2p' needs cp_subgroups=(a2a_group, p2p_group)")

        self.te_attention: nn.Module | None = None
        # Why "auto" cannot use TE here (logged once when CUDA half inputs arrive), or None.
        self.te_unavailable: str | None = None
        if self.backend == AttentionBackend.TE or (self.backend == AttentionBackend.AUTO and torch.cuda.is_available()):
            probe = backends.import_te_attention()
            if not probe.ok:
                if self.backend == AttentionBackend.TE:
                    raise backends.BackendUnavailableError(backends.te_unavailable_message(probe)) from probe.exception
                self.te_unavailable = f"`import {probe.what}` failed: {probe.error}"
            else:
                self.te_attention = self._build_te(probe.value, cp_subgroups, te_options or {})
        elif self.backend == AttentionBackend.AUTO:
            self.te_unavailable = "CUDA was not available when this ThdAttention was built"

    def _build_te(self, te_cls: Any, cp_subgroups: Any, te_options: dict[str, Any]) -> nn.Module:
        dpa = te_cls(
            num_attention_heads=self.num_heads,
            kv_channels=self.head_dim,
            num_gqa_groups=self.num_kv_heads,
            qkv_format="thd",
            attn_mask_type="padding_causal",
            softmax_scale=self.softmax_scale,
            **te_options,
        )
        if self.cp_size > 1:
            groups = list(cp_subgroups) if self.cp_comm_type == CpCommType.A2A_P2P else self.cp_group
            stream = torch.cuda.Stream() if torch.cuda.is_available() else None
            dpa.set_context_parallel_group(
                groups, dist.get_process_group_ranks(self.cp_group), stream, self.cp_comm_type.value
            )
        return dpa

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_kv_heads={self.num_kv_heads}, "
            f"backend={self.backend.value!r}, cp_size={self.cp_size}"
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """Attention of this rank's tokens.

        Args:
            q: ``[T_local, num_heads, head_dim]``.
            k, v: ``[T_local, num_kv_heads, head_dim]``.
            batch: The pack (this rank's CP shard under CP; ``cu_seqlens*`` global).

        Returns:
            ``[T_local, num_heads, head_dim]``; pad rows are 0.

        Raises:
            SeqpackError: Shapes that disagree with the module or ``batch.num_tokens``, or a
                batch sharded for another CP layout (a ``ValueError``).
            SeqpackTypeError: Non-floating or mismatched dtypes (a ``TypeError``).
        """
        self._check_inputs(q, k, v, batch)
        te_ready = self.te_attention is not None
        if select_backend(self.backend, te_ready=te_ready, device=q.device, dtype=q.dtype) == AttentionBackend.TE:
            return self._forward_te(q, k, v, batch)
        self._note_reference(q.device, q.dtype)
        return self._forward_torch(q, k, v, batch)

    def _note_reference(self, device: torch.device, dtype: torch.dtype) -> None:
        """Log once when ``auto`` runs the reference on CUDA inputs (see seqpack.compute.backends)."""
        if self.backend != AttentionBackend.AUTO:
            return
        warning = backends.reference_warning(
            "ThdAttention", "Transformer Engine", device, dtype, backends.ATTENTION_KERNEL_DTYPES, self.te_unavailable
        )
        if warning is not None:
            warn_once(logger, warning[0], "%s", warning[1])

    def _forward_te(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        assert self.te_attention is not None
        out = self.te_attention(q, k, v, **batch.te_kwargs())  # THD output: [T, H * D]
        out = out.view(q.shape[0], self.num_heads, -1)
        # te_kwargs may let pads attend as real tokens (exact for the real ones); zero them so
        # both backends agree everywhere.
        return out.masked_fill(batch.padding_mask.to(out.device)[:, None, None], 0)

    def _forward_torch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        scale = self.softmax_scale
        if self.cp_size == 1:
            return thd_attention(q, k, v, batch.cu_seqlens, batch.cu_seqlens_padded, softmax_scale=scale)
        assert self.cp_group is not None
        kv = torch.stack((k, v), dim=1)  # (T_local, 2, Hkv, D)
        kv_all = all_gather_tokens(kv, self.cp_group)  # (T, 2, Hkv, D), rank-major
        _, to_global = cp_token_orders(batch.cu_seqlens_padded, kv_all.shape[0], self.cp_size, q.device)
        kv_global = kv_all.index_select(0, to_global)  # (T, 2, Hkv, D), sequence order
        return thd_attention(
            q,
            kv_global[:, 0],
            kv_global[:, 1],
            batch.cu_seqlens,
            batch.cu_seqlens_padded,
            cp_size=self.cp_size,
            cp_rank=self.cp_rank,
            softmax_scale=scale,
        )

    def _check_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> None:
        tokens = batch.num_tokens
        expected = {
            "q": (tokens, self.num_heads, self.head_dim),
            "k": (tokens, self.num_kv_heads, self.head_dim),
            "v": (tokens, self.num_kv_heads, self.head_dim),
        }
        for name, tensor in (("q", q), ("k", k), ("v", v)):
            if not isinstance(tensor, torch.Tensor):
                raise SeqpackTypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != expected[name]:
                raise SeqpackError(
                    f"{name} has shape {tuple(tensor.shape)}, expected {expected[name]} "
                    f"(batch.num_tokens={tokens}, num_heads={self.num_heads}, "
                    f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim})"
                )
        if not q.is_floating_point():
            raise SeqpackTypeError(f"q, k, v must be floating point, got {q.dtype}")
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise SeqpackTypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if k.device != q.device or v.device != q.device:
            raise SeqpackError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
        check_cp_shard(batch, self.cp_size, self.cp_rank)
