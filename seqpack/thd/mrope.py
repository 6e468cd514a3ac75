"""Multimodal RoPE (mRoPE) positions of vision-language samples, for the model families seqpack
knows: Qwen2-VL, Qwen2.5-VL and Qwen3-VL (Qwen3-VL-MoE positions like Qwen3-VL).

Every token has three positions (temporal, height, width). A text token has its running
position on all three rows; the placeholders of an image or video (``t*h*w /
spatial_merge_size**2``, row-major) get the start position plus their grid coordinates, and
the running position then moves on by ``max(h, w) / spatial_merge_size``.
:func:`mrope_positions` is that rule, as transformers' ``get_rope_index`` computes it for one
sample alone; nothing here imports transformers. Qwen2.5-VL spaces a video's temporal
positions by ``tokens_per_second * second_per_grid_ts``; Qwen3-VL makes each video frame its
own placeholder run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.validation import check_int, check_positive_int

__all__ = ["MROPE_MODEL_TYPES", "MRopeSpec", "mrope_positions", "placeholder_runs"]

MROPE_MODEL_TYPES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
"""The HF ``model_type`` values whose mRoPE positions seqpack computes."""

TEXT, IMAGE, VIDEO = 0, 1, 2
"""``mm_token_type_ids`` values (the processors' convention)."""

_FRAME_RUNS = frozenset({"qwen3_vl", "qwen3_vl_moe"})  # one placeholder run per video frame


@dataclasses.dataclass(frozen=True)
class MRopeSpec:
    """What seqpack needs of a vision-language model to check and position its samples.

    Args:
        model_type: The HF ``model_type`` (one of :data:`MROPE_MODEL_TYPES`).
        image_token_id: The image placeholder token (``config.image_token_id``).
        video_token_id: The video placeholder token (``config.video_token_id``).
        spatial_merge_size: Patches merged per side into one placeholder
            (``config.vision_config.spatial_merge_size``).
        tokens_per_second: Qwen2.5-VL's temporal spacing of video positions
            (``config.vision_config.tokens_per_second``); unused by the other families.

    Raises:
        SampleError: A model type whose positions seqpack does not know.
        ConfigError, SeqpackTypeError: Token ids or sizes out of range or not integers.
    """

    model_type: str
    image_token_id: int
    video_token_id: int
    spatial_merge_size: int = 2
    tokens_per_second: float = 1.0

    def __post_init__(self) -> None:
        if self.model_type not in MROPE_MODEL_TYPES:
            raise SampleError(
                f"model_type={self.model_type!r}: seqpack does not know this model's multimodal positions (it knows "
                f"{', '.join(MROPE_MODEL_TYPES)}); its samples cannot be packed exactly"
            )
        check_int("MRopeSpec.image_token_id", self.image_token_id, minimum=0)
        check_int("MRopeSpec.video_token_id", self.video_token_id, minimum=0)
        if self.image_token_id == self.video_token_id:
            raise ConfigError(f"MRopeSpec: image_token_id and video_token_id are both {self.image_token_id}")
        check_positive_int("MRopeSpec.spatial_merge_size", self.spatial_merge_size)
        if isinstance(self.tokens_per_second, bool) or not isinstance(self.tokens_per_second, (int, float)):
            raise SeqpackTypeError(f"MRopeSpec.tokens_per_second must be a number, got {self.tokens_per_second!r}")
        if not (math.isfinite(self.tokens_per_second) and self.tokens_per_second > 0):
            raise ConfigError(f"MRopeSpec.tokens_per_second must be finite and > 0, got {self.tokens_per_second}")

    @classmethod
    def from_hf(cls, config: Any) -> MRopeSpec:
        """The spec of a Hugging Face vision-language config (``model.config``, or the model),
        read by attribute: ``model_type``, ``image_token_id``, ``video_token_id`` and the vision
        config's ``spatial_merge_size`` (and ``tokens_per_second`` where it has one).

        Raises:
            SampleError: A model type whose positions seqpack does not know.
            ConfigError: A config without a vision config or placeholder token ids.
        """
        if getattr(config, "model_type", None) is None and hasattr(config, "config"):
            config = config.config  # a model given for its config
        model_type = getattr(config, "model_type", None)
        vision = getattr(config, "vision_config", None)
        if model_type in MROPE_MODEL_TYPES and vision is None:
            raise ConfigError(f"MRopeSpec.from_hf: the {model_type} config has no vision_config")
        missing = [name for name in ("image_token_id", "video_token_id") if getattr(config, name, None) is None]
        if model_type in MROPE_MODEL_TYPES and missing:
            raise ConfigError(f"MRopeSpec.from_hf: the {model_type} config has no {' or '.join(missing)}")
        return cls(
            model_type=str(model_type),
            image_token_id=getattr(config, "image_token_id", 0),
            video_token_id=getattr(config, "video_token_id", 1),
            spatial_merge_size=getattr(vision, "spatial_merge_size", 2),
            tokens_per_second=getattr(vision, "tokens_per_second", None) or 1.0,
        )

    @property
    def frame_runs(self) -> bool:
        """Whether each frame of a video is its own placeholder run (Qwen3-VL)."""
        return self.model_type in _FRAME_RUNS

    def token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``mm_token_type_ids`` of ``input_ids``: 1 at image placeholders, 2 at video ones,
        0 elsewhere (int64, as the processors give them)."""
        types = (input_ids == self.image_token_id).to(torch.int64)
        return types.masked_fill_(input_ids == self.video_token_id, VIDEO)


def placeholder_runs(types: torch.Tensor) -> list[tuple[int, int, int]]:
    """The runs of equal ``mm_token_type_ids`` in one sample: ``(type, start, end)`` each."""
    if types.numel() == 0:
        return []
    change = torch.nonzero(types[1:] != types[:-1]).flatten() + 1  # [runs - 1]
    bounds = [0, *change.tolist(), int(types.numel())]
    values = types[bounds[:-1]].tolist() if len(bounds) > 2 else [int(types[0])]
    return [(int(kind), bounds[i], bounds[i + 1]) for i, kind in enumerate(values)]


def mrope_positions(
    runs: list[tuple[int, int, int]],
    grids: dict[int, list[tuple[int, int, int]]],
    spec: MRopeSpec,
    video_intervals: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """One sample's mRoPE positions (int64 ``[3, L]``), as its model's ``get_rope_index`` gives
    them for the sample alone.

    Args:
        runs: The sample's :func:`placeholder_runs`, already checked against its grids.
        grids: Per modality (1 image, 2 video) the ``(t, h, w)`` of each placeholder run, in
            order (Qwen3-VL videos: one ``(1, h, w)`` per frame).
        spec: The model family.
        video_intervals: Qwen2.5-VL: the temporal spacing of each video run
            (``tokens_per_second * second_per_grid_ts``, a 0-d float tensor each).
    """
    merge = spec.spatial_merge_size
    parts: list[torch.Tensor] = []
    cursor = {IMAGE: 0, VIDEO: 0}
    pos = 0
    for kind, start, end in runs:
        if kind == TEXT:
            parts.append((torch.arange(end - start, dtype=torch.int64) + pos).expand(3, -1))
            pos += end - start
            continue
        t, h, w = grids[kind][cursor[kind]]
        temporal = torch.arange(t, dtype=torch.int64)
        if kind == VIDEO and video_intervals is not None:
            # Truncated like the model's (arange * interval).long(), in the interval's dtype.
            temporal = (temporal * video_intervals[cursor[kind]]).long()
        cursor[kind] += 1
        grid_t, grid_h, grid_w = torch.meshgrid(
            temporal + pos,
            torch.arange(h // merge, dtype=torch.int64) + pos,
            torch.arange(w // merge, dtype=torch.int64) + pos,
            indexing="ij",
        )
        parts.append(torch.stack([grid_t, grid_h, grid_w]).reshape(3, -1))  # [3, t*h*w/merge**2]
        pos += max(h, w) // merge  # the model's rule: the grid's larger side, not its time
    if not parts:
        return torch.zeros(3, 0, dtype=torch.int64)
    return torch.cat(parts, dim=1)
