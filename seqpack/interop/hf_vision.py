"""What :func:`seqpack.interop.hf.to_hf` gives a Hugging Face vision-language model (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL) for a pack of :func:`~seqpack.thd.pack_sequences` with ``mrope=``.

Read from transformers 5.24's ``modeling_qwen2_vl.py`` / ``modeling_qwen2_5_vl.py`` /
``modeling_qwen3_vl.py``:

- ``position_ids`` are ``[4, 1, T]``: the text row first, then the three mRoPE rows. The text
  model splits off row 0 as ``text_position_ids`` and builds the packed causal mask from it
  (``masking_utils.find_packed_sequence_indices``: a sequence starts wherever a position is
  not the previous one plus 1), and flash attention finds its sequences in it. Given only the
  three mRoPE rows (``[3, 1, T]``) the models drop the text row and attend across the
  documents of the pack (transformers #39400; axolotl #3817); given ``[1, T]``, Qwen2-VL and
  Qwen2.5-VL do the same, and so does the model's own ``get_rope_index`` when
  ``position_ids`` is ``None`` (three rows, over the pack as one sample; transformers
  #38007). The mRoPE rows are each sequence's own, as ``get_rope_index`` gives them for the
  sample alone (rows that count on through the pack would move each sequence by one offset,
  which rotary attention within a sequence does not see; text positions on them would not).
- ``pixel_values`` / ``image_grid_thw`` (and the video pair) hold every image of the pack in
  sequence order, so ``masked_scatter`` puts each image's embeddings on its own placeholders;
  the vision tower attends within each image (each frame, or window), so packing does not
  change what it computes.
- ``cu_seq_lens_*`` / ``max_length_*`` as for text (flash attention's offsets of the text's
  sequences): the models pass their keyword arguments on to the vision tower, but
  ``accepts_precomputed_kwargs`` on ``get_image_features`` / ``get_video_features`` drops
  these four there, so the tower's flash call keeps its own per-image offsets
  (tests/interop/test_hf_vision.py checks it with a flash-style attention stand-in on CPU).
- ``mm_token_type_ids`` is passed as the processors give it; with ``position_ids`` given the
  models do not need it, but their generation path and future versions read it.
"""

from __future__ import annotations

import torch

from seqpack.errors import ConfigError
from seqpack.thd.batch import PackedBatch

__all__ = ["VISION_KEYS", "vision_kwargs"]

VISION_KEYS: tuple[str, ...] = (
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
)
"""What :func:`~seqpack.interop.hf.to_hf` adds to a text pack's keys for a vision-language pack
(each modality's pixels and grid where it has some)."""


def vision_kwargs(batch: PackedBatch) -> dict[str, torch.Tensor]:
    """A vision-language pack's ``position_ids`` ``[4, 1, T]``, ``mm_token_type_ids``
    ``[1, T]``, pixels and grids."""
    if batch.mrope_position_ids is None or batch.mm_token_type_ids is None:
        raise ConfigError("vision_kwargs needs a vision-language pack (pack_sequences(..., mrope=...))")
    kwargs = {
        "position_ids": torch.cat([batch.position_ids[None], batch.mrope_position_ids])[:, None],  # [4, 1, T]
        "mm_token_type_ids": batch.mm_token_type_ids[None],  # [1, T]
    }
    for name in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
        value = getattr(batch, name)
        if value is not None:
            kwargs[name] = value
    return kwargs
