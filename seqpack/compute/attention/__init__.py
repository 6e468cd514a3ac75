"""THD attention: masked attention inside each packed sequence, pads never attended.

The mask is causal (default), bidirectional (``causal=False``) or a sliding window
(``window=(left, right)``, Transformer Engine's convention, -1 = unbounded). Two backends with
the same semantics:

- ``"torch"``: an exact reference that runs anywhere (CPU, float64), query block by query
  block against only the keys each block reaches, so memory is bounded by blocks, never
  ``T x T``. Under context parallelism (either CP layout) each rank receives just the K/V rows
  its queries reach, in one all-to-all whose backward returns the key gradients to their owners.
- ``"te"``: Transformer Engine ``DotProductAttention`` in THD (``attn_mask_type``
  ``"padding_causal"`` / ``"padding"``, ``window_size``) with ``pad_between_seqs`` stated
  explicitly (TE issue #3331) and TE's own CP; TE's rules are checked when the module is built.

``"auto"`` uses TE for fp16/bf16 CUDA inputs when TE imports, the torch reference otherwise;
it never falls back silently (:mod:`seqpack.compute.backends` says when it warns).
Pad queries output exactly 0 on both backends.

Modules:
    masks: :class:`AttentionMask` (``(left, right)``), :func:`attention_mask`, key reach and
        block masks.
    reference: :func:`thd_attention` (functional torch reference) and its blockwise core.
    kv_exchange: the CP K/V exchange (:func:`plan_kv_exchange`, :func:`exchange_kv`) and
        :func:`kv_exchange_traffic` (bytes moved against an all-gather).
    te: TE's mask arguments and rules (:func:`check_te_rules`).
    module: :class:`ThdAttention`, :func:`select_backend`.
"""

from __future__ import annotations

from seqpack.compute.attention.kv_exchange import KvTraffic, kv_exchange_traffic, plan_kv_exchange
from seqpack.compute.attention.masks import AttentionMask, attention_mask
from seqpack.compute.attention.module import BACKENDS, CP_COMM_TYPES, ThdAttention, select_backend
from seqpack.compute.attention.reference import MAX_SCORE_BLOCK, thd_attention
from seqpack.compute.attention.te import check_te_rules

__all__ = [
    "BACKENDS",
    "CP_COMM_TYPES",
    "MAX_SCORE_BLOCK",
    "AttentionMask",
    "KvTraffic",
    "ThdAttention",
    "attention_mask",
    "check_te_rules",
    "kv_exchange_traffic",
    "plan_kv_exchange",
    "select_backend",
    "thd_attention",
]
