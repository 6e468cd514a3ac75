"""Training FLOPs formulas of the layer kinds a :class:`~seqpack.cost.ModelSpec` is made of,
as exact Python ints, following Megatron-LM's ``num_floating_point_operations``: forward FLOPs
per token or per squared sequence length; training is :data:`TRAIN` forwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack.errors import ConfigError
from seqpack.validation import check_int

if TYPE_CHECKING:
    from seqpack.cost.model import ModelSpec

__all__ = [
    "FMA",
    "TRAIN",
    "attention_projection_forward",
    "attention_score_forward",
    "logits_forward",
    "mamba2_flops",
    "mamba2_forward_per_token",
    "mlp_forward",
    "parameter_count",
]

TRAIN = 3
"""Training FLOPs per forward FLOP (forward + a backward of twice the forward)."""
FMA = 2
"""FLOPs per multiply-add."""


def attention_projection_forward(hidden: int, query_width: int, kv_width: int) -> int:
    """Forward FLOPs per token of one attention layer's Q, K, V and output projections
    (``query_width = heads * head_dim``, ``kv_width = kv_heads * head_dim``)."""
    return FMA * hidden * (query_width + 2 * kv_width) + FMA * query_width * hidden


def attention_score_forward(query_width: int, causal: bool) -> int:
    """Forward FLOPs per ``s**2`` of one attention layer: the ``QK^T`` and ``(QK^T)V``
    products, each ``s x s x query_width`` multiply-adds; causal attention counts half."""
    full = 2 * FMA * query_width
    return full // 2 if causal else full


def mlp_forward(hidden: int, ffn_hidden: int, gated: bool) -> int:
    """Forward FLOPs per token of one MLP: three projections when gated (SwiGLU), else two."""
    projections = 3 if gated else 2
    return FMA * projections * hidden * ffn_hidden


def logits_forward(hidden: int, vocab: int | None) -> int:
    """Forward FLOPs per token of the output layer (0 without a vocabulary)."""
    return 0 if vocab is None else FMA * hidden * vocab


def mamba2_forward_per_token(hidden: int, d_inner: int, state: int, groups: int, heads: int) -> int:
    """Forward FLOPs per token of one Mamba2 mixer: in_proj, SSD scan, out_proj."""
    in_proj = FMA * hidden * (2 * d_inner + 2 * groups * state + heads)
    scan = 7 * d_inner * state
    out_proj = FMA * d_inner * hidden
    return in_proj + scan + out_proj


def mamba2_flops(
    seqlen_sum: int,
    *,
    hidden_size: int,
    num_layers: int = 1,
    state_dim: int = 128,
    head_dim: int = 64,
    num_groups: int = 8,
    num_heads: int | None = None,
    expand: int = 2,
) -> int:
    """Training FLOPs of ``num_layers`` Mamba2 mixers over ``seqlen_sum`` tokens
    (:func:`mamba2_forward_per_token`)."""
    seqlen_sum = check_int("seqlen_sum", seqlen_sum, minimum=0)
    # Python ints: numpy ints would overflow the products below.
    hidden_size = check_int("hidden_size", hidden_size, minimum=1)
    num_layers = check_int("num_layers", num_layers, minimum=1)
    state_dim = check_int("state_dim", state_dim, minimum=1)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    num_groups = check_int("num_groups", num_groups, minimum=1)
    expand = check_int("expand", expand, minimum=1)
    d_inner = expand * hidden_size
    if num_heads is None:
        if d_inner % head_dim:
            raise ConfigError(f"expand*hidden_size={d_inner} is not divisible by head_dim={head_dim}; pass num_heads")
        num_heads = d_inner // head_dim
    heads = check_int("num_heads", num_heads, minimum=1)
    per_token = mamba2_forward_per_token(hidden_size, d_inner, state_dim, num_groups, heads)
    return TRAIN * num_layers * per_token * seqlen_sum


def parameter_count(spec: ModelSpec) -> int:
    """:meth:`ModelSpec.num_parameters <seqpack.cost.ModelSpec.num_parameters>`."""
    h = spec.hidden_size
    q = spec.query_width
    kv = spec.query_groups * spec.head_dim
    attention_layer = h * (q + 2 * kv) + q * h + h
    mlp_layer = (3 if spec.gated_linear_unit else 2) * h * spec.ffn_hidden_size + h
    d_in, g, n, heads = spec.mamba_inner, spec.mamba_num_groups, spec.mamba_state_dim, spec.mamba_heads
    conv_channels = d_in + 2 * g * n
    mamba_layer = (
        h * (2 * d_in + 2 * g * n + heads)  # in_proj
        + conv_channels * 5  # depthwise conv1d (kernel 4) + bias
        + 3 * heads  # dt_bias, A_log, D
        + d_in  # gated RMSNorm
        + d_in * h  # out_proj
        + h  # pre-norm
    )
    attention, mlp, mamba = spec.layer_counts
    vocab = 0 if spec.vocab_size is None else 2 * spec.vocab_size * h
    return attention * attention_layer + mlp * mlp_layer + mamba * mamba_layer + vocab + h
