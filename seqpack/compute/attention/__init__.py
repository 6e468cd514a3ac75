"""THD attention: masked attention inside each packed sequence, pads never attended.

The mask is causal (default), bidirectional (``causal=False``) or a sliding window
(``window=(left, right)``, Transformer Engine's convention, -1 = unbounded). Two backends with
the same semantics, pad queries outputting exactly 0 on both: ``"torch"`` (``reference``, an
exact reference that runs anywhere, with its own CP K/V exchange, ``kv_exchange``) and ``"te"``
(Transformer Engine's ``DotProductAttention`` in THD with TE's own CP; its rules, ``te``, are
checked when the module is built). ``"auto"`` uses TE for fp16/bf16 CUDA inputs when TE
imports, the torch reference otherwise, never silently (:mod:`seqpack.compute.backends`).
``masks`` holds :class:`AttentionMask`; ``module`` :class:`ThdAttention`.
"""

from __future__ import annotations

from seqpack.compute.attention.kv_exchange import plan_kv_exchange
from seqpack.compute.attention.masks import AttentionMask, attention_mask
from seqpack.compute.attention.module import ThdAttention, select_backend
from seqpack.compute.attention.reference import MAX_SCORE_BLOCK, thd_attention
from seqpack.compute.attention.te import check_te_rules

__all__ = [
    "MAX_SCORE_BLOCK",
    "AttentionMask",
    "ThdAttention",
    "attention_mask",
    "check_te_rules",
    "plan_kv_exchange",
    "select_backend",
    "thd_attention",
]
