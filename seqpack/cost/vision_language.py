"""The :class:`~seqpack.cost.ModelSpec` fields of a Hugging Face text or vision-language config
(:meth:`ModelSpec.from_hf <seqpack.cost.ModelSpec.from_hf>`), read by attribute
(transformers 5.24's names; transformers is not imported).
"""

from __future__ import annotations

from typing import Any

from seqpack.cost.vision_encoder import VisionSpec
from seqpack.errors import ConfigError

__all__ = ["TEXT_MODEL_TYPES", "VISION_LANGUAGE_MODEL_TYPES", "model_fields_from_hf"]

TEXT_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text")
"""HF text ``model_type`` values :meth:`ModelSpec.from_hf <seqpack.cost.ModelSpec.from_hf>` reads."""
VISION_LANGUAGE_MODEL_TYPES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
"""HF vision-language ``model_type`` values it reads (with the vision encoder)."""
_LAYER_TYPES = {"full_attention": "*-", "sliding_attention": "W-"}


def model_fields_from_hf(config: Any) -> dict[str, Any]:
    """The :class:`~seqpack.cost.ModelSpec` keyword arguments of an HF config (or of a model,
    read for its ``config``); ``vision`` is a :class:`~seqpack.cost.VisionSpec` for a
    vision-language config and ``None`` for a text one. The attributes read:
    docs/multimodal.md, "Cost"; a layer whose ``layer_types`` entry is ``"sliding_attention"``
    while ``sliding_window`` is set is a ``W`` layer of window ``sliding_window - 1`` (HF's
    mask: the ``sliding_window`` keys up to the query).

    Raises:
        ConfigError: A model type seqpack does not read (named), or a config without one of
            the attributes above.
    """
    if getattr(config, "model_type", None) is None and hasattr(config, "config"):
        config = config.config  # a model given for its config
    kind = getattr(config, "model_type", None)
    name = str(getattr(config, "name_or_path", "") or kind)
    if kind in TEXT_MODEL_TYPES:
        return {**_text_fields(config, str(kind)), "name": name, "vision": None}
    if kind in VISION_LANGUAGE_MODEL_TYPES:
        for part in ("text_config", "vision_config"):
            if getattr(config, part, None) is None:
                raise ConfigError(f"ModelSpec.from_hf: the {kind} config has no {part}")
        text = _text_fields(config.text_config, f"{kind} text_config")
        return {**text, "name": name, "vision": VisionSpec.from_hf(config.vision_config)}
    known = ", ".join(TEXT_MODEL_TYPES + VISION_LANGUAGE_MODEL_TYPES)
    raise ConfigError(f"ModelSpec.from_hf: model_type={kind!r} is not one seqpack reads (it reads {known})")


def _text_fields(config: Any, where: str) -> dict[str, Any]:
    def read(name: str) -> Any:
        if not hasattr(config, name):
            raise ConfigError(f"ModelSpec.from_hf: the {where} config has no {name}")
        return getattr(config, name)

    layers = read("num_hidden_layers")
    pattern, window = _sliding_layers(config, layers, where)
    return {
        "hidden_size": read("hidden_size"),
        "num_layers": layers if pattern is None else len(pattern),
        "num_attention_heads": read("num_attention_heads"),
        "ffn_hidden_size": read("intermediate_size"),
        "num_query_groups": getattr(config, "num_key_value_heads", None),
        "vocab_size": read("vocab_size"),
        "kv_channels": getattr(config, "head_dim", None),
        "hybrid_layer_pattern": pattern,
        "window_size": window,
    }


def _sliding_layers(config: Any, layers: int, where: str) -> tuple[str | None, int | None]:
    """``(hybrid_layer_pattern, window_size)`` of the sliding-window layers, or ``(None, None)``."""
    types = getattr(config, "layer_types", None)
    sliding = getattr(config, "sliding_window", None)
    if types is None or sliding is None or "sliding_attention" not in types:
        return None, None
    unknown = sorted(set(types) - set(_LAYER_TYPES))
    if unknown:
        raise ConfigError(f"ModelSpec.from_hf: the {where} config's layer_types hold {unknown}, not ones seqpack reads")
    if len(types) != layers:
        raise ConfigError(
            f"ModelSpec.from_hf: the {where} config has {len(types)} layer_types for num_hidden_layers={layers}"
        )
    if not isinstance(sliding, int) or isinstance(sliding, bool) or sliding < 1:
        raise ConfigError(f"ModelSpec.from_hf: the {where} config's sliding_window={sliding!r} is not an int >= 1")
    return "".join(_LAYER_TYPES[t] for t in types), sliding - 1
