"""Model shapes as data: published configurations, the keyword arguments of
:class:`~seqpack.cost.ModelSpec`, and the letters of a hybrid layer pattern.
"""

from __future__ import annotations

from typing import TypedDict

from seqpack.errors import ConfigError, SeqpackTypeError

__all__ = [
    "DEFAULT_MODEL",
    "LAYER_TYPES",
    "PRESET_SHAPES",
    "FlopsOptions",
    "ShapeOptions",
    "check_layer_pattern",
    "preset_shape",
]

LAYER_TYPES = {"M": "Mamba2", "*": "attention", "W": "sliding-window attention", "-": "MLP"}
"""The letters of ``hybrid_layer_pattern``, one per layer: Megatron-LM's ``M``, ``*`` and
``-``, and seqpack's ``W`` (Megatron has no window letter)."""


def check_layer_pattern(pattern: object, num_layers: int, window_size: int | None) -> str:
    """``pattern`` if it is a valid ``hybrid_layer_pattern`` of ``num_layers`` layers for
    this ``window_size`` (``W`` layers need one, and a window needs ``W`` layers).

    Raises:
        SeqpackTypeError: Not a string.
        ConfigError: Unknown letters, the wrong length, or windows that do not match.
    """
    if not isinstance(pattern, str):
        raise SeqpackTypeError(f"hybrid_layer_pattern must be a string, got {type(pattern).__name__}")
    bad = sorted(set(pattern) - set(LAYER_TYPES))
    if bad:
        letters = ", ".join(f"{letter} ({kind})" for letter, kind in LAYER_TYPES.items())
        raise ConfigError(f"hybrid_layer_pattern {pattern!r} has unknown layer types {bad}; use {letters}")
    if len(pattern) != num_layers:
        raise ConfigError(f"hybrid_layer_pattern has {len(pattern)} layers but num_layers={num_layers}")
    if "W" in pattern and window_size is None:
        raise ConfigError(
            f"hybrid_layer_pattern has {pattern.count('W')} sliding-window layers (W) but no window_size; "
            "pass window_size=W"
        )
    if "W" not in pattern and window_size is not None:
        raise ConfigError(
            f"window_size={window_size} but hybrid_layer_pattern has no sliding-window layer (W): mark the windowed "
            "attention layers W, or leave window_size out"
        )
    return pattern


class ShapeOptions(TypedDict, total=False):
    """The optional :class:`~seqpack.cost.ModelSpec` fields (besides ``causal``), as keyword
    arguments."""

    kv_channels: int | None
    gated_linear_unit: bool
    hybrid_layer_pattern: str | None
    mamba_state_dim: int
    mamba_head_dim: int
    mamba_num_groups: int
    mamba_num_heads: int | None
    mamba_expand: int
    name: str
    window_size: int | None


class FlopsOptions(ShapeOptions, total=False):
    """Keyword arguments of :func:`~seqpack.cost.transformer_flops` beyond the shape it names."""

    causal: bool


PRESET_SHAPES: dict[str, dict[str, object]] = {
    "llama3-8b": dict(
        hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=14336,
        num_query_groups=8, vocab_size=128256,
    ),
    "llama3-70b": dict(
        hidden_size=8192, num_layers=80, num_attention_heads=64, ffn_hidden_size=28672,
        num_query_groups=8, vocab_size=128256,
    ),
    "llama3-405b": dict(
        hidden_size=16384, num_layers=126, num_attention_heads=128, ffn_hidden_size=53248,
        num_query_groups=8, vocab_size=128256,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584, num_layers=28, num_attention_heads=28, ffn_hidden_size=18944,
        num_query_groups=4, vocab_size=152064,
    ),
    "nemotron-h-8b": dict(
        hidden_size=4096, num_layers=52, num_attention_heads=32, ffn_hidden_size=21504,
        num_query_groups=8, vocab_size=131072, kv_channels=128, gated_linear_unit=False,
        hybrid_layer_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        mamba_state_dim=128, mamba_head_dim=64, mamba_num_groups=8, mamba_num_heads=128,
    ),
    # gpt-oss-20b: 24 transformer layers alternating a 128-token window and full attention
    # (HF layer_types, sliding first); top-4 of 32 experts of width 2880 counted as one
    # 11520-wide SwiGLU MLP (the active FLOPs; the router's 2*h*32 per token left out).
    "gpt-oss-20b": dict(
        hidden_size=2880, num_layers=48, num_attention_heads=64, ffn_hidden_size=4 * 2880,
        num_query_groups=8, vocab_size=201088, kv_channels=64,
        hybrid_layer_pattern="W-*-" * 12, window_size=128,
    ),
    # Gemma 3 27B: 62 transformer layers, 5 local (window 1024) : 1 global (HF: layer i is
    # global when (i + 1) % 6 == 0), gated-GELU MLP, 262208-token vocabulary.
    "gemma3-27b": dict(
        hidden_size=5376, num_layers=124, num_attention_heads=32, ffn_hidden_size=21504,
        num_query_groups=16, vocab_size=262208, kv_channels=128,
        hybrid_layer_pattern="W-W-W-W-W-*-" * 10 + "W-W-", window_size=1024,
    ),
}  # fmt: skip
"""Published shapes (model cards and ``config.json``; windows are the published
``sliding_window``)."""

DEFAULT_MODEL = "llama3-8b"
"""The model whose FLOPs ``balanced`` balances when no cost model is given."""


def preset_shape(name: str) -> dict[str, object]:
    """The :data:`PRESET_SHAPES` entry ``name``.

    Raises:
        ConfigError: Unknown name (the message lists the known ones).
    """
    try:
        return PRESET_SHAPES[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        raise ConfigError(f"unknown model preset {name!r}; available: {', '.join(sorted(PRESET_SHAPES))}") from None
