"""What a CP group's microbatch costs, and the step time of a dynamic-CP plan.

A group of ``c`` ranks running a pack of padded lengths ``s_i`` (``S = sum s_i``,
``SS = sum s_i**2``) takes, on each of its ranks::

    constant + (linear*S + quadratic*SS) / c                         compute, split c ways
             + (c - 1) * (ring_step + ring_token(spans) * S / c)      CP ring (c > 1 only)

The compute part is a :class:`~seqpack.cost.CostModel` (DualChunkSwap gives each rank ``1/c``
of the tokens and of the causal attention work). The ring part follows Transformer Engine's
``p2p`` CP (``AttnFuncWithCPAndKVP2P``): per attention layer the forward pass sends the local
K/V chunk ``c - 1`` times around the ring and the backward pass sends K/V and dK/dV ``c - 1``
times each, so ``3 (c - 1)`` transfers of ``S/c`` tokens x ``2 * kv_heads * head_dim *
dtype_bytes`` bytes per layer and step, plus a fixed cost per ring step (launch and
handshake). ``ring_token`` is seconds per token per ring step over all attention layers,
forward and backward; ``ring_token_inter`` replaces it when the group spans nodes (its ring
then crosses the inter-node link). TE overlaps each transfer with the previous step's
attention, so these terms are the *exposed* communication: a calibrator fits them from
measured times.

Features, for a calibrator (linear in the coefficients, so NNLS fits them like the
``(1, S, SS)`` of :meth:`CostModel.fit`): :data:`FEATURES` names them and
:meth:`GroupCost.features` computes them per microbatch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import SeqpackTypeError
from seqpack.options import Sync
from seqpack.schedulers.dynamic_cp.padding import group_padded_lengths
from seqpack.schedulers.dynamic_cp.plan import DynamicCpSchedule
from seqpack.validation import check_choice, check_number, check_positive_int

__all__ = ["FEATURES", "GroupCost", "group_sums", "group_times", "predicted_step_time", "replica_sums", "spans_nodes"]

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
        compute: The microbatch's cost on one rank (``constant + linear*S + quadratic*SS``).
        ring_step: Cost per ring step of a microbatch (all attention layers, forward and
            backward), multiplied by ``c - 1``.
        ring_token: Cost per token per ring step within a node, multiplied by ``(c-1) S/c``.
        ring_token_inter: The same for a group spanning nodes (``None``: ``ring_token``).
        ranks_per_node: DP x CP ranks on one node (8 GPUs per node / TP size).
    """

    compute: CostModel
    ring_step: float = 0.0
    ring_token: float = 0.0
    ring_token_inter: float | None = None
    ranks_per_node: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.compute, CostModel):
            raise SeqpackTypeError(f"GroupCost.compute must be a seqpack CostModel, got {type(self.compute).__name__}")
        for name in ("ring_step", "ring_token"):
            object.__setattr__(self, name, check_number(f"GroupCost.{name}", getattr(self, name), minimum=0.0))
        inter = self.ring_token if self.ring_token_inter is None else self.ring_token_inter
        object.__setattr__(self, "ring_token_inter", check_number("GroupCost.ring_token_inter", inter, minimum=0.0))
        object.__setattr__(self, "ranks_per_node", check_positive_int("ranks_per_node", self.ranks_per_node))

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

    # -- coefficients ----------------------------------------------------------------------
    @property
    def coefficients(self) -> np.ndarray:
        """float64 ``[6]`` in :data:`FEATURES` order."""
        c = self.compute
        values = (c.constant, c.linear, c.quadratic, self.ring_step, self.ring_token, self.ring_token_inter)
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
        if c == 1:
            return self.compute
        spans = c > self.ranks_per_node if spans is None else spans
        token = float(self.ring_token_inter if spans else self.ring_token)  # type: ignore[arg-type]
        m = self.compute
        return CostModel(
            linear=(m.linear + (c - 1) * token) / c,
            quadratic=m.quadratic / c,
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

    def sequence_time(self, lengths: np.ndarray, group_size: int, pad_multiple: int) -> np.ndarray:
        """Cost of each sequence alone in an aligned group of ``group_size`` ranks."""
        padded = group_padded_lengths(lengths, group_size, pad_multiple).astype(np.float64)
        n = padded.shape[0]
        sizes = np.full(n, group_size)
        spans = np.full(n, group_size > self.ranks_per_node)
        return self.time(sizes, padded, padded * padded, spans)


def group_times(plan: DynamicCpSchedule, cost: GroupCost) -> np.ndarray:
    """float64 ``[G]``: each group's microbatch cost on its block (idle groups included, as
    if they ran an empty pack)."""
    group_of = np.repeat(np.arange(plan.num_groups, dtype=np.int64), plan.group_counts)
    padded = group_padded_lengths(plan.lengths[plan.assigned], plan.group_size[group_of], plan.pad_multiple)
    padded = padded.astype(np.float64)
    s = np.bincount(group_of, weights=padded, minlength=plan.num_groups)
    ss = np.bincount(group_of, weights=padded * padded, minlength=plan.num_groups)
    spans = spans_nodes(plan.group_start, plan.group_size, cost.ranks_per_node)
    return cost.time(plan.group_size, s, ss, spans)


def predicted_step_time(plan: DynamicCpSchedule, cost: GroupCost, *, sync: str = "lockstep") -> float:
    """The step time ``cost`` predicts for ``plan``.

    Args:
        plan: A dynamic-CP plan.
        cost: The group cost model.
        sync: ``"lockstep"`` (FSDP: every round waits for its slowest group; an idle group
            runs a padding-only filler costing ``constant``): ``sum_m max_g time[g]``.
            ``"replica"`` (DDP: no barrier between rounds): the last rank's finish time,
            where a group starts once all its ranks have finished their previous round and
            an idle group costs nothing. With groups that never change across rounds this
            is the slowest rank's total.

    Raises:
        SeqpackTypeError: ``plan`` or ``cost`` of the wrong type.
        ConfigError: Unknown ``sync``.
    """
    if not isinstance(plan, DynamicCpSchedule):
        raise SeqpackTypeError(f"plan must be a DynamicCpSchedule, got {type(plan).__name__}")
    if not isinstance(cost, GroupCost):
        raise SeqpackTypeError(f"cost must be a GroupCost, got {type(cost).__name__}")
    mode = check_choice("sync", sync, Sync)
    if plan.num_groups == 0:
        return 0.0
    busy = plan.group_counts > 0
    times = group_times(plan, cost)
    if mode == Sync.LOCKSTEP:
        times = np.where(busy, times, cost.compute.constant)
        heights = np.full(plan.num_rounds, -np.inf)
        np.maximum.at(heights, plan.group_round, times)
        return float(heights.sum())
    times = np.where(busy, times, 0.0)
    finish = np.zeros(plan.num_ranks, dtype=np.float64)
    for m in range(plan.num_rounds):
        groups = plan.round_groups(m)
        starts = plan.group_start[groups.start : groups.stop]
        ready = np.maximum.reduceat(finish, starts)
        finish = np.repeat(ready + times[groups.start : groups.stop], plan.group_size[groups.start : groups.stop])
    return float(finish.max())


def group_sums(plan: DynamicCpSchedule, ranks_per_node: int) -> np.ndarray:
    """int64 ``[G, 4]``: the ``(size, S, SS, spans)`` of every group of ``plan`` (padded
    lengths; an idle group runs a ``pad_multiple`` filler alone: size 1)."""
    group_of = np.repeat(np.arange(plan.num_groups, dtype=np.int64), plan.group_counts)
    padded = group_padded_lengths(plan.lengths[plan.assigned], plan.group_size[group_of], plan.pad_multiple)
    padded = padded.astype(np.int64)
    s = np.bincount(group_of, weights=padded, minlength=plan.num_groups).astype(np.int64)
    ss = np.zeros(plan.num_groups, dtype=np.int64)
    np.add.at(ss, group_of, padded * padded)
    spans = spans_nodes(plan.group_start, plan.group_size, ranks_per_node).astype(np.int64)
    pad = plan.pad_multiple
    busy = plan.group_counts > 0
    return np.stack(
        [
            np.where(busy, plan.group_size, 1),
            np.where(busy, s, pad),
            np.where(busy, ss, pad * pad),
            np.where(busy, spans, 0),
        ],
        axis=1,
    )  # [G, 4]


def replica_sums(plan: DynamicCpSchedule, cost: GroupCost) -> np.ndarray:
    """int64 ``[num_rounds, dp_size, 4]``: per round and DP replica (plane ranks
    ``d*cp .. d*cp+cp-1``), the ``(size, S, SS, spans)`` (:func:`group_sums`) of the group
    among its ranks' that ``cost`` predicts slowest: what the replica's measured time (the
    slowest of its CP ranks) times.
    """
    rows = group_sums(plan, cost.ranks_per_node)
    times = cost.predict_sums(rows)
    per_rank = plan.rank_group().reshape(plan.num_rounds, plan.dp_size, plan.cp_size)  # group of every rank
    slowest = np.take_along_axis(per_rank, np.argmax(times[per_rank], axis=2)[..., None], axis=2)[..., 0]
    return rows[slowest]
