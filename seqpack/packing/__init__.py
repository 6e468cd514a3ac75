"""Offline packing: sequences into as few packs of ``max_tokens`` tokens as found, on one rank.

Modules:
    packer: :func:`pack_lengths` (lengths to a :class:`Packing`), the token lower bound.
    dataset: :func:`pack_dataset` (rows or a ``datasets.Dataset`` to packed rows with
        ``position_ids``, ``cu_seqlens`` and labels in the caller's convention).
    rows: the rows (or a ``datasets.Dataset``'s Arrow columns) read into sequences.
    _kernel: the numba kernel behind :func:`pack_lengths`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack._lazy import lazy_exports

if TYPE_CHECKING:
    from seqpack.packing.dataset import PACKED_KEYS, PackedRows, pack_dataset
    from seqpack.packing.packer import Packing, pack_lengths, token_lower_bound

# Each name is imported from its module on first use (seqpack._lazy.lazy_exports).
_HOMES = {
    "PACKED_KEYS": "seqpack.packing.dataset",
    "PackedRows": "seqpack.packing.dataset",
    "pack_dataset": "seqpack.packing.dataset",
    "Packing": "seqpack.packing.packer",
    "pack_lengths": "seqpack.packing.packer",
    "token_lower_bound": "seqpack.packing.packer",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = ["PACKED_KEYS", "PackedRows", "Packing", "pack_dataset", "pack_lengths", "token_lower_bound"]
