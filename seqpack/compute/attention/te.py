"""The Transformer Engine backend of ``ThdAttention``: its mask arguments and its rules.

TE's ``DotProductAttention`` in THD takes the mask as ``attn_mask_type`` plus
``window_size=(left, right)``, and under context parallelism has rules (shared/REFERENCE.md).
:func:`te_rule_violation` states them as pure Python, so a module that breaks one fails when
it is built, never inside a kernel.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from seqpack.compute.attention.masks import AttentionMask
from seqpack.errors import ConfigError
from seqpack.options import CpCommType, CpLayout
from seqpack.thd.batch import PackedBatch

__all__ = [
    "SLIDING_WINDOW_COMM_TYPES",
    "build_te_attention",
    "check_te_batch",
    "check_te_options",
    "check_te_rules",
    "te_forward_kwargs",
    "te_rule_violation",
]

SLIDING_WINDOW_COMM_TYPES = (CpCommType.ALL_GATHER, CpCommType.A2A)
"""TE's CP communication types that support a sliding window in THD."""

# ThdAttention's own arguments; te_options must not set them behind its back.
_RESERVED_TE_OPTIONS = {
    "attn_mask_type": "causal=",
    "window_size": "window=",
    "qkv_format": "nothing (THD is the format)",
    "num_attention_heads": "num_heads=",
    "kv_channels": "head_dim=",
    "num_gqa_groups": "num_kv_heads=",
    "softmax_scale": "softmax_scale=",
}


def te_rule_violation(
    mask: AttentionMask,
    *,
    cp_size: int,
    cp_comm_type: CpCommType,
    num_heads: int,
    num_kv_heads: int,
    a2a_size: int | None = None,
    cp_layout: CpLayout | None = None,
) -> str | None:
    """Why TE cannot run this configuration, or None when it can.

    Args:
        a2a_size: The a2a group's size under ``"a2a+p2p"`` (unknown: not checked).
        cp_layout: The layout the module is told to expect (None: not known yet).
    """
    if not mask.causal and (mask.left < 0) != (mask.right < 0):
        return (
            f"Transformer Engine takes a non-causal window as (-1, -1) or (>=0, >=0), got {mask}: bound both "
            "sides or neither"
        )
    assert mask.te_mask_type in ("padding", "padding_causal")  # the only masks THD + CP takes
    if cp_size == 1:
        return None
    if cp_layout == CpLayout.CONTIGUOUS:
        return "Transformer Engine shards THD under CP with DualChunkSwap only; cp_layout='contiguous' is not one"
    if mask.sliding and cp_comm_type not in SLIDING_WINDOW_COMM_TYPES:
        return f"cp_comm_type={cp_comm_type.value!r} does not support a sliding window ({mask}) under CP"
    split = {CpCommType.A2A: cp_size, CpCommType.A2A_P2P: a2a_size}.get(cp_comm_type)
    if split is not None and (num_heads % split or num_kv_heads % split):
        return (
            f"cp_comm_type={cp_comm_type.value!r} splits heads over {split} ranks, but num_heads={num_heads} "
            f"and num_kv_heads={num_kv_heads} are not both divisible by {split}"
        )
    return None


def check_te_rules(
    mask: AttentionMask,
    *,
    cp_size: int,
    cp_comm_type: CpCommType,
    num_heads: int,
    num_kv_heads: int,
    a2a_size: int | None = None,
    cp_layout: CpLayout | None = None,
) -> None:
    """Raise :class:`~seqpack.errors.ConfigError` naming the rule and the ``cp_comm_type``
    choices that work when TE cannot run this configuration."""

    def violation(choice: CpCommType, a2a: int | None) -> str | None:
        return te_rule_violation(
            mask, cp_size=cp_size, cp_comm_type=choice, num_heads=num_heads, num_kv_heads=num_kv_heads,
            a2a_size=a2a, cp_layout=cp_layout,
        )  # fmt: skip

    why = violation(cp_comm_type, a2a_size)
    if why is None:
        return
    # a2a+p2p is not offered: whether its a2a group divides the heads depends on the subgroups.
    offered = [choice for choice in CpCommType if choice != CpCommType.A2A_P2P]
    working = [choice.value for choice in offered if violation(choice, None) is None]
    hint = f"cp_comm_type choices that work here: {tuple(working)}" if working else "no cp_comm_type works here"
    raise ConfigError(f"{why} (cp_comm_type={cp_comm_type.value!r}; {hint}); or use backend='torch'")


def check_te_options(te_options: dict[str, Any]) -> None:
    """Refuse TE constructor options that ``ThdAttention``'s own arguments set."""
    for key, instead in _RESERVED_TE_OPTIONS.items():
        if key in te_options:
            raise ConfigError(f"te_options may not set {key!r}: ThdAttention sets it; pass {instead} instead")


def build_te_attention(
    te_cls: Any,
    *,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    mask: AttentionMask,
    softmax_scale: float | None,
    cp_group: dist.ProcessGroup | None,
    cp_comm_type: CpCommType,
    cp_subgroups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None,
    te_options: dict[str, Any],
) -> nn.Module:
    """TE's ``DotProductAttention`` in THD with this mask, its CP group set when ``cp_group`` has
    more than one rank (rules already checked)."""
    dpa: nn.Module = te_cls(
        num_attention_heads=num_heads,
        kv_channels=head_dim,
        num_gqa_groups=num_kv_heads,
        qkv_format="thd",
        attn_mask_type=mask.te_mask_type,
        window_size=mask.window_size,
        softmax_scale=softmax_scale,
        **te_options,
    )
    if cp_group is not None and dist.get_world_size(cp_group) > 1:
        groups: Any = list(cp_subgroups) if cp_comm_type == CpCommType.A2A_P2P and cp_subgroups else cp_group
        stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        dpa.set_context_parallel_group(  # type: ignore[operator]
            groups, dist.get_process_group_ranks(cp_group), stream, cp_comm_type.value
        )
    return dpa


def check_te_batch(batch: PackedBatch) -> None:
    """Refuse, before TE's kernels see it, a batch TE's CP cannot take: another layout than
    DualChunkSwap, or a padded sequence length not divisible by ``2*cp``."""
    if batch.cp_size == 1:
        return
    if batch.cp_layout != CpLayout.DUALCHUNK:
        raise ConfigError(
            f"backend='te' under CP needs the dualchunk layout (TE's DualChunkSwap), but the batch is "
            f"cp_layout={batch.cp_layout.value!r}: shard with layout='dualchunk' or use backend='torch'"
        )
    multiple = 2 * batch.cp_size
    bad = (batch.cu_seqlens_padded % multiple != 0).nonzero()  # [N+1]: one host sync
    if bad.numel():
        i = int(bad[0, 0])
        raise ConfigError(
            f"cu_seqlens_padded[{i}]={int(batch.cu_seqlens_padded[i])} is not divisible by 2*cp_size={multiple}: "
            f"TE under CP needs every padded sequence length divisible by it; pack with "
            f"pad_multiple=pad_multiple_for(cp_size={batch.cp_size})"
        )


def te_forward_kwargs(batch: PackedBatch, mask: AttentionMask) -> dict[str, Any]:
    """The THD keyword arguments of TE's forward for this batch and mask.

    ``batch.te_kwargs()`` may pass the padded offsets as real lengths when only the pack's tail
    is padding (exact when causal); a mask that reaches right would attend those pads, so it
    gets the real lengths and ``pad_between_seqs=True``.
    """
    kwargs = batch.te_kwargs(include_format=False)
    if not mask.causal and kwargs["cu_seqlens_q"] is not batch.cu_seqlens:
        if not torch.equal(batch.cu_seqlens, batch.cu_seqlens_padded):  # [N+1]: one host sync
            kwargs.update(cu_seqlens_q=batch.cu_seqlens, cu_seqlens_kv=batch.cu_seqlens, pad_between_seqs=True)
    kwargs.update(qkv_format="thd", attn_mask_type=mask.te_mask_type)
    return kwargs
