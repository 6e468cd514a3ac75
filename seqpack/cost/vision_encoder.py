"""VisionSpec: the shape of a vision-language model's vision encoder (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, as transformers 5.24 builds them), and its training FLOPs per image, video and sample.

An image of grid ``(t, h, w)`` costs::

    linear_flops * t*h*w                                   patches, MLPs, projections, mergers
    + full_flops * t * (h*w)**2                            full-attention blocks, per frame
    + window_flops * t * m**4 * S(h/m, k) * S(w/m, k)      window-attention blocks (Qwen2.5-VL)

with ``m = spatial_merge_size``, ``k`` the window's side in merged patches and
``S(n, k)`` :func:`window_pairs`. The derivation, and what is left out as in
:func:`~seqpack.cost.transformer_flops`: docs/multimodal.md, "Cost"; the FLOPs equal what
PyTorch's ``FlopCounterMode`` counts over the HF encoder (tests/cost/test_vision_encoder.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from seqpack.cost.flops import FMA, TRAIN, attention_projection_forward, attention_score_forward, mlp_forward
from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.validation import check_bool, check_int, int64_array

__all__ = ["VISION_MODEL_TYPES", "VisionSpec", "window_pairs"]

VISION_MODEL_TYPES: tuple[str, ...] = ("qwen2_vl_vision", "qwen2_5_vl_vision", "qwen3_vl_vision")
"""The HF vision ``model_type`` values :meth:`VisionSpec.from_hf` reads."""


@dataclasses.dataclass(frozen=True)
class VisionSpec:
    """Shape of a vision encoder (a ViT with a patch merger), for its training FLOPs.

    Attributes:
        hidden_size: The encoder's width (HF: Qwen2-VL ``embed_dim``; Qwen2.5-VL and Qwen3-VL
            ``hidden_size``).
        num_layers: Transformer blocks (HF ``depth``).
        num_attention_heads: Heads (HF ``num_heads``); must divide ``hidden_size``.
        ffn_hidden_size: MLP inner width (Qwen2-VL ``embed_dim * mlp_ratio``; otherwise
            ``intermediate_size``).
        patch_size: Pixels per patch side.
        temporal_patch_size: Frames per patch.
        spatial_merge_size: Patches per merged (language) token side.
        out_hidden_size: The merger's output width (the language model's width).
        gated_linear_unit: A SwiGLU MLP (three projections, Qwen2.5-VL) rather than two.
        in_channels: Image channels.
        num_mergers: Patch mergers run over every image: 1, plus Qwen3-VL's deepstack mergers.
        window_size: Window attention's window in pixels, as the HF config gives it
            (Qwen2.5-VL: 112); ``None``: every block attends over the whole frame.
        full_attention_layers: With ``window_size``, the blocks that attend over the whole
            frame (Qwen2.5-VL ``fullatt_block_indexes``); the others attend within windows.
            ``None`` with a window: every block is windowed.
        name: A label for tables.
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    gated_linear_unit: bool = False
    in_channels: int = 3
    num_mergers: int = 1
    window_size: int | None = None
    full_attention_layers: tuple[int, ...] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        # Python ints: numpy ints would overflow the FLOPs products.
        for field in (
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "ffn_hidden_size",
            "patch_size",
            "temporal_patch_size",
            "spatial_merge_size",
            "out_hidden_size",
            "in_channels",
            "num_mergers",
        ):
            object.__setattr__(self, field, check_int(f"VisionSpec.{field}", getattr(self, field), minimum=1))
        check_bool("VisionSpec.gated_linear_unit", self.gated_linear_unit)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"VisionSpec.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        self._check_windows()

    def _check_windows(self) -> None:
        if self.window_size is None:
            if self.full_attention_layers is not None:
                raise ConfigError(
                    f"VisionSpec.full_attention_layers={self.full_attention_layers} without a window_size: "
                    "the other blocks would have no window; pass window_size or leave full_attention_layers out"
                )
            return
        window = check_int("VisionSpec.window_size", self.window_size, minimum=1)
        object.__setattr__(self, "window_size", window)
        unit = self.spatial_merge_size * self.patch_size
        if window < unit:
            raise ConfigError(
                f"VisionSpec.window_size={window} pixels is under one merged patch "
                f"(spatial_merge_size*patch_size={unit}): a window must hold at least one"
            )
        layers = self.full_attention_layers
        if layers is None:
            return
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise SeqpackTypeError(f"VisionSpec.full_attention_layers must be a sequence of ints, got {layers!r}")
        checked = tuple(
            check_int("VisionSpec.full_attention_layers element", i, minimum=0, maximum=self.num_layers - 1)
            for i in layers
        )
        if len(set(checked)) != len(checked):
            raise ConfigError(f"VisionSpec.full_attention_layers={checked} repeats a block")
        object.__setattr__(self, "full_attention_layers", tuple(sorted(checked)))

    @classmethod
    def from_hf(cls, config: Any) -> VisionSpec:
        """The spec of a Hugging Face vision config (a VL config is read for its
        ``vision_config``), by attribute as transformers 5.24's encoders build their layers
        (the attributes read per model type: docs/multimodal.md, "Cost").

        Raises:
            ConfigError: Another model type (named), or a config without one of these.
        """
        if getattr(config, "vision_config", None) is not None:
            config = config.vision_config
        kind = getattr(config, "model_type", None)
        if kind not in VISION_MODEL_TYPES:
            raise ConfigError(
                f"VisionSpec.from_hf: model_type={kind!r} is not a vision encoder seqpack reads "
                f"(it reads {', '.join(VISION_MODEL_TYPES)})"
            )

        def read(name: str) -> Any:
            if not hasattr(config, name):
                raise ConfigError(f"VisionSpec.from_hf: the {kind} config has no {name}")
            return getattr(config, name)

        common = {
            "num_layers": read("depth"),
            "num_attention_heads": read("num_heads"),
            "patch_size": read("patch_size"),
            "temporal_patch_size": read("temporal_patch_size"),
            "spatial_merge_size": read("spatial_merge_size"),
            "in_channels": read("in_channels"),
            "name": kind,
        }
        if kind == "qwen2_vl_vision":
            width = read("embed_dim")
            return cls(
                width, ffn_hidden_size=int(width * read("mlp_ratio")), out_hidden_size=read("hidden_size"), **common
            )
        shape = {"ffn_hidden_size": read("intermediate_size"), "out_hidden_size": read("out_hidden_size"), **common}
        if kind == "qwen2_5_vl_vision":
            layers = tuple(read("fullatt_block_indexes"))
            return cls(
                read("hidden_size"),
                gated_linear_unit=True,
                window_size=read("window_size"),
                full_attention_layers=layers,
                **shape,
            )
        return cls(read("hidden_size"), num_mergers=1 + len(read("deepstack_visual_indexes")), **shape)

    @property
    def window_units(self) -> int | None:
        """The window's side in merged patches (``window_size // spatial_merge_size //
        patch_size``, as transformers' ``get_vision_window_index``), ``None`` without windows."""
        if self.window_size is None:
            return None
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def attention_kinds(self) -> tuple[int, int]:
        """``(full, windowed)`` block counts."""
        if self.window_size is None:
            return self.num_layers, 0
        full = len(self.full_attention_layers or ())
        return full, self.num_layers - full

    @property
    def linear_flops(self) -> int:
        """Training FLOPs per patch: the patch embedding (forward and weight gradient), every
        block's projections and MLP, and the mergers (a merger's two linears per merged token,
        spread over its patches)."""
        width = self.hidden_size
        merged = width * self.spatial_merge_size**2  # the merger's input width
        embed = FMA * self.in_channels * self.temporal_patch_size * self.patch_size**2 * width
        block = attention_projection_forward(width, width, width) + mlp_forward(
            width, self.ffn_hidden_size, self.gated_linear_unit
        )
        merger = FMA * width * (merged + self.out_hidden_size)  # FMA*(merged**2 + merged*out) / m**2
        # The pixels need no gradient: the patch embedding's backward is its weight gradient alone.
        return (TRAIN - 1) * embed + TRAIN * (self.num_layers * block + self.num_mergers * merger)

    @property
    def full_flops(self) -> int:
        """Training FLOPs per attention pair (query, key) of the full-attention blocks."""
        return TRAIN * self.attention_kinds[0] * attention_score_forward(self.hidden_size, causal=False)

    @property
    def window_flops(self) -> int:
        """Training FLOPs per attention pair of the window-attention blocks."""
        return TRAIN * self.attention_kinds[1] * attention_score_forward(self.hidden_size, causal=False)

    @property
    def coefficients(self) -> tuple[int, int, int]:
        """``(linear_flops, full_flops, window_flops)``: FLOPs per unit of each of
        :meth:`grid_features`' columns."""
        return self.linear_flops, self.full_flops, self.window_flops

    def grid_features(self, grid_thw: Any) -> np.ndarray:
        """Per grid row ``(t, h, w)``: its patches ``t*h*w``, full-attention pairs
        ``t*(h*w)**2`` and window-attention pairs (0 without windows), int64 ``[k, 3]``.

        Raises:
            SeqpackTypeError: Grids that are not integers.
            SampleError: Not ``[k, 3]``, a size under 1, or ``h``, ``w`` not multiples of
                ``spatial_merge_size``; the row is named.
        """
        grid = self._check_grid(grid_thw)
        t, h, w = grid[:, 0], grid[:, 1], grid[:, 2]
        frame = h * w
        features = np.zeros((len(grid), 3), dtype=np.int64)
        features[:, 0] = t * frame
        features[:, 1] = t * frame * frame
        if self.window_units is not None:
            m = self.spatial_merge_size
            features[:, 2] = (
                t * m**4 * window_pairs(h // m, self.window_units) * window_pairs(w // m, self.window_units)
            )
        return features

    def grid_flops(self, grid_thw: Any) -> np.ndarray:
        """Training FLOPs of each image or video (grid row ``(t, h, w)``), float64 ``[k]``."""
        return self.grid_features(grid_thw).astype(np.float64) @ np.asarray(self.coefficients, dtype=np.float64)

    def flops(self, image_grid_thw: Any = None, video_grid_thw: Any = None) -> int:
        """Training FLOPs of the encoder over one sample's images and videos (exact).

        Args:
            image_grid_thw: The sample's ``[images, 3]`` grids, or ``None``.
            video_grid_thw: The sample's ``[videos, 3]`` grids, or ``None``.
        """
        coefficients = self.coefficients
        total = 0
        for grid in (image_grid_thw, video_grid_thw):
            if grid is None:
                continue
            for row in self.grid_features(grid).tolist():  # Python ints: no int64 overflow
                total += sum(c * f for c, f in zip(coefficients, row, strict=True))
        return total

    def sample_flops(self, grid_thw: Any, sample_index: Any, num_samples: int) -> np.ndarray:
        """:meth:`flops` of many samples at once, float64 ``[num_samples]`` (0 for a sample
        without images).

        Args:
            grid_thw: ``[k, 3]`` grid rows of all samples' images and videos.
            sample_index: ``[k]`` the sample (``0 <= i < num_samples``) each row belongs to.
            num_samples: How many samples.

        Raises:
            SampleError: Grids as in :meth:`grid_features`, or ``sample_index`` of another
                length than the grids or out of range.
        """
        num_samples = check_int("num_samples", num_samples, minimum=0)
        per_grid = self.grid_flops(grid_thw)
        owner = int64_array("sample_index", sample_index).reshape(-1)
        if len(owner) != len(per_grid):
            raise SampleError(f"sample_index has {len(owner)} entries but grid_thw has {len(per_grid)} rows")
        if len(owner) and (owner.min() < 0 or owner.max() >= num_samples):
            bad = int(owner[(owner < 0) | (owner >= num_samples)][0])
            raise SampleError(f"sample_index holds {bad}, outside 0..{num_samples - 1} (num_samples={num_samples})")
        return np.bincount(owner, weights=per_grid, minlength=num_samples).astype(np.float64)

    def _check_grid(self, grid_thw: Any) -> np.ndarray:
        grid = int64_array("grid_thw", grid_thw)
        if grid.size == 0:
            return np.zeros((0, 3), dtype=np.int64)
        if grid.ndim != 2 or grid.shape[1] != 3:
            raise SampleError(f"grid_thw must be [k, 3] rows (t, h, w), got shape {list(grid.shape)}")
        bad = np.flatnonzero((grid < 1).any(axis=1))
        if len(bad):
            raise SampleError(f"grid_thw row {int(bad[0])} is {grid[bad[0]].tolist()}: t, h and w must be >= 1")
        m = self.spatial_merge_size
        bad = np.flatnonzero((grid[:, 1:] % m).any(axis=1))
        if len(bad):
            raise SampleError(
                f"grid_thw row {int(bad[0])} is {grid[bad[0]].tolist()}: h and w must be multiples of "
                f"spatial_merge_size={m}"
            )
        return grid


def window_pairs(n: Any, window: int) -> Any:
    """``sum(a**2)`` over the sizes ``a`` of the windows that tile ``n`` units ``window`` at a
    time (the last one cut short): ``(n // window) * window**2 + (n % window)**2``. Works on
    ints and int arrays."""
    return (n // window) * window**2 + (n % window) ** 2
