"""A tiny hybrid language model (attention + Mamba2 blocks) that eats seqpack's THD batches.

It exists to show the whole pipeline training for real: token embedding, a stack of blocks
(``"A"``: RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual;
``"M"``: RMSNorm -> Mamba2 mixer -> residual), final RMSNorm and an LM head. Every token
field it reads comes from a (CP-sharded) :class:`~seqpack.thd.PackedBatch`: ``input_ids``,
``position_ids`` for RoPE, ``labels`` / ``loss_mask`` for the loss.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.cost import ModelSpec
from seqpack.errors import ConfigError, SeqpackError
from seqpack.options import AttentionBackend
from seqpack.thd import PackedBatch

__all__ = ["TinyConfig", "TinyHybridLM"]


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 256
    d_model: int = 64
    pattern: str = "AMAM"  # one letter per block: A = attention, M = Mamba2
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_mult: int = 4
    d_state: int = 16
    mamba_headdim: int = 16
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern or set(self.pattern) - {"A", "M"}:
            raise ConfigError(f"pattern must be a non-empty string of 'A'/'M', got {self.pattern!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def model_spec(self) -> ModelSpec:
        """The :class:`~seqpack.cost.ModelSpec` of this model, for FLOPs and the scheduler's
        cost model (an ``A`` block is Megatron's ``*-``: attention then MLP)."""

        layers = "".join("*-" if kind == "A" else "M" for kind in self.pattern)
        return ModelSpec(
            hidden_size=self.d_model,
            num_layers=len(layers),
            num_attention_heads=self.num_heads,
            ffn_hidden_size=self.ffn_mult * self.d_model,
            num_query_groups=self.num_kv_heads,
            vocab_size=self.vocab_size,
            hybrid_layer_pattern=layers,
            mamba_state_dim=self.d_state,
            mamba_head_dim=self.mamba_headdim,
            mamba_num_groups=1,
            mamba_expand=2,
            name=f"tiny-{self.pattern}-d{self.d_model}",
        )


def RMSNorm(dim: int, eps: float = 1e-6) -> nn.RMSNorm:
    """torch's RMSNorm (``x * rsqrt(mean(x**2) + eps) * weight``; parameter ``weight``)."""
    return nn.RMSNorm(dim, eps=eps)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding of ``x`` [T, heads, head_dim] at integer ``positions`` [T]."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]  # (T, half)
    cos, sin = angles.cos()[:, None, :].to(x.dtype), angles.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class AttentionBlock(nn.Module):
    def __init__(self, cfg: TinyConfig, cp_group: ProcessGroup | None, backend: AttentionBackend | str):
        super().__init__()
        self.cfg = cfg
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.norm1 = RMSNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * kv_dim, bias=False)
        self.attn = ThdAttention(
            cfg.num_heads, cfg.head_dim, num_kv_heads=cfg.num_kv_heads, backend=backend, cp_group=cp_group
        )
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.norm2 = RMSNorm(cfg.d_model)
        hidden = cfg.ffn_mult * cfg.d_model
        self.up = nn.Linear(cfg.d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).split(
            [cfg.d_model, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim], dim=-1
        )
        q = rope(q.view(t, cfg.num_heads, cfg.head_dim), batch.position_ids, cfg.rope_base)
        k = rope(k.view(t, cfg.num_kv_heads, cfg.head_dim), batch.position_ids, cfg.rope_base)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
        x = x + self.proj(self.attn(q, k, v, batch).reshape(t, cfg.d_model))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class MambaBlock(nn.Module):
    def __init__(self, cfg: TinyConfig, cp_group: ProcessGroup | None):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model)
        self.mixer = Mamba2Mixer(cfg.d_model, d_state=cfg.d_state, headdim=cfg.mamba_headdim, cp_group=cp_group)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        return x + self.mixer(self.norm(x), batch)


class TinyHybridLM(nn.Module):
    """Embedding -> blocks (``cfg.pattern``) -> RMSNorm -> LM head, on THD batches."""

    def __init__(
        self,
        cfg: TinyConfig,
        *,
        cp_group: ProcessGroup | None = None,
        backend: AttentionBackend | str = AttentionBackend.TORCH,
    ):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            AttentionBlock(cfg, cp_group, backend) if kind == "A" else MambaBlock(cfg, cp_group) for kind in cfg.pattern
        )
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Logits ``[T_local, vocab]`` for this rank's tokens."""
        x = self.embed(batch.input_ids)  # (T, d)
        for block in self.blocks:
            x = block(x, batch)
        return self.head(self.norm(x))

    def loss_sum(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token losses weighted by ``loss_mask``, number of loss tokens) on this rank."""
        if batch.labels is None or batch.loss_mask is None:
            raise SeqpackError("loss_sum needs a batch with labels and loss_mask (not a middle pipeline stage's)")
        logits = self(batch)
        labels = batch.labels.clamp(min=0)
        # At least float32 (bf16 logits are upcast); a float64 model keeps float64.
        losses = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels, reduction="none")
        return (losses * batch.loss_mask).sum(), batch.loss_mask.sum()
