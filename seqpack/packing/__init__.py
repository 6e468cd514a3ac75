"""Offline packing: sequences into as few packs of ``max_tokens`` tokens as found, on one rank.

Modules:
    packer: :func:`pack_lengths` (lengths to a :class:`Packing`), the token lower bound.
    dataset: :func:`pack_dataset` (rows or a ``datasets.Dataset`` to packed rows with
        ``position_ids``, ``cu_seqlens`` and labels in the caller's convention).
    _kernel: the numba kernel behind :func:`pack_lengths`.
"""

from __future__ import annotations

from seqpack.packing.dataset import PACKED_KEYS, PackedRows, pack_dataset
from seqpack.packing.packer import Packing, pack_lengths, token_lower_bound

__all__ = ["PACKED_KEYS", "PackedRows", "Packing", "pack_dataset", "pack_lengths", "token_lower_bound"]
