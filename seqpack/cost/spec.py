"""ModelSpec: the shape of a dense or hybrid (Mamba2 + attention) model, its exact training
FLOPs and its FLOPs cost model.

:class:`ModelSpec` describes a dense or hybrid model with full and sliding-window attention
layers and gives its exact training FLOPs (formulas: :mod:`seqpack.cost.flops`) and its
FLOPs :class:`~seqpack.cost.CostModel` (:meth:`ModelSpec.cost_model`);
:mod:`seqpack.cost.presets` builds one per published shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from seqpack.cost.flops import (
    TRAIN,
    attention_projection_forward,
    attention_score_forward,
    logits_forward,
    mamba2_forward_per_token,
    mlp_forward,
    parameter_count,
)
from seqpack.cost.shapes import check_layer_pattern
from seqpack.cost.terms import exact_sums
from seqpack.errors import ConfigError
from seqpack.validation import check_bool, check_int, check_window

if TYPE_CHECKING:
    from seqpack.cost.model import CostModel

__all__ = ["ModelSpec"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense transformer or a Mamba2/attention hybrid, for FLOPs and cost.

    Attributes:
        hidden_size: Model width ``h``.
        num_layers: Transformer layers (each attention + MLP), or, with
            ``hybrid_layer_pattern``, the pattern's length.
        num_attention_heads: Query heads.
        ffn_hidden_size: MLP inner width (per projection; ``intermediate_size`` in HF).
        num_query_groups: Key/value heads (GQA); ``None`` means multi-head attention.
        vocab_size: Output vocabulary; ``None`` leaves the logits layer out.
        kv_channels: Head dimension; default ``hidden_size // num_attention_heads``.
        gated_linear_unit: SwiGLU-style MLP with three projections (default, as in Llama,
            Qwen, Mistral); ``False`` for two (GELU, squared ReLU).
        causal: Causal attention computes half of the score and value products.
        hybrid_layer_pattern: Megatron's hybrid pattern, one character per layer: ``M``
            Mamba2, ``*`` attention, ``-`` MLP, and seqpack's ``W``: sliding-window attention
            (window ``window_size``; :data:`~seqpack.cost.shapes.LAYER_TYPES`). A dense model
            with mixed windows is written as a pattern too (``"W-*-"``: a windowed then a
            full transformer layer).
        mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads, mamba_expand:
            Mamba2 mixer shape (``d_state``, ``headdim``, ``ngroups``, ``nheads`` (default
            ``expand*h/headdim``), ``expand``).
        name: A label for tables.
        window_size: Sliding-window attention's left window ``W`` (Transformer Engine's and
            Megatron's ``window_size=(W, 0)``: a query attends itself and the ``W`` tokens
            before it; bidirectional layers ``(W, W)``). Without a pattern every attention
            layer is windowed; with one, its ``W`` layers are. ``0 <= W <= 2**31 - 1``
            (:data:`seqpack.validation.MAX_WINDOW`: the widest window ``ThdAttention`` runs).
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    num_query_groups: int | None = None
    vocab_size: int | None = None
    kv_channels: int | None = None
    gated_linear_unit: bool = True
    causal: bool = True
    hybrid_layer_pattern: str | None = None
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None
    mamba_expand: int = 2
    name: str = ""
    window_size: int | None = None

    def __post_init__(self) -> None:
        # Stored as Python ints: numpy ints (np.int32(4096)) would overflow the FLOPs products.
        for field in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_expand"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("num_query_groups", "vocab_size", "kv_channels", "mamba_num_heads"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        if self.window_size is not None:
            object.__setattr__(self, "window_size", check_window("window_size", self.window_size))
        for field in ("gated_linear_unit", "causal"):
            check_bool(field, getattr(self, field))
        groups = self.query_groups
        if self.num_attention_heads % groups:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_query_groups={groups}"
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "pass kv_channels"
            )
        pattern = self.hybrid_layer_pattern
        if pattern is not None:
            check_layer_pattern(pattern, self.num_layers, self.window_size)
            if "M" in pattern and self.mamba_inner % self.mamba_head_dim and self.mamba_num_heads is None:
                raise ConfigError(
                    f"mamba_expand*hidden_size={self.mamba_inner} is not divisible by "
                    f"mamba_head_dim={self.mamba_head_dim}; pass mamba_num_heads"
                )

    # -- shape helpers -------------------------------------------------------------------
    @property
    def query_groups(self) -> int:
        return self.num_attention_heads if self.num_query_groups is None else self.num_query_groups

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def attention_kinds(self) -> tuple[int, int]:
        """``(full, windowed)`` attention layer counts."""
        p = self.hybrid_layer_pattern
        if p is not None:
            return p.count("*"), p.count("W")
        return (self.num_layers, 0) if self.window_size is None else (0, self.num_layers)

    @property
    def layer_counts(self) -> tuple[int, int, int]:
        """``(attention, mlp, mamba)`` layer counts (attention: full and windowed)."""
        if self.hybrid_layer_pattern is None:
            return self.num_layers, self.num_layers, 0
        p = self.hybrid_layer_pattern
        return p.count("*") + p.count("W"), p.count("-"), p.count("M")

    @property
    def mamba_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    @property
    def mamba_heads(self) -> int:
        if self.mamba_num_heads is not None:
            return self.mamba_num_heads
        return self.mamba_inner // self.mamba_head_dim

    @property
    def query_width(self) -> int:
        """``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    # -- training FLOPs per token (linear), per s**2 (quadratic), per w(s, W) (windowed) -----
    @property
    def linear_flops(self) -> int:
        """Training FLOPs per token (everything that scales with ``seqlen_sum``)."""
        attention, mlp, mamba = self.layer_counts
        kv_width = self.query_groups * self.head_dim
        forward = (
            attention * attention_projection_forward(self.hidden_size, self.query_width, kv_width)
            + mlp * mlp_forward(self.hidden_size, self.ffn_hidden_size, self.gated_linear_unit)
            + mamba
            * mamba2_forward_per_token(
                self.hidden_size, self.mamba_inner, self.mamba_state_dim, self.mamba_num_groups, self.mamba_heads
            )
            + logits_forward(self.hidden_size, self.vocab_size)
        )
        return TRAIN * forward

    @property
    def quadratic_flops(self) -> int:
        """Training FLOPs per squared sequence length of the full attention layers (scales
        with ``seqlen_sq_sum``)."""
        full, _ = self.attention_kinds
        return TRAIN * full * attention_score_forward(self.query_width, self.causal)

    @property
    def windowed_flops(self) -> int:
        """Training FLOPs per unit of :func:`~seqpack.cost.terms.window_feature` of the
        sliding-window layers (scales with ``seqlen_window_sum``): per unit the same as a full
        layer per ``s**2``."""
        _, windowed = self.attention_kinds
        return TRAIN * windowed * attention_score_forward(self.query_width, self.causal)

    def flops(self, seqlen_sum: int, seqlen_sq_sum: int, seqlen_window_sum: int | None = None) -> int:
        """Training FLOPs (forward + backward) of sequences with these length sums.

        Args:
            seqlen_sum: ``sum(s_i)`` over the sequences (real lengths for exact accounting;
                Megatron feeds padded ones).
            seqlen_sq_sum: ``sum(s_i**2)``.
            seqlen_window_sum: ``sum(window_feature(s_i, window_size))``; needed when the
                model has sliding-window layers (:meth:`sequence_flops` takes lengths).

        Returns:
            Exact FLOPs as a Python int.

        Raises:
            ConfigError: Sliding-window layers and no ``seqlen_window_sum``.
        """
        seqlen_sum = check_int("seqlen_sum", seqlen_sum, minimum=0)
        seqlen_sq_sum = check_int("seqlen_sq_sum", seqlen_sq_sum, minimum=0)
        total = self.linear_flops * seqlen_sum + self.quadratic_flops * seqlen_sq_sum
        if self.attention_kinds[1]:
            if seqlen_window_sum is None:
                raise ConfigError(
                    f"{self.name or 'this model'} has sliding-window layers: pass seqlen_window_sum "
                    "(or call sequence_flops(lengths))"
                )
            total += self.windowed_flops * check_int("seqlen_window_sum", seqlen_window_sum, minimum=0)
        return total

    def sequence_flops(self, lengths: Sequence[int] | np.ndarray) -> int:
        """Exact training FLOPs of sequences of these ``lengths`` (every term)."""
        sums = exact_sums(lengths, self.window_size if self.attention_kinds[1] else None, "lengths")
        return self.flops(*sums)

    def cost_model(self, constant: float = 0.0) -> CostModel:
        """A :class:`CostModel` in training FLOPs: ``linear`` per token, ``quadratic`` per
        ``s**2`` and, with sliding-window layers, ``windowed`` per ``w(s, window_size)``."""
        from seqpack.cost.model import CostModel  # the cost module builds ModelSpecs: import it here

        if not self.attention_kinds[1]:
            return CostModel(float(self.linear_flops), float(self.quadratic_flops), constant)
        return CostModel(
            float(self.linear_flops),
            float(self.quadratic_flops),
            constant,
            windowed=float(self.windowed_flops),
            window=self.window_size,
        )

    def num_parameters(self) -> int:
        """Parameter count (bias-free linears, RMSNorm weights, untied embedding and output).

        A check against published model sizes; FLOPs do not depend on it.
        """
        return parameter_count(self)
