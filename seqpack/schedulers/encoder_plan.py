"""Encoder rebalancing's plan: which DP rank of a microbatch round encodes each image, and
whether routing them pays. Pure and deterministic, so every rank computes the same plan;
docs/multimodal.md ("Encoder rebalancing") describes the candidates, bound and exchange price."""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import ArrayLike

from seqpack.errors import ConfigError
from seqpack.schedulers.balanced.locality import LINK_BYTES_PER_SECOND

__all__ = [
    "DEFAULT_SECONDS_PER_FLOP",
    "EncoderPlan",
    "NEAR_TIE",
    "plan_encoders",
    "rebalance_pays",
    "round_gain",
    "route_bytes",
]

NEAR_TIE = 0.01
"""A plan within this share of the home plan's heaviest encoder load keeps every image home."""
DEFAULT_SECONDS_PER_FLOP = 1.0 / 400e12
"""The encoder's rate where no calibrated cost gives one (an H100's dense bf16 peak at 40%)."""


@dataclasses.dataclass(frozen=True)
class EncoderPlan:
    """Where each image of a round is encoded.

    Attributes:
        encoder: int64 ``[N]`` the rank that encodes each image.
        home: int64 ``[N]`` the rank whose sequence needs it.
        home_load, load: float64 ``[R]`` each rank's encoder cost at home and under ``encoder``.
        lower_bound: ``max(max cost, total / R)``: no plan's makespan is below it.
    """

    encoder: np.ndarray
    home: np.ndarray
    home_load: np.ndarray
    load: np.ndarray
    lower_bound: float

    @property
    def moved(self) -> np.ndarray:
        """bool ``[N]``: images encoded away from home."""
        return self.encoder != self.home

    @property
    def gain(self) -> float:
        """The round's heaviest encoder load, home plan minus this plan (cost units)."""
        return float(self.home_load.max(initial=0.0) - self.load.max(initial=0.0))


def _lpt(costs: np.ndarray, home: np.ndarray, order: np.ndarray, num_ranks: int) -> np.ndarray:
    """Plain LPT in ``order`` (largest first): each image to the least loaded rank, ties
    home, then the lowest rank."""
    load = np.zeros(num_ranks)
    out = np.empty(costs.size, dtype=np.int64)
    for i in order.tolist():
        least = load.min()
        rank = int(home[i]) if load[home[i]] == least else int(np.argmax(load == least))
        out[i] = rank
        load[rank] += costs[i]
    return out


def _keep_first(costs: np.ndarray, home: np.ndarray, order: np.ndarray, num_ranks: int, cap: float) -> np.ndarray:
    """Each rank keeps its own images in ``order`` while they fit under ``cap``; the others
    go, largest first, to the least loaded rank."""
    load = np.zeros(num_ranks)
    out = np.full(costs.size, -1, dtype=np.int64)
    for i in order.tolist():
        if load[home[i]] + costs[i] <= cap:
            out[i] = home[i]
            load[home[i]] += costs[i]
    for i in order[np.argsort(-costs[order], kind="stable")].tolist():
        if out[i] < 0:
            out[i] = int(np.argmin(load))
            load[out[i]] += costs[i]
    return out


def _loads(costs: np.ndarray, ranks: np.ndarray, num_ranks: int) -> np.ndarray:
    return np.bincount(ranks, weights=costs, minlength=num_ranks).astype(np.float64)


def _send_home(costs: np.ndarray, home: np.ndarray, encoder: np.ndarray, order: np.ndarray, num_ranks: int) -> None:
    """Moved images go back home, largest first, where the makespan stays (in place)."""
    load = _loads(costs, encoder, num_ranks)
    makespan = load.max(initial=0.0)
    for i in order.tolist():
        h = int(home[i])
        if encoder[i] != h and load[h] + costs[i] <= makespan:
            load[encoder[i]] -= costs[i]
            load[h] += costs[i]
            encoder[i] = h


def plan_encoders(costs: ArrayLike, home: ArrayLike, num_ranks: int, *, near_tie: float = NEAR_TIE) -> EncoderPlan:
    """The encoding rank of each image of a round: the best of plain LPT and two keep-first
    schedules (docs/multimodal.md); its makespan is never above plain LPT's nor the home plan's.

    Args:
        costs: float ``[N]`` each image's encoder cost (FLOPs or seconds).
        home: int ``[N]`` the rank whose sequence needs each image.
        near_tie: Keep every image home unless the heaviest load falls by more than this share.

    Raises:
        ConfigError: Costs negative or not finite, a home outside ``[0, num_ranks)``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    home = np.asarray(home, dtype=np.int64)
    if num_ranks < 1:
        raise ConfigError(f"num_ranks must be at least 1, got {num_ranks}")
    if costs.shape != home.shape or costs.ndim != 1:
        raise ConfigError(f"costs {costs.shape} and home {home.shape} must be 1-D of one length")
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise ConfigError(f"encoder costs must be finite and non-negative, got {costs[~(costs >= 0)][:3]}")
    if ((home < 0) | (home >= num_ranks)).any():
        raise ConfigError(f"home ranks must lie in [0, {num_ranks}), got {home[(home < 0) | (home >= num_ranks)][:3]}")
    home_load = _loads(costs, home, num_ranks)
    bound = max(float(costs.max(initial=0.0)), float(costs.sum()) / num_ranks)
    order = np.lexsort((np.arange(costs.size), -costs))  # largest first, then by index: deterministic
    plain = _lpt(costs, home, order, num_ranks)
    cap = _loads(costs, plain, num_ranks).max(initial=0.0)
    candidates = [plain, *(_keep_first(costs, home, keep, num_ranks, cap) for keep in (order, order[::-1]))]
    for ranks in candidates:
        _send_home(costs, home, ranks, order, num_ranks)
    # The lowest makespan; among those the least cost moved (a proxy for the bytes), then the first.
    best = min(candidates, key=lambda r: (_loads(costs, r, num_ranks).max(initial=0.0), float(costs[r != home].sum())))
    load = _loads(costs, best, num_ranks)
    if load.max(initial=0.0) >= home_load.max(initial=0.0) * (1.0 - near_tie):
        best, load = home.copy(), home_load
    return EncoderPlan(encoder=best, home=home, home_load=home_load, load=load, lower_bound=bound)


def route_bytes(plan: EncoderPlan, pixel_bytes: ArrayLike, embedding_bytes: ArrayLike, num_ranks: int) -> np.ndarray:
    """float64 ``[R]``: the bytes each rank sends or receives (the larger) for ``plan``'s
    moved images (``pixel_bytes``, ``embedding_bytes``: ``[N]``, each image's): their pixels
    to the encoder, their embeddings back, and the embeddings' gradients the other way."""
    pixels = np.asarray(pixel_bytes, dtype=np.float64) * plan.moved
    embeds = np.asarray(embedding_bytes, dtype=np.float64) * plan.moved
    # A home sends pixels and gradients and receives embeddings; an encoder the reverse.
    sent = _loads(pixels + embeds, plan.home, num_ranks) + _loads(embeds, plan.encoder, num_ranks)
    received = _loads(embeds, plan.home, num_ranks) + _loads(pixels + embeds, plan.encoder, num_ranks)
    return np.maximum(sent, received)


def rebalance_pays(
    plan: EncoderPlan,
    pixel_bytes: ArrayLike,
    embedding_bytes: ArrayLike,
    *,
    seconds_per_cost: float,
    bytes_per_second: float = LINK_BYTES_PER_SECOND,
    other_load: ArrayLike | None = None,
) -> bool:
    """Whether ``plan`` saves more round time than its exchange takes: :func:`round_gain`
    (``other_load``: each rank's language-model work in the round, in the plan's cost units)
    times ``seconds_per_cost``, against the busiest rank's :func:`route_bytes` over
    ``bytes_per_second``."""
    if not plan.moved.any():
        return False
    exchange = float(route_bytes(plan, pixel_bytes, embedding_bytes, plan.load.size).max()) / bytes_per_second
    return round_gain(plan, other_load) * seconds_per_cost > exchange


def round_gain(plan: EncoderPlan, other_load: ArrayLike | None = None) -> float:
    """The round time ``plan`` saves, exchange aside (cost units): ``max(home_load + other)``
    at home against ``max(load) + max(other)`` routed (the route's barrier between the encoder
    and the language model); :attr:`EncoderPlan.gain` without ``other_load``.

    Raises:
        ConfigError: ``other_load`` not one finite value per rank.
    """
    if other_load is None:
        return plan.gain
    other = np.asarray(other_load, dtype=np.float64)
    if other.shape != plan.load.shape or not np.isfinite(other).all():
        raise ConfigError(f"other_load must be {plan.load.size} finite values, one per rank, got shape {other.shape}")
    home = float((plan.home_load + other).max(initial=0.0))
    return home - float(plan.load.max(initial=0.0)) - float(other.max(initial=0.0))
