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

import dataclasses
from typing import TYPE_CHECKING, Self

import numpy as np

from seqpack.cost.fit import predict
from seqpack.errors import SeqpackTypeError
from seqpack.validation import check_number, check_positive_int

if TYPE_CHECKING:
    from seqpack.cost.model import CostModel

__all__ = ["FEATURES", "TE_P2P_TRANSFERS", "GroupTerms", "group_features", "spans_nodes"]

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


class GroupTerms:
    """The CP-group half of :class:`~seqpack.cost.CostModel` (its base, here for the module's
    size; CostModel declares and checks the fields): what its microbatch costs on a group of
    ``c`` ranks (module docstring)."""

    linear: float
    quadratic: float
    constant: float
    windowed: float
    window: int | None
    ring_step: float
    ring_token: float
    ring_token_inter: float | None
    ranks_per_node: int
    reference_size: int | None

    @property
    def has_ring(self) -> bool:
        """Whether any ring coefficient is positive (else every CP group looks free)."""
        return bool(self.ring_step > 0 or self.ring_token > 0 or (self.ring_token_inter or 0.0) > 0)

    def _reference(self, cp_size: int) -> int:
        return cp_size if self.reference_size is None else self.reference_size

    def compute_scale(self, group_size: np.ndarray | int, cp_size: int) -> np.ndarray:
        """float64 ``reference_size / c`` (``cp_size`` for a model without one): what the
        compute terms are multiplied by on a group of each size, exactly 1 at the reference."""
        r = self._reference(cp_size)
        c = np.asarray(group_size, dtype=np.float64)
        return np.where(c == r, 1.0, r / c)

    def group_coefficients(self, cp_size: int) -> np.ndarray:
        """float64 ``[6]`` in :data:`~seqpack.cost.ring.FEATURES` order: the compute on one
        rank and the ring (a windowed term is not among them)."""
        r = self._reference(cp_size)
        ring = (self.ring_step, self.ring_token, self.ring_token_inter)
        return np.array((self.constant, self.linear * r, self.quadratic * r, *ring), dtype=np.float64)

    @classmethod
    def from_group_coefficients(cls, coefficients: np.ndarray, ranks_per_node: int = 8) -> Self:
        """The model (compute on one rank) whose :meth:`group_coefficients` are ``coefficients``."""
        k, a, b, step, token, inter = (float(v) for v in np.asarray(coefficients, dtype=np.float64))
        per_rank = cls(a, b, k, ring_step=step, ring_token=token, ring_token_inter=inter, reference_size=1)  # type: ignore[call-arg]
        return dataclasses.replace(per_rank, ranks_per_node=ranks_per_node)  # type: ignore[type-var]

    @classmethod
    def from_te_p2p(
        cls,
        compute: CostModel,
        *,
        attention_layers: int,
        num_query_groups: int,
        head_dim: int,
        intra_node_bandwidth: float,
        inter_node_bandwidth: float,
        step_latency: float,
        dtype_bytes: int = 2,
        ranks_per_node: int = 8,
    ) -> CostModel:
        """``compute`` with the ring coefficients of Transformer Engine's ``p2p`` CP, from the
        model's shape and the links.

        Args:
            compute: Seconds of a microbatch on one rank.
            attention_layers: Attention layers of the model (of this pipeline stage).
            num_query_groups, head_dim: K/V heads and their width.
            intra_node_bandwidth, inter_node_bandwidth: Bytes per second one rank sends to
                its ring neighbour within a node and across nodes.
            step_latency: Seconds of fixed cost per ring transfer (launch, handshake).
            dtype_bytes: Bytes per K/V element (2 for bf16).
            ranks_per_node: DP x CP ranks per node.
        """
        if not isinstance(compute, cls):
            raise SeqpackTypeError(f"compute must be a seqpack CostModel, got {type(compute).__name__}")
        kv_bytes = (
            2
            * check_positive_int("num_query_groups", num_query_groups)
            * check_positive_int("head_dim", head_dim)
            * check_positive_int("dtype_bytes", dtype_bytes)
        )
        transfers = TE_P2P_TRANSFERS * check_positive_int("attention_layers", attention_layers)
        intra = check_number("intra_node_bandwidth", intra_node_bandwidth, minimum=0.0, allow_zero=False)
        inter = check_number("inter_node_bandwidth", inter_node_bandwidth, minimum=0.0, allow_zero=False)
        return dataclasses.replace(
            compute,
            ring_step=transfers * check_number("step_latency", step_latency, minimum=0.0),
            ring_token=transfers * kv_bytes / intra,
            ring_token_inter=transfers * kv_bytes / inter,
            ranks_per_node=ranks_per_node,
            reference_size=1,
        )

    def scaled_ring(self, factor: float) -> Self:
        """The same model with every ring coefficient times ``factor`` (sensitivity runs)."""
        factor = check_number("factor", factor, minimum=0.0)
        inter = float(self.ring_token_inter or 0.0) * factor
        ring = {"ring_step": self.ring_step * factor, "ring_token": self.ring_token * factor, "ring_token_inter": inter}
        return dataclasses.replace(self, **ring)  # type: ignore[type-var]

    def at(self, group_size: int, *, spans: bool | None = None) -> Self:
        """The ring-free model of every microbatch on a CP group of ``group_size`` ranks
        (static CP). ``spans`` defaults to ``group_size > ranks_per_node`` (aligned blocks)."""
        c = check_positive_int("group_size", group_size)
        r = self._reference(c)
        if c == r and (c == 1 or not self.has_ring):
            return type(self)(self.linear, self.quadratic, self.constant, self.windowed, self.window)  # type: ignore[call-arg]
        spans = c > self.ranks_per_node if spans is None else spans
        token = float(self.ring_token_inter if spans else self.ring_token)  # type: ignore[arg-type]
        return type(self)(  # type: ignore[call-arg]
            linear=(self.linear * r + (c - 1) * token) / c,
            quadratic=self.quadratic * r / c,
            constant=self.constant + (c - 1) * self.ring_step,
            windowed=self.windowed * r / c,
            window=self.window,
        )

    def ring(self, group_size: np.ndarray, seqlen_sum: np.ndarray, spans: np.ndarray) -> np.ndarray:
        """float64: the CP ring's cost of microbatches on groups of ``group_size`` ranks
        holding ``seqlen_sum`` padded tokens (0 alone)."""
        c = np.asarray(group_size, dtype=np.float64)
        ring = np.maximum(c - 1.0, 0.0)
        token = np.where(np.asarray(spans, dtype=bool), float(self.ring_token_inter or 0.0), self.ring_token)
        return ring * self.ring_step + token * (ring * np.asarray(seqlen_sum, dtype=np.float64) / c)

    def predict_group_sums(self, sums: np.ndarray, cp_size: int) -> np.ndarray:
        """float64 ``[...]``: the cost of microbatches given as ``(size, S, SS, spans)``
        integers in the last axis (:func:`~seqpack.schedulers.step_time.group_sums`) on a
        plan of ``cp_size``."""
        a = np.asarray(sums, dtype=np.int64)
        flat = a.reshape(-1, 4)
        features = group_features(flat[:, 0], flat[:, 1], flat[:, 2], flat[:, 3] != 0)
        return predict(features, self.group_coefficients(cp_size)).reshape(a.shape[:-1])
