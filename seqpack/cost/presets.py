"""Ready-made models: one :class:`~seqpack.cost.ModelSpec` per published shape, the default
cost model, and :func:`transformer_flops` (a shape's FLOPs in one call)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack.cost.model import CostModel, ModelSpec
from seqpack.cost.shapes import DEFAULT_MODEL, PRESET_SHAPES, FlopsOptions, preset_shape

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_MODEL", "MODEL_PRESETS", "default_cost_model", "model_preset", "transformer_flops"]

MODEL_PRESETS: dict[str, ModelSpec] = {
    name: ModelSpec(**shape, name=name)  # type: ignore[arg-type]
    for name, shape in PRESET_SHAPES.items()
}
"""Published shapes (:data:`seqpack.cost.shapes.PRESET_SHAPES`): Llama 3 (8B/70B/405B),
Qwen2.5-7B, Nemotron-H-8B (Mamba2/attention hybrid), gpt-oss-20b and Gemma 3 27B
(sliding-window and full attention)."""


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered as ``name`` in :data:`MODEL_PRESETS`.

    Raises:
        ConfigError: Unknown name (the message lists the known ones).
    """
    preset_shape(name)  # the error for an unknown name
    return MODEL_PRESETS[name]


def default_cost_model() -> CostModel:
    """Training FLOPs of :data:`DEFAULT_MODEL` (Llama-3-8B shaped): what ``balanced`` uses
    when ``cost=None``. Attention is 12.5% of an 8K-token sequence's cost under it."""
    return MODEL_PRESETS[DEFAULT_MODEL].cost_model()


def transformer_flops(
    hidden_size: int,
    num_layers: int,
    num_attention_heads: int,
    ffn_hidden_size: int,
    num_query_groups: int | None = None,
    vocab_size: int | None = None,
    *,
    seqlen_sum: int,
    seqlen_sq_sum: int,
    seqlen_window_sum: int | None = None,
    **options: Unpack[FlopsOptions],
) -> int:
    """Training FLOPs (forward + backward) of a transformer over packed sequences.

    Args:
        hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups,
            vocab_size: Model shape (see :class:`ModelSpec`).
        seqlen_sum: ``sum(s_i)``.
        seqlen_sq_sum: ``sum(s_i**2)``.
        seqlen_window_sum: ``sum(window_feature(s_i, window_size))`` (sliding-window layers).
        **options: Further :class:`ModelSpec` fields (``causal``, ``gated_linear_unit``,
            ``kv_channels``, ``hybrid_layer_pattern``, ``window_size`` and the ``mamba_*``
            shape).

    Returns:
        Exact FLOPs (Python int).
    """
    spec = ModelSpec(
        hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups, vocab_size, **options
    )
    return spec.flops(seqlen_sum, seqlen_sq_sum, seqlen_window_sum)
