"""The one cost family of a plan: :class:`GroupCost`, what a microbatch costs on a group of
``c`` ranks (its compute split over the group, plus the context-parallel ring).

A group of ``c`` ranks running a pack of padded lengths ``s_i`` (``S = sum s_i``,
``SS = sum s_i**2``) takes, on each of its ranks::

    constant + compute(S, SS) * reference_size / c                     compute, split c ways
             + (c - 1) * (ring_step + ring_token(spans) * S / c)      CP ring (c > 1 only)

``compute`` is a :class:`~seqpack.cost.CostModel`: a microbatch's cost on a group of
``reference_size`` ranks (1: one rank alone). A plain ``CostModel`` given for a plan is the
cost of a microbatch on the plan's static CP group (``cp_size`` ranks: what calibration
measures and ``balanced`` balances): :meth:`GroupCost.from_static` makes it the member of
the family with no ring term, so on static plans every figure is the CostModel's own.
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
:meth:`GroupCost.features` computes them per microbatch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.cost.interconnect import DEFAULT_INTERCONNECT, Interconnect, get_interconnect
from seqpack.cost.model import CostModel, ModelSpec
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_number, check_positive_int

__all__ = ["FEATURES", "TE_P2P_TRANSFERS", "GroupCost", "as_group_cost", "spans_nodes"]

FEATURES: tuple[str, ...] = ("constant", "linear", "quadratic", "ring_step", "ring_token", "ring_token_inter")
"""Coefficient names of :meth:`GroupCost.features`' columns: ``1``, ``S/c``, ``SS/c``,
``c-1``, ``(c-1) S/c`` (within a node) and ``(c-1) S/c`` (spanning nodes)."""

# Transformer Engine's p2p ring, per attention layer and training step: forward sends K/V
# c-1 times; backward sends K/V c-1 times and dK/dV c-1 times.
TE_P2P_TRANSFERS = 3


def spans_nodes(start: np.ndarray | int, size: np.ndarray | int, ranks_per_node: int) -> np.ndarray:
    """Whether the block ``[start, start + size)`` holds ranks of more than one node."""
    start_arr = np.asarray(start, dtype=np.int64)
    return start_arr // ranks_per_node != (start_arr + np.asarray(size, dtype=np.int64) - 1) // ranks_per_node


@dataclasses.dataclass(frozen=True)
class GroupCost:
    """Seconds (or any unit) of one CP group's microbatch: compute split over the group plus
    the CP ring (module docstring).

    Attributes:
        compute: The microbatch's cost on a group of ``reference_size`` ranks (``constant +
            linear*S + quadratic*SS``, and a windowed term if it has one).
        ring_step: Cost per ring step of a microbatch (all attention layers, forward and
            backward), multiplied by ``c - 1``.
        ring_token: Cost per token per ring step within a node, multiplied by ``(c-1) S/c``.
        ring_token_inter: The same for a group spanning nodes (``None``: ``ring_token``).
        ranks_per_node: DP x CP ranks on one node (8 GPUs per node / TP size).
        reference_size: The group size ``compute`` was given for: 1 (one rank alone), or a
            static plan's ``cp_size`` (:meth:`from_static`).
    """

    compute: CostModel
    ring_step: float = 0.0
    ring_token: float = 0.0
    ring_token_inter: float | None = None
    ranks_per_node: int = 8
    reference_size: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.compute, CostModel):
            raise SeqpackTypeError(f"GroupCost.compute must be a seqpack CostModel, got {type(self.compute).__name__}")
        for name in ("ring_step", "ring_token"):
            object.__setattr__(self, name, check_number(f"GroupCost.{name}", getattr(self, name), minimum=0.0))
        inter = self.ring_token if self.ring_token_inter is None else self.ring_token_inter
        object.__setattr__(self, "ring_token_inter", check_number("GroupCost.ring_token_inter", inter, minimum=0.0))
        object.__setattr__(self, "ranks_per_node", check_positive_int("ranks_per_node", self.ranks_per_node))
        object.__setattr__(self, "reference_size", check_positive_int("reference_size", self.reference_size))

    @classmethod
    def from_static(cls, cost: CostModel, cp_size: int) -> GroupCost:
        """The member of the family whose microbatches on a group of ``cp_size`` ranks cost
        ``cost`` (a static plan's cost model: no ring term; smaller groups run the same work
        on fewer ranks, larger ones on more)."""
        if not isinstance(cost, CostModel):
            raise SeqpackTypeError(f"cost must be a seqpack CostModel, got {type(cost).__name__}")
        return cls(cost, reference_size=cp_size)

    @property
    def has_ring(self) -> bool:
        """Whether any ring coefficient is positive (else every CP group looks free)."""
        return bool(self.ring_step > 0 or self.ring_token > 0 or (self.ring_token_inter or 0.0) > 0)

    def compute_scale(self, group_size: np.ndarray | int) -> np.ndarray:
        """float64: what ``compute`` is multiplied by on a group of each size
        (``reference_size / c``; exactly 1 at the reference size)."""
        c = np.asarray(group_size, dtype=np.float64)
        return np.where(c == self.reference_size, 1.0, self.reference_size / c)

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
    ) -> GroupCost:
        """The ring coefficients of Transformer Engine's ``p2p`` CP, from the model's shape
        and the links (seconds when ``compute`` is in seconds).

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
        kv_bytes = (
            2
            * check_positive_int("num_query_groups", num_query_groups)
            * check_positive_int("head_dim", head_dim)
            * check_positive_int("dtype_bytes", dtype_bytes)
        )
        transfers = TE_P2P_TRANSFERS * check_positive_int("attention_layers", attention_layers)
        intra = check_number("intra_node_bandwidth", intra_node_bandwidth, minimum=0.0, allow_zero=False)
        inter = check_number("inter_node_bandwidth", inter_node_bandwidth, minimum=0.0, allow_zero=False)
        return cls(
            compute,
            ring_step=transfers * check_number("step_latency", step_latency, minimum=0.0),
            ring_token=transfers * kv_bytes / intra,
            ring_token_inter=transfers * kv_bytes / inter,
            ranks_per_node=ranks_per_node,
        )

    @classmethod
    def from_model(
        cls, spec: ModelSpec, interconnect: str | Interconnect = DEFAULT_INTERCONNECT, *, dtype_bytes: int = 2
    ) -> GroupCost:
        """A prior in training FLOPs: ``spec``'s FLOPs cost model plus Transformer Engine's
        ``p2p`` ring (:meth:`from_te_p2p`) over a named interconnect, its seconds expressed in
        FLOPs at the interconnect's ``device_flops`` (:mod:`seqpack.cost.interconnect`).
        Calibration (``calibrate=True``) refits every coefficient to measured times.

        Raises:
            ConfigError: ``spec`` has no attention layer (Mamba's CP exchange is not a
                ring: give its figures as ``GroupCost``), or an unknown interconnect.
        """
        if not isinstance(spec, ModelSpec):
            raise SeqpackTypeError(f"spec must be a seqpack.cost.ModelSpec, got {type(spec).__name__}")
        links = get_interconnect(interconnect)
        attention_layers = spec.layer_counts[0]
        if attention_layers == 0:
            raise ConfigError(
                f"model {spec.name or spec!r} has no attention layer, so its CP communication is not a ring: "
                "pass group_cost=seqpack.cost.GroupCost(...) with its figures"
            )
        heads = spec.num_query_groups or spec.num_attention_heads
        head_dim = spec.kv_channels or spec.hidden_size // spec.num_attention_heads
        seconds = cls.from_te_p2p(
            CostModel(1.0, 0.0),
            attention_layers=attention_layers,
            num_query_groups=heads,
            head_dim=head_dim,
            intra_node_bandwidth=links.intra_node_bandwidth,
            inter_node_bandwidth=links.inter_node_bandwidth,
            step_latency=links.step_latency,
            dtype_bytes=dtype_bytes,
            ranks_per_node=links.ranks_per_node,
        )
        return dataclasses.replace(seconds, compute=spec.cost_model()).scaled_ring(links.device_flops)

    # -- coefficients ----------------------------------------------------------------------
    @property
    def coefficients(self) -> np.ndarray:
        """float64 ``[6]`` in :data:`FEATURES` order, the compute on one rank (``linear`` and
        ``quadratic`` times ``reference_size``); a windowed term is not among them."""
        c, r = self.compute, self.reference_size
        values = (c.constant, c.linear * r, c.quadratic * r, self.ring_step, self.ring_token, self.ring_token_inter)
        return np.array(values, dtype=np.float64)

    @classmethod
    def from_coefficients(cls, coefficients: np.ndarray, ranks_per_node: int = 8) -> GroupCost:
        """The model whose :attr:`coefficients` are ``coefficients`` (e.g. a fit of
        :meth:`features` against measured seconds)."""
        k, a, b, step, token, inter = (float(v) for v in np.asarray(coefficients, dtype=np.float64))
        return cls(CostModel(a, b, k), step, token, inter, ranks_per_node)

    def scaled_ring(self, factor: float) -> GroupCost:
        """The same model with every ring coefficient times ``factor`` (sensitivity runs)."""
        factor = check_number("factor", factor, minimum=0.0)
        return dataclasses.replace(
            self,
            ring_step=self.ring_step * factor,
            ring_token=self.ring_token * factor,
            ring_token_inter=float(self.ring_token_inter or 0.0) * factor,
        )

    def at(self, group_size: int, *, spans: bool | None = None) -> CostModel:
        """The :class:`CostModel` of every microbatch of a fixed CP size (static CP): what
        ``balanced`` balances when each replica is a group of ``group_size`` ranks.

        ``spans`` defaults to ``group_size > ranks_per_node`` (aligned blocks).
        """
        c = check_positive_int("group_size", group_size)
        if c == self.reference_size and (c == 1 or not self.has_ring):
            return self.compute
        spans = c > self.ranks_per_node if spans is None else spans
        token = float(self.ring_token_inter if spans else self.ring_token)  # type: ignore[arg-type]
        m, r = self.compute, self.reference_size
        return CostModel(
            linear=(m.linear * r + (c - 1) * token) / c,
            quadratic=m.quadratic * r / c,
            constant=m.constant + (c - 1) * self.ring_step,
        )

    # -- evaluation ------------------------------------------------------------------------
    def features(
        self, sizes: np.ndarray, seqlen_sum: np.ndarray, seqlen_sq_sum: np.ndarray, spans: np.ndarray
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

    def time(
        self, sizes: np.ndarray, seqlen_sum: np.ndarray, seqlen_sq_sum: np.ndarray, spans: np.ndarray
    ) -> np.ndarray:
        """float64 ``[n]``: the cost of each microbatch (``features @ coefficients``)."""
        return self.features(sizes, seqlen_sum, seqlen_sq_sum, spans) @ self.coefficients

    def predict_sums(self, sums: np.ndarray) -> np.ndarray:
        """float64 ``[...]``: the cost of microbatches given as ``(size, S, SS, spans)``
        integers in the last axis (:func:`replica_sums`, what a calibrator keeps)."""
        a = np.asarray(sums, dtype=np.int64)
        flat = a.reshape(-1, 4)
        return self.time(flat[:, 0], flat[:, 1], flat[:, 2], flat[:, 3] != 0).reshape(a.shape[:-1])

    def ring(self, group_size: np.ndarray, seqlen_sum: np.ndarray, spans: np.ndarray) -> np.ndarray:
        """float64: the CP ring's cost of microbatches on groups of ``group_size`` ranks
        holding ``seqlen_sum`` padded tokens (0 alone)."""
        c = np.asarray(group_size, dtype=np.float64)
        ring = np.maximum(c - 1.0, 0.0)
        token = np.where(np.asarray(spans, dtype=bool), float(self.ring_token_inter or 0.0), self.ring_token)
        return ring * self.ring_step + token * (ring * np.asarray(seqlen_sum, dtype=np.float64) / c)


def as_group_cost(cost: GroupCost | CostModel, cp_size: int) -> GroupCost:
    """``cost`` as a member of the family: a :class:`GroupCost` as it is, a
    :class:`CostModel` as the cost of a microbatch on a static group of ``cp_size`` ranks
    (:meth:`GroupCost.from_static`).

    Raises:
        SeqpackTypeError: Neither.
    """
    if isinstance(cost, GroupCost):
        return cost
    if isinstance(cost, CostModel):
        return GroupCost.from_static(cost, cp_size)
    raise SeqpackTypeError(f"cost must be a seqpack CostModel or GroupCost, got {type(cost).__name__}")
