"""Published model shapes, as the keyword arguments of :class:`~seqpack.cost.ModelSpec`.

Plain data (no seqpack import): :data:`seqpack.cost.MODEL_PRESETS` builds one ``ModelSpec``
per entry. Each shape is the model's published configuration (Meta's, Qwen's and NVIDIA's
model cards and ``config.json`` files).
"""

from __future__ import annotations

__all__ = ["DEFAULT_MODEL", "PRESET_SHAPES"]

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
}  # fmt: skip
"""Llama 3 (8B/70B/405B), Qwen2.5-7B and Nemotron-H-8B (Mamba2/attention hybrid)."""

DEFAULT_MODEL = "llama3-8b"
"""The model whose FLOPs ``balanced`` balances when no cost model is given."""
