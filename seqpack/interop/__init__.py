"""Adapters to other frameworks' batch formats.

Modules:
    nemo: NeMo Automodel's BSHD packed batches to THD (:func:`process_input_for_thd`,
        :func:`split_batch_into_thd_chunks`), its contract kept.
"""

from __future__ import annotations

from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks

__all__ = ["process_input_for_thd", "split_batch_into_thd_chunks"]
