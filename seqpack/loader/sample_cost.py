"""The vision encoder's cost of each sample in the wrapper (docs/multimodal.md, "The encoder's
cost in the plan"): its training FLOPs computed where the sample is read
(:func:`vision_flops_column`), gathered, and turned into the request's ``sample_cost`` in the
step's cost units (:func:`step_sample_cost`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from seqpack._logging import warn_once
from seqpack.cost import CostModel, ModelSpec
from seqpack.thd.sample import MEDIA_FIELDS

__all__ = ["encoder_price", "step_sample_cost", "vision_flops_column"]

logger = logging.getLogger(__name__)

_GRIDS = tuple(grid for _, grid in MEDIA_FIELDS)  # a sample with one of these has images or videos


def vision_flops_column(pool: Sequence[Mapping[str, torch.Tensor]], model: ModelSpec | None) -> np.ndarray:
    """int64 ``[len(pool)]``: each sequence's vision encoder training FLOPs (0 for text, and
    for every sequence when ``model`` has no vision encoder)."""
    out = np.zeros(len(pool), dtype=np.int64)
    if model is None or model.vision is None:
        return out
    for i, sample in enumerate(pool):
        if any(key in sample for key in _GRIDS):
            out[i] = model.vision.flops(sample.get("image_grid_thw"), sample.get("video_grid_thw"))
    return out


def step_sample_cost(
    vision_flops: np.ndarray,
    vision_bytes: np.ndarray,
    cost: CostModel,
    model: ModelSpec | None,
    price: float | None = None,
) -> np.ndarray | None:
    """The step's ``sample_cost`` (float64 ``[N]``, in ``cost``'s units): the gathered
    ``vision_flops`` times ``price`` (default :func:`encoder_price`). ``None`` when no sequence
    has encoder work or no vision encoder is known (logged once when ``vision_bytes`` show images)."""
    if model is None or model.vision is None:
        if np.any(vision_bytes > 0):
            warn_once(
                logger,
                "no-vision-spec",
                "samples with images or videos are planned on their tokens alone: pass "
                "PackingConfig(model=ModelSpec.from_hf(config)) to balance the vision encoder's work too",
            )
        return None
    if not np.any(vision_flops > 0):
        return None
    return vision_flops.astype(np.float64) * (encoder_price(cost, model) if price is None else price)


def encoder_price(cost: CostModel, model: ModelSpec) -> float:
    """``cost``'s price of one vision-encoder training FLOP: its price of a language-model
    FLOP, ``cost.linear / model.linear_flops`` (what a calibrator starts from)."""
    return cost.linear / float(model.linear_flops)
