"""Compute stages that consume seqpack's packed batches.

- :class:`~seqpack.compute.attention.ThdAttention`: causal attention inside each packed
  sequence (Transformer Engine on CUDA, an exact torch reference anywhere), with context
  parallelism.
- :class:`~seqpack.compute.mamba.Mamba2Mixer`: a Mamba2 mixer whose state restarts at every
  packed sequence, with hidden-parallel context parallelism.
"""

from __future__ import annotations

from seqpack.compute.attention import ThdAttention, thd_attention
from seqpack.compute.mamba import Mamba2Mixer, causal_conv1d, seq_idx_from_cu_seqlens, ssd_scan

__all__ = [
    "Mamba2Mixer",
    "ThdAttention",
    "causal_conv1d",
    "seq_idx_from_cu_seqlens",
    "ssd_scan",
    "thd_attention",
]
