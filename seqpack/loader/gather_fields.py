"""The step's length gather, as the loader fills it: the step fields every DP rank adds to
its header (:data:`STEP_GATHER_FIELDS`), the per-sample columns beside each length
(:data:`SAMPLE_COLUMNS`), and the sample-key bit mask those carry."""

from __future__ import annotations

import numpy as np

from seqpack.collective.fields import Header
from seqpack.thd import SAMPLE_DTYPES

__all__ = ["KEY_BITS", "SAMPLE_COLUMNS", "STEP_GATHER_FIELDS", "keys_of", "step_bytes_per_token"]

KEY_BITS = {key: 1 << i for i, key in enumerate(SAMPLE_DTYPES)}
"""The bit of each sample key in a key mask (``STEP_GATHER_FIELDS.key_mask``)."""

STEP_GATHER_FIELDS = Header(
    "step fields of the length gather (int64, the extras of every DP rank's header)",
    (
        ("exhausted", "1 when this rank's data ended this step"),
        ("empty_samples", "zero-length samples this rank dropped"),
        ("key_mask", "bit mask of the sample keys this rank's samples carry"),
        (
            "label_checked",
            "supervised tokens of the sequences read this step with labels, less those whose label equals both "
            "their own and the next token",
        ),
        (
            "label_misaligned",
            "how many of those carry the other alignment's target than label_format (the alignment guard)",
        ),
    ),
)
"""Followed by the words of this rank's microbatch times of earlier steps (:mod:`seqpack.calibrate`)."""

SAMPLE_COLUMNS = Header(
    "per-sample columns of the length gather (int64, one row per sequence, after its length)",
    (
        (
            "loss_tokens",
            "supervised tokens of the sequence once packed (truncated under on_oversize='truncate'): "
            "Step.num_loss_tokens and every PackedBatch.num_loss_tokens are sums of these",
        ),
        ("grouped", "1 when the sequence's sample carries a group_id (seqpack.loader.grouping), else 0"),
        ("group_id", "that group_id (0 when not grouped): sequences with equal ids stay on one DP replica"),
        (
            "vision_bytes",
            "bytes of the sequence's images and videos through the exchange (pixels, grid rows, mRoPE rows, "
            "seqpack.loader.vision_payload; 0 for text): they size the payload all-to-all and price locality",
        ),
        (
            "vision_flops",
            "the vision encoder's training FLOPs over the sequence's images and videos (PackingConfig(model=) "
            "with a VisionSpec; else 0): the scheduler's sample_cost, at the cost model's price of a FLOP",
        ),
    ),
)
"""What every DP rank learns about every sequence of the step, beside its length; a new
column is one more field here, filled in :func:`seqpack.loader.phases.sample_columns`."""


def keys_of(mask: int) -> list[str]:
    """Sample keys of a key bit mask, in :data:`SAMPLE_DTYPES` order."""
    return [key for key, bit in KEY_BITS.items() if mask & bit]


def step_bytes_per_token(mask: int, lengths: np.ndarray, columns: np.ndarray) -> float:
    """Bytes one token of the step carries through the exchange on average: its token fields
    (those of the key bit ``mask``) plus the step's ``vision_bytes`` spread over its tokens
    (what ``locality="auto"`` prices)."""
    tokens = int(np.asarray(lengths, dtype=np.int64).sum())
    extra = int(SAMPLE_COLUMNS.column(columns, "vision_bytes").sum())
    base = sum(SAMPLE_DTYPES[key].itemsize for key in keys_of(mask))
    return base + extra / tokens if tokens and extra else base
