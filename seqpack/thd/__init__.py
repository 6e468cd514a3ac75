"""THD packing: many variable-length sequences on one token axis.

A microbatch in THD format is every sequence of the pack concatenated along one token axis,
with the boundaries in ``cu_seqlens`` (real lengths) and ``cu_seqlens_padded`` (memory
offsets when each sequence is padded at its end). Pure functions: no process groups.

Modules, in the order data flows through them: ``sample`` (the sample contract and label
alignment), ``layout`` (the one per-token layout), ``batch`` (:class:`PackedBatch`),
``pack`` and ``prepacked`` (samples to a batch), ``padding`` (length arithmetic, numpy only:
the schedulers plan with it), ``vision`` and ``mrope`` (vision-language samples),
``static_shapes`` (fixed shapes for ``torch.compile`` and CUDA graphs), ``cp`` (context
parallel layouts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack._lazy import lazy_exports

if TYPE_CHECKING:
    from seqpack.thd.batch import BATCH_TOKEN_FIELDS, PackedBatch, padding_only_batch
    from seqpack.thd.cp import (
        chunk_ids_after_attention,
        chunk_ids_before_attention,
        dualchunk_to_sequential,
        gather_order,
        partition_indices,
        reorder_seq_chunks,
        sequential_to_dualchunk,
        shard_for_cp,
        unshard_from_cp,
    )
    from seqpack.thd.layout import TokenLayout, seq_idx_from_cu_seqlens, token_layout
    from seqpack.thd.mrope import MRopeSpec
    from seqpack.thd.pack import batch_from_layout, pack_sequences
    from seqpack.thd.padding import (
        cp_pad_multiple,
        group_pad_multiple,
        group_padded_lengths,
        pad_multiple_for,
        padded_lengths,
    )
    from seqpack.thd.prepacked import sample_sequences, split_packed_sample
    from seqpack.thd.sample import (
        IGNORE_INDEX,
        SAMPLE_DTYPES,
        SAMPLES_NOT_BATCHES,
        TOKEN_KEYS,
        check_label_format,
        count_loss_tokens,
        label_alignment_counts,
        looks_misaligned,
        next_token_targets,
        normalize_sample,
    )
    from seqpack.thd.static_shapes import StaticShapes

# Each name is imported from its module on first use (seqpack._lazy.lazy_exports).
_HOMES = {
    "BATCH_TOKEN_FIELDS": "seqpack.thd.batch",
    "PackedBatch": "seqpack.thd.batch",
    "padding_only_batch": "seqpack.thd.batch",
    "chunk_ids_after_attention": "seqpack.thd.cp",
    "chunk_ids_before_attention": "seqpack.thd.cp",
    "dualchunk_to_sequential": "seqpack.thd.cp",
    "gather_order": "seqpack.thd.cp",
    "partition_indices": "seqpack.thd.cp",
    "reorder_seq_chunks": "seqpack.thd.cp",
    "sequential_to_dualchunk": "seqpack.thd.cp",
    "shard_for_cp": "seqpack.thd.cp",
    "unshard_from_cp": "seqpack.thd.cp",
    "TokenLayout": "seqpack.thd.layout",
    "seq_idx_from_cu_seqlens": "seqpack.thd.layout",
    "token_layout": "seqpack.thd.layout",
    "MRopeSpec": "seqpack.thd.mrope",
    "batch_from_layout": "seqpack.thd.pack",
    "pack_sequences": "seqpack.thd.pack",
    "cp_pad_multiple": "seqpack.thd.padding",
    "group_pad_multiple": "seqpack.thd.padding",
    "group_padded_lengths": "seqpack.thd.padding",
    "pad_multiple_for": "seqpack.thd.padding",
    "padded_lengths": "seqpack.thd.padding",
    "sample_sequences": "seqpack.thd.prepacked",
    "split_packed_sample": "seqpack.thd.prepacked",
    "IGNORE_INDEX": "seqpack.thd.sample",
    "SAMPLE_DTYPES": "seqpack.thd.sample",
    "SAMPLES_NOT_BATCHES": "seqpack.thd.sample",
    "TOKEN_KEYS": "seqpack.thd.sample",
    "check_label_format": "seqpack.thd.sample",
    "count_loss_tokens": "seqpack.thd.sample",
    "label_alignment_counts": "seqpack.thd.sample",
    "looks_misaligned": "seqpack.thd.sample",
    "next_token_targets": "seqpack.thd.sample",
    "normalize_sample": "seqpack.thd.sample",
    "StaticShapes": "seqpack.thd.static_shapes",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "BATCH_TOKEN_FIELDS",
    "IGNORE_INDEX",
    "MRopeSpec",
    "SAMPLES_NOT_BATCHES",
    "SAMPLE_DTYPES",
    "StaticShapes",
    "TOKEN_KEYS",
    "PackedBatch",
    "TokenLayout",
    "batch_from_layout",
    "check_label_format",
    "chunk_ids_after_attention",
    "chunk_ids_before_attention",
    "cp_pad_multiple",
    "group_pad_multiple",
    "group_padded_lengths",
    "count_loss_tokens",
    "dualchunk_to_sequential",
    "gather_order",
    "label_alignment_counts",
    "looks_misaligned",
    "next_token_targets",
    "normalize_sample",
    "pack_sequences",
    "pad_multiple_for",
    "padded_lengths",
    "padding_only_batch",
    "partition_indices",
    "reorder_seq_chunks",
    "sample_sequences",
    "seq_idx_from_cu_seqlens",
    "sequential_to_dualchunk",
    "shard_for_cp",
    "split_packed_sample",
    "token_layout",
    "unshard_from_cp",
]
