"""Encoder rebalancing's route: a microbatch round's images encoded on other DP ranks and their
embeddings brought back, differentiably.

Every rank of the round calls, in this order: :func:`gather_grids` (every rank's image grids,
so every rank computes the same :func:`~seqpack.schedulers.encoder_plan.plan_encoders` plan);
:func:`plan_route` (pure: this rank's split sizes and row orders); :func:`move_patches` (each
image's patches to its encoding rank); the vision tower over the images it encodes, in
:attr:`RoutePlan.encode_grids` order; :func:`route_back` (the embeddings back to the rank and
order that needs them, differentiably: the tower's gradient lands on the encoding rank).
Local images are in the order the rank gives their grids (the HF model's: images, then
videos). seqpack keeps its own autograd function because torch deprecates its differentiable
``all_to_all_single``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.distributed import ProcessGroup

from seqpack.collective.groups import all_gather, all_gather_rows, all_to_all
from seqpack.thd.padding import ranges

__all__ = ["GatheredRound", "RoutePlan", "gather_grids", "move_patches", "plan_route", "route_back"]


@dataclasses.dataclass(frozen=True)
class GatheredRound:
    """What every rank of a round knows after :func:`gather_grids`.

    Attributes:
        grids: int64 ``[N, 3]`` every rank's grids, in rank order.
        home: int64 ``[N]`` the rank each grid came from.
        price: The group's first rank's ``price``.
        work: float64 ``[R]`` each rank's ``work``.
    """

    grids: np.ndarray
    home: np.ndarray
    price: float
    work: np.ndarray


def gather_grids(
    grids: torch.Tensor, group: ProcessGroup | None, num_ranks: int, price: float = 0.0, work: float = 0.0
) -> GatheredRound:
    """Every rank's grids ``[n_r, 3]`` (int64) in rank order and the rank each row came from;
    the group's first rank's ``price`` (so every rank prices the round alike) and every rank's
    ``work`` (its language model's, in the round)."""
    if num_ranks == 1:  # no collective on one rank
        local_rows = grids.detach().cpu().to(torch.int64).reshape(-1, 3).numpy()
        home = np.zeros(local_rows.shape[0], dtype=np.int64)
        return GatheredRound(local_rows, home, float(price), np.array([work], dtype=np.float64))
    local = grids.detach().cpu().to(torch.int64).reshape(-1, 3)
    bits = np.array([price, work], dtype=np.float64).view(np.int64).tolist()
    table = all_gather(torch.tensor([local.shape[0], *bits], dtype=torch.int64), group).numpy()
    sizes = [int(n) for n in table[:, 0]]
    floats = np.ascontiguousarray(table[:, 1:]).view(np.float64)  # [R, 2]
    every = all_gather_rows(local, sizes, group).numpy()
    home = np.repeat(np.arange(num_ranks, dtype=np.int64), sizes)
    return GatheredRound(every, home, float(floats[0, 0]), floats[:, 1].copy())


def _rows(order: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Row indices of items ``order`` (each ``counts[i]`` consecutive rows, items stored in
    index order), concatenated."""
    starts = np.cumsum(counts, dtype=np.int64) - counts
    return ranges(starts[order], counts[order])


@dataclasses.dataclass(frozen=True)
class RoutePlan:
    """One rank's part of a round's route (all counts int64, lists for the collectives).

    Attributes:
        send_patches, recv_patches: Patch rows this rank sends to / receives from each rank.
        send_patch_rows: Local patch rows in send order (by encoder, then local order).
        encode_grids: int64 ``[k, 3]`` the grids this rank encodes, in received order (by home
            rank, then that rank's order).
        send_embeds, recv_embeds: Embedding rows this rank sends to / receives from each rank.
        local_embed_rows: For each local embedding row (local order), its row in the received
            embeddings (by encoder, then local order).
    """

    send_patches: list[int]
    recv_patches: list[int]
    send_patch_rows: np.ndarray
    encode_grids: np.ndarray
    send_embeds: list[int]
    recv_embeds: list[int]
    local_embed_rows: np.ndarray


def plan_route(
    grids: np.ndarray, home: np.ndarray, encoder: np.ndarray, rank: int, num_ranks: int, merge: int
) -> RoutePlan:
    """This rank's :class:`RoutePlan` for a round's ``grids`` ``[N, 3]`` (rank order), each
    image's ``home`` and ``encoder`` rank, and the tower's ``spatial_merge_size`` ``merge``."""
    patches = grids.prod(axis=1).astype(np.int64)
    embeds = patches // (merge * merge)
    index = np.arange(home.size)
    mine = np.flatnonzero(home == rank)  # local order
    local_patches, local_embeds = patches[mine], embeds[mine]
    by_encoder = np.lexsort((np.arange(mine.size), encoder[mine]))  # local positions, by encoder
    encoded = np.flatnonzero(encoder == rank)
    encoded = encoded[np.lexsort((index[encoded], home[encoded]))]  # by home, then home's order
    received_order = _rows(by_encoder, local_embeds)  # received row -> local row
    local_rows = np.empty_like(received_order)
    local_rows[received_order] = np.arange(received_order.size)
    return RoutePlan(
        send_patches=np.bincount(encoder[mine], weights=local_patches, minlength=num_ranks).astype(np.int64).tolist(),
        recv_patches=np.bincount(home[encoded], weights=patches[encoded], minlength=num_ranks)
        .astype(np.int64)
        .tolist(),
        send_patch_rows=_rows(by_encoder, local_patches),
        encode_grids=grids[encoded],
        send_embeds=np.bincount(home[encoded], weights=embeds[encoded], minlength=num_ranks).astype(np.int64).tolist(),
        recv_embeds=np.bincount(encoder[mine], weights=local_embeds, minlength=num_ranks).astype(np.int64).tolist(),
        local_embed_rows=local_rows,
    )


def move_patches(pixels: torch.Tensor, route: RoutePlan, group: ProcessGroup | None) -> torch.Tensor:
    """This rank's local patches ``[P, D]`` to their encoding ranks; returns the patches it
    encodes ``[P', D]``, in :attr:`RoutePlan.encode_grids` order. No gradient flows."""
    rows = torch.as_tensor(route.send_patch_rows, device=pixels.device)
    return all_to_all(pixels.detach()[rows], route.send_patches, route.recv_patches, group)


class _RouteBack(torch.autograd.Function):
    """Encoded embeddings (encoder order) -> the embeddings this rank needs (local order);
    backward: their gradients back to the encoders."""

    @staticmethod
    def forward(ctx: Any, encoded: torch.Tensor, anchor: torch.Tensor, route: RoutePlan, group: Any) -> torch.Tensor:
        ctx.route, ctx.group, ctx.anchor_shape = route, group, anchor.shape
        received = all_to_all(encoded, route.send_embeds, route.recv_embeds, group)
        rows = torch.as_tensor(route.local_embed_rows, device=received.device)
        return received[rows]  # [local rows, E]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        route: RoutePlan = ctx.route
        order = torch.empty_like(torch.as_tensor(route.local_embed_rows, device=grad.device))
        order[torch.as_tensor(route.local_embed_rows, device=grad.device)] = torch.arange(
            order.numel(), device=grad.device
        )
        back = all_to_all(grad.contiguous()[order], route.recv_embeds, route.send_embeds, ctx.group)
        return back, grad.new_zeros(ctx.anchor_shape), None, None


def route_back(encoded: torch.Tensor, route: RoutePlan, group: ProcessGroup | None) -> torch.Tensor:
    """The embeddings ``encoded`` ``[rows, E]`` (this rank's images, :attr:`RoutePlan.encode_grids`
    order) to the ranks that need them; returns this rank's ``[local rows, E]`` in local order.

    Differentiable, and collective in both directions: the result always requires grad when
    grad mode is on, and every rank must backpropagate through it
    (:func:`seqpack.interop.hf_encoder.rebalance_encoder` ties it into the loss).
    """
    anchor = torch.zeros(0, device=encoded.device, dtype=encoded.dtype, requires_grad=torch.is_grad_enabled())
    out: torch.Tensor = _RouteBack.apply(encoded, anchor, route, group)
    return out
