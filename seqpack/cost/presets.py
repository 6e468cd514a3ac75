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
"""A :class:`ModelSpec` per published shape (:data:`seqpack.cost.shapes.PRESET_SHAPES`)."""


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered as ``name`` in :data:`MODEL_PRESETS`.

    Raises:
        ConfigError: Unknown name (the message lists the known ones).
    """
    preset_shape(name)  # the error for an unknown name
    return MODEL_PRESETS[name]


def default_cost_model() -> CostModel:
    """Training FLOPs of :data:`DEFAULT_MODEL`: what ``balanced`` uses when ``cost=None``."""
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

    The shape arguments and ``**options`` are :class:`ModelSpec` fields; the sums are
    :meth:`ModelSpec.flops`'s. Returns exact FLOPs (Python int).
    """
    spec = ModelSpec(
        hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups, vocab_size, **options
    )
    return spec.flops(seqlen_sum, seqlen_sq_sum, seqlen_window_sum)
