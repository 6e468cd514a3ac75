"""The vision-language half of :class:`~seqpack.cost.ModelSpec` (its base class
:class:`VisionLanguageTerms`): the ``vision`` encoder field, a sample's FLOPs, and
:meth:`~VisionLanguageTerms.from_hf` for Hugging Face text and vision-language configs, read by
attribute (transformers 5.24's names; transformers is not imported).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from seqpack.cost.vision_encoder import VisionSpec
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_int

if TYPE_CHECKING:
    from typing import Self

    from seqpack.cost.model import ModelSpec

__all__ = ["TEXT_MODEL_TYPES", "VISION_LANGUAGE_MODEL_TYPES", "VisionLanguageTerms", "model_fields_from_hf"]

TEXT_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text")
"""HF text ``model_type`` values :meth:`ModelSpec.from_hf <seqpack.cost.ModelSpec.from_hf>` reads."""
VISION_LANGUAGE_MODEL_TYPES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
"""HF vision-language ``model_type`` values it reads (with the vision encoder)."""
_LAYER_TYPES = {"full_attention": "*-", "sliding_attention": "W-"}


@dataclasses.dataclass(frozen=True)
class VisionLanguageTerms:
    """:class:`~seqpack.cost.ModelSpec`'s vision encoder and what it adds to a sample's FLOPs.

    Attributes:
        vision: The vision encoder (:class:`~seqpack.cost.VisionSpec`); ``None`` for a
            text-only model. Keyword-only.
    """

    vision: VisionSpec | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.vision is not None and not isinstance(self.vision, VisionSpec):
            raise SeqpackTypeError(f"ModelSpec.vision must be a VisionSpec or None, got {type(self.vision).__name__}")

    @classmethod
    def from_hf(cls, config: Any) -> Self:
        """The spec of a Hugging Face config object (or of a model, read for its ``config``), with
        the fields (and the errors) of :func:`model_fields_from_hf`."""
        return cls(**model_fields_from_hf(config))

    def sample_flops(self, length: int, image_grid_thw: Any = None, video_grid_thw: Any = None) -> int:
        """Exact training FLOPs of one sample: the language model over its ``length`` tokens
        (placeholders included) plus the vision encoder over its images and videos.

        Raises:
            ConfigError: Grids given to a model without a vision encoder.
        """
        spec = cast("ModelSpec", self)  # the only subclass
        text = spec.sequence_flops([check_int("length", length, minimum=0)])
        if self.vision is not None:
            return text + self.vision.flops(image_grid_thw, video_grid_thw)
        if any(grid is not None and len(grid) for grid in (image_grid_thw, video_grid_thw)):
            raise ConfigError(f"{spec.name or 'this model'} has no vision encoder (ModelSpec.vision) to cost images")
        return text


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
