"""Adapters to other frameworks: Hugging Face transformers (``hf``: :func:`to_hf` and the
Trainer mixin), torchtitan 0.3, NeMo Automodel (``nemo``: its THD conversions, contract
kept), verl 0.9.1 (``verl``: its balancing drop-ins) and Megatron-LM (``megatron``: a packing
scheduler; importing it needs Megatron-LM). docs/integrations.md says which to call.
"""

from __future__ import annotations

from seqpack.interop.hf import to_hf
from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks

__all__ = ["process_input_for_thd", "split_batch_into_thd_chunks", "to_hf"]
