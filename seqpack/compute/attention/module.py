"""``ThdAttention``: masked self-attention over a THD pack, on TE or the torch reference."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from seqpack._logging import warn_once
from seqpack.compute import backends
from seqpack.compute._collectives import batch_cp, check_cp_shard
from seqpack.compute.attention.kv_exchange import exchange_kv, plan_kv_exchange
from seqpack.compute.attention.masks import attention_mask
from seqpack.compute.attention.reference import attend, thd_attention
from seqpack.compute.attention.te import (
    build_te_attention,
    check_te_batch,
    check_te_options,
    check_te_rules,
    te_forward_kwargs,
)
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.options import AttentionBackend, CpCommType, CpLayout
from seqpack.thd.batch import PackedBatch
from seqpack.validation import check_choice, check_number, check_positive_int

__all__ = ["ThdAttention", "select_backend"]

logger = logging.getLogger("seqpack.compute.attention")  # one logger name for the package


def select_backend(
    backend: AttentionBackend | str,
    *,
    te_ready: bool,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
) -> AttentionBackend:
    """The backend one forward call runs: ``"te"`` or ``"torch"``.

    ``"auto"`` picks TE only when a TE module was built (CUDA and TE present at
    construction) and the inputs are fp16/bf16 on a CUDA device.

    Raises:
        ConfigError: ``backend`` is not one of ``"auto"``, ``"te"``, ``"torch"``.
    """
    backend = check_choice("backend", backend, AttentionBackend)
    if backend == AttentionBackend.AUTO:
        te_inputs = backends.attention_kernel_applies(device, dtype)
        return AttentionBackend.TE if te_ready and te_inputs else AttentionBackend.TORCH
    return backend


class ThdAttention(nn.Module):
    """Self-attention inside each sequence of a THD pack (one :class:`~seqpack.thd.PackedBatch`).

    Args:
        num_heads: Query heads ``H``.
        head_dim: Channels per head ``D``.
        num_kv_heads: Key/value heads (GQA); defaults to ``num_heads``. Query head ``h``
            reads key/value head ``h // (num_heads // num_kv_heads)``.
        backend: ``"auto"``, ``"te"`` or ``"torch"`` (an :class:`~seqpack.options.AttentionBackend`
            or its string; see the package docstring).
        cp_group: Context-parallel group for batches that carry none (built by hand); the
            batch must be this rank's CP shard (``seqpack.thd.shard_for_cp``). A batch that
            carries its own ``cp_group`` runs on that group.
        causal: Keys after the query are never attended (default).
        window: ``(left, right)``, TE's ``window_size``: query ``i`` sees keys ``i-left ..
            i+right`` of its sequence, -1 = unbounded; ``(W, 0)`` with ``causal=True`` is a
            causal sliding window. None: unbounded.
        softmax_scale: Defaults to ``1/sqrt(head_dim)``.
        cp_comm_type: TE's CP communication: ``"p2p"``, ``"all_gather"``, ``"a2a"`` or
            ``"a2a+p2p"`` (then ``cp_subgroups=(a2a_group, p2p_group)`` is required). The torch
            backend always exchanges just the keys in reach (``attention.kv_exchange``).
        cp_subgroups: TE's hierarchical groups for ``"a2a+p2p"``.
        cp_layout: The CP layout batches must come in (``"dualchunk"`` or ``"contiguous"``);
            None follows each batch's ``cp_layout`` (TE takes ``"dualchunk"`` only).
        te_options: Extra keyword arguments for TE's ``DotProductAttention`` constructor
            (``layer_number``, ``attention_dropout``, ...), not the mask or the sizes.

    Raises:
        ConfigError: Bad head counts, backend, mask, ``cp_comm_type`` or ``cp_layout`` (a
            ``ValueError``), or a configuration Transformer Engine cannot run when TE may run
            (``backend="te"``, or ``"auto"`` with CUDA and TE; :func:`check_te_rules`).
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
        causal: bool = True,
        window: Sequence[int] | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: CpCommType | str = CpCommType.P2P,
        cp_subgroups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None,
        cp_layout: CpLayout | str | None = None,
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
        self.mask = attention_mask(causal, window)
        self.cp_layout = None if cp_layout is None else check_choice("cp_layout", cp_layout, CpLayout)
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.softmax_scale = None if softmax_scale is None else check_number("softmax_scale", softmax_scale)
        self.cp_group = cp_group
        self.cp_size = 1 if cp_group is None else dist.get_world_size(cp_group)
        self.cp_rank = 0 if cp_group is None else dist.get_rank(cp_group)
        if self.cp_comm_type == CpCommType.A2A_P2P and self.cp_size > 1 and cp_subgroups is None:
            raise ConfigError("cp_comm_type='a2a+p2p' needs cp_subgroups=(a2a_group, p2p_group)")
        te_options = dict(te_options or {})
        check_te_options(te_options)

        self.te_attention: nn.Module | None = None
        # Batches' own groups under TE: the group TE's CP is set to now, each group's ranks, the
        # CP stream, and the CP sizes whose TE rules were checked.
        self._te_group: dist.ProcessGroup | None = cp_group
        self._te_ranks: dict[int, list[int]] = {}
        self._te_stream: Any = None
        self._te_checked: set[int] = {self.cp_size}
        # Why "auto" cannot use TE here (logged once when CUDA half inputs arrive), or None.
        self.te_unavailable: str | None = None
        if self.backend == AttentionBackend.TE:
            self._check_te_rules(cp_subgroups)  # before the import: a rule is a config error anywhere
        if self.backend == AttentionBackend.TE or (self.backend == AttentionBackend.AUTO and torch.cuda.is_available()):
            probe = backends.import_te_attention()
            if not probe.ok:
                if self.backend == AttentionBackend.TE:
                    raise backends.BackendUnavailableError(backends.te_unavailable_message(probe)) from probe.exception
                self.te_unavailable = f"`import {probe.what}` failed: {probe.error}"
            else:
                self._check_te_rules(cp_subgroups)  # "auto" would run TE on CUDA half inputs
                self.te_attention = build_te_attention(
                    probe.value, num_heads=num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads, mask=self.mask,
                    softmax_scale=self.softmax_scale, cp_group=cp_group, cp_comm_type=self.cp_comm_type,
                    cp_subgroups=cp_subgroups, te_options=te_options,
                )  # fmt: skip
        elif self.backend == AttentionBackend.AUTO:
            self.te_unavailable = "CUDA was not available when this ThdAttention was built"

    def _check_te_rules(self, cp_subgroups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None) -> None:
        a2a_size = dist.get_world_size(cp_subgroups[0]) if cp_subgroups else None
        check_te_rules(
            self.mask, cp_size=self.cp_size, cp_comm_type=self.cp_comm_type, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, a2a_size=a2a_size, cp_layout=self.cp_layout,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_kv_heads={self.num_kv_heads}, "
            f"backend={self.backend.value!r}, {self.mask}, cp_size={self.cp_size}"
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
                batch sharded for another CP rank or layout (a ``ValueError``).
            SeqpackTypeError: Non-floating or mismatched dtypes (a ``TypeError``).
            ConfigError: Under CP with TE, a batch TE's CP cannot take (see ``attention.te``).
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

    def cp_of(self, batch: PackedBatch) -> tuple[dist.ProcessGroup | None, int, int]:
        """``(group, size, rank)`` this batch runs on: its own ``cp_group`` when it carries one
        (the wrapper's batches under CP), else the module's."""
        return batch_cp(batch, self.cp_group, self.cp_size, self.cp_rank)

    def _use_te_group(self, group: dist.ProcessGroup | None, size: int) -> None:
        """Point TE's CP at ``group`` (a batch's own, or the module's), only when it changes;
        a group's ranks and the CP stream are cached, its size's TE rules checked once."""
        if group is self._te_group:
            return
        assert self.te_attention is not None
        if size not in self._te_checked:
            if self.cp_comm_type == CpCommType.A2A_P2P:
                raise ConfigError(
                    "cp_comm_type='a2a+p2p' takes fixed subgroups: batches with their own cp_group (dynamic CP) "
                    "need 'p2p', 'all_gather' or 'a2a'"
                )
            check_te_rules(
                self.mask, cp_size=size, cp_comm_type=self.cp_comm_type, num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads, cp_layout=self.cp_layout,
            )  # fmt: skip
            self._te_checked.add(size)
        ranks = None
        if group is not None:
            key = id(group)
            if key not in self._te_ranks:
                self._te_ranks[key] = dist.get_process_group_ranks(group)
            ranks = self._te_ranks[key]
            if self._te_stream is None and torch.cuda.is_available():
                self._te_stream = torch.cuda.Stream()
        self.te_attention.set_context_parallel_group(  # type: ignore[operator]
            group, ranks, self._te_stream, self.cp_comm_type.value
        )
        self._te_group = group

    def _forward_te(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        assert self.te_attention is not None
        group, size, _ = self.cp_of(batch)
        self._use_te_group(group, size)
        check_te_batch(batch)
        out = self.te_attention(q, k, v, **te_forward_kwargs(batch, self.mask))  # THD output: [T, H * D]
        out = out.view(q.shape[0], self.num_heads, -1)
        # te_kwargs may let pads attend as real tokens (exact for the real ones); zero them so
        # both backends agree everywhere.
        return out.masked_fill(batch.padding_mask.to(out.device)[:, None, None], 0)

    def _forward_torch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        causal, window = self.mask.causal, self.mask.window_size
        group, cp_size, cp_rank = self.cp_of(batch)
        if cp_size == 1:
            cu, cu_padded = batch.cu_seqlens, batch.cu_seqlens_padded
            return thd_attention(q, k, v, cu, cu_padded, softmax_scale=self.softmax_scale, causal=causal, window=window)
        assert group is not None
        cu, cu_padded = batch.cu_seqlens, batch.cu_seqlens_padded
        plan = plan_kv_exchange(cu, cu_padded, cp_size, cp_rank, mask=self.mask, layout=batch.cp_layout)
        keys, values = exchange_kv(k, v, plan, group)  # (K, Hkv, D): every key in reach, key order
        scale = 1.0 / math.sqrt(self.head_dim) if self.softmax_scale is None else self.softmax_scale
        return attend(
            q, keys, values, batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist(), mask=self.mask, scale=scale,
            cp_size=cp_size, cp_rank=cp_rank, layout=batch.cp_layout, key_positions=plan.key_positions,
        )  # fmt: skip

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
        check_cp_shard(batch, self.cp_size, self.cp_rank, self.cp_layout)
