"""Compute stages that consume seqpack's packed batches.

- :mod:`~seqpack.compute.attention`: :class:`ThdAttention`, causal, bidirectional or
  sliding-window attention inside each packed sequence (Transformer Engine on CUDA, an exact
  torch reference anywhere), with context parallelism in either CP layout.
- :mod:`~seqpack.compute.mamba`: :class:`Mamba2Mixer`, a Mamba2 mixer whose state restarts at
  every packed sequence, with hidden-parallel context parallelism (either CP layout).
- :mod:`~seqpack.compute.backends`: which fast path runs and why (import probes, no silent
  fallback, :func:`environment_report` behind ``seqpack doctor``).
- :mod:`~seqpack.compute.tiny_lm`: a tiny attention + Mamba2 LM on THD batches.
"""

from __future__ import annotations

from seqpack.compute.attention import ThdAttention, thd_attention
from seqpack.compute.backends import BackendUnavailableError, environment_report, format_environment_report
from seqpack.compute.mamba import Mamba2Mixer, causal_conv1d, seq_idx_from_cu_seqlens, ssd_scan

__all__ = [
    "BackendUnavailableError",
    "Mamba2Mixer",
    "ThdAttention",
    "causal_conv1d",
    "environment_report",
    "format_environment_report",
    "seq_idx_from_cu_seqlens",
    "ssd_scan",
    "thd_attention",
]
