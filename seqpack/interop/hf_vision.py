"""What :func:`seqpack.interop.hf.to_hf` gives a Hugging Face vision-language model (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, transformers 5.24) for a pack of :func:`~seqpack.thd.pack_sequences`
with ``mrope=``: ``position_ids`` ``[4, 1, T]`` (the text row, from which the models build the
packed causal mask, then each sequence's own mRoPE rows), the pack's pixels and grids in
sequence order, and ``mm_token_type_ids``. Why each is so: docs/multimodal.md.
"""

from __future__ import annotations

import torch

from seqpack.errors import ConfigError
from seqpack.thd.batch import PackedBatch
from seqpack.thd.sample import MEDIA_FIELDS

__all__ = ["vision_kwargs"]


def vision_kwargs(batch: PackedBatch) -> dict[str, torch.Tensor]:
    """A vision-language pack's ``position_ids`` ``[4, 1, T]``, ``mm_token_type_ids``
    ``[1, T]``, pixels and grids."""
    if batch.mrope_position_ids is None or batch.mm_token_type_ids is None:
        raise ConfigError("vision_kwargs needs a vision-language pack (pack_sequences(..., mrope=...))")
    kwargs = {
        "position_ids": torch.cat([batch.position_ids[None], batch.mrope_position_ids])[:, None],  # [4, 1, T]
        "mm_token_type_ids": batch.mm_token_type_ids[None],  # [1, T]
    }
    for name in (key for pair in MEDIA_FIELDS for key in pair):  # the pixels and grids
        value = getattr(batch, name)
        if value is not None:
            kwargs[name] = value
    return kwargs
