"""Old import path of :mod:`seqpack.thd.cp` (the DualChunkSwap partition); kept so
``from seqpack.cp import shard_for_cp`` keeps working."""

from __future__ import annotations

from seqpack._compat import warn_moved
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

warn_moved(__name__, "seqpack.thd.cp", stacklevel=2)

__all__ = [
    "partition_indices",
    "gather_order",
    "shard_for_cp",
    "unshard_from_cp",
    "chunk_ids_before_attention",
    "chunk_ids_after_attention",
    "reorder_seq_chunks",
    "dualchunk_to_sequential",
    "sequential_to_dualchunk",
]
