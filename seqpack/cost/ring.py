"""What a :class:`~seqpack.cost.CostModel`'s microbatch costs on a CP group of ``c`` ranks:
its compute split over the group, plus the context-parallel ring (Transformer Engine's
``p2p`` CP). On each rank of the group, for a pack of padded lengths with sums ``S``, ``SS``::

    constant + compute(S, SS) * reference_size / c                     compute, split c ways
             + (c - 1) * (ring_step + ring_token(spans) * S / c)      CP ring (c > 1 only)

Without a ``reference_size`` (the default) the compute terms are the cost on the plan's
static CP group and the ring terms are zero, so on static plans every figure is the model's
own. The derivation and the calibrator's features: docs/dynamic_cp.md, "The cost of a group".
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEATURES", "TE_P2P_TRANSFERS", "group_features", "spans_nodes"]

FEATURES: tuple[str, ...] = ("constant", "linear", "quadratic", "ring_step", "ring_token", "ring_token_inter")
"""Coefficient names of :func:`group_features`' columns: ``1``, ``S/c``, ``SS/c``, ``c-1``,
``(c-1) S/c`` (within a node) and ``(c-1) S/c`` (spanning nodes)."""

TE_P2P_TRANSFERS = 3  # per attention layer and step: forward K/V, backward K/V and dK/dV, c-1 times each


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
