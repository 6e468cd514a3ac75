"""What a :class:`~seqpack.cost.CostModel`'s microbatch costs on a CP group of ``c`` ranks:
its compute split over the group, plus the context-parallel ring.

A group of ``c`` ranks running a pack of padded lengths ``s_i`` (``S = sum s_i``,
``SS = sum s_i**2``) takes, on each of its ranks::

    constant + compute(S, SS) * reference_size / c                     compute, split c ways
             + (c - 1) * (ring_step + ring_token(spans) * S / c)      CP ring (c > 1 only)

``compute(S, SS)`` is the model's compute terms (``linear``, ``quadratic``): a microbatch's
cost on a group of ``reference_size`` ranks (1: one rank alone, as the priors of
:meth:`~seqpack.cost.CostModel.from_model` and fitted group costs say). A model without a
``reference_size`` (the default) is the cost of a microbatch on the plan's static CP group
(``cp_size`` ranks: what calibration measures and ``balanced`` balances), and its ring
terms are zero by default, so on static plans every figure is the model's own.
DualChunkSwap gives each rank ``1/c`` of the tokens and of the causal attention work.

The ring part follows Transformer Engine's ``p2p`` CP (``AttnFuncWithCPAndKVP2P``): per
attention layer the forward pass sends the local K/V chunk ``c - 1`` times around the ring
and the backward pass sends K/V and dK/dV ``c - 1`` times each, so ``3 (c - 1)`` transfers of
``S/c`` tokens x ``2 * kv_heads * head_dim * dtype_bytes`` bytes per layer and step, plus a
fixed cost per ring step (launch and handshake). ``ring_token`` is seconds per token per ring
step over all attention layers, forward and backward; ``ring_token_inter`` replaces it when
the group spans nodes (its ring then crosses the inter-node link). TE overlaps each transfer
with the previous step's attention, so these terms are the *exposed* communication: a
calibrator fits them from measured times.

Features, for a calibrator (linear in the coefficients, so NNLS fits them like the
``(1, S, SS)`` of :meth:`CostModel.fit`): :data:`FEATURES` names them and
:func:`group_features` computes them per microbatch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEATURES", "TE_P2P_TRANSFERS", "group_features", "spans_nodes"]

FEATURES: tuple[str, ...] = ("constant", "linear", "quadratic", "ring_step", "ring_token", "ring_token_inter")
"""Coefficient names of :func:`group_features`' columns: ``1``, ``S/c``, ``SS/c``, ``c-1``,
``(c-1) S/c`` (within a node) and ``(c-1) S/c`` (spanning nodes)."""

# Transformer Engine's p2p ring, per attention layer and training step: forward sends K/V
# c-1 times; backward sends K/V c-1 times and dK/dV c-1 times.
TE_P2P_TRANSFERS = 3


def spans_nodes(start: np.ndarray | int, size: np.ndarray | int, ranks_per_node: int) -> np.ndarray:
    """Whether the block ``[start, start + size)`` holds ranks of more than one node."""
    start_arr = np.asarray(start, dtype=np.int64)
    return start_arr // ranks_per_node != (start_arr + np.asarray(size, dtype=np.int64) - 1) // ranks_per_node


def group_features(
    sizes: np.ndarray, seqlen_sum: np.ndarray, seqlen_sq_sum: np.ndarray, spans: np.ndarray
) -> np.ndarray:
    """float64 ``[n, 6]``: each microbatch's features in :data:`FEATURES` order (padded
    ``S``, ``SS`` of the pack; its group's size; whether the group spans nodes)."""
    c = np.asarray(sizes, dtype=np.float64)
    s = np.asarray(seqlen_sum, dtype=np.float64)
    ring = np.maximum(c - 1.0, 0.0)
    spans_arr = np.asarray(spans, dtype=bool)
    per_rank = ring * s / c
    return np.stack(
        [
            np.ones_like(c),
            s / c,
            np.asarray(seqlen_sq_sum, dtype=np.float64) / c,
            ring,
            np.where(spans_arr, 0.0, per_rank),
            np.where(spans_arr, per_rank, 0.0),
        ],
        axis=1,
    )
