"""Autograd-aware collectives over the token axis (dim 0) of a CP group.

They use only ``all_to_all_single``, so they work with every backend, gloo included; seqpack
keeps its own because torch deprecates ``torch.distributed.nn.functional.all_to_all_single``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from seqpack.errors import SeqpackError
from seqpack.options import CpLayout
from seqpack.thd.batch import PackedBatch
from seqpack.thd.cp import gather_order


def batch_cp(
    batch: PackedBatch, group: dist.ProcessGroup | None, size: int, rank: int
) -> tuple[dist.ProcessGroup | None, int, int]:
    """``(group, size, rank)`` ``batch`` runs on: its own ``cp_group`` when it carries one (the
    wrapper's batches under CP), else a module's ``group``, ``size`` and ``rank``."""
    if batch.cp_group is not None:
        return batch.cp_group, batch.cp_size, batch.cp_rank
    return group, size, rank


def check_cp_shard(batch: PackedBatch, cp_size: int, cp_rank: int, layout: CpLayout | None = None) -> None:
    """Raise :class:`~seqpack.errors.SeqpackError` unless ``batch`` is CP shard ``cp_rank`` of
    ``cp_size`` (a module's; the batch's own when it carries a ``cp_group``, which must then be
    the group of its shard) and, when ``layout`` is given and ``cp_size > 1``, cut in it."""
    if batch.cp_group is not None:
        _check_batch_group(batch)
    _, cp_size, cp_rank = batch_cp(batch, None, cp_size, cp_rank)
    if cp_size == 1 < batch.cp_size:  # neither the module nor the batch has a CP group
        raise SeqpackError(
            f"batch is CP shard {batch.cp_rank} of {batch.cp_size} but this module has no CP group (built with "
            f"cp_group=None) and the batch carries none: build the module with cp_group=<the CP process group of "
            f"{batch.cp_size} ranks>, or pass a batch that is not CP-sharded (cp_size=1)"
        )
    if batch.cp_size != cp_size or batch.cp_rank != cp_rank:
        raise SeqpackError(
            f"batch is CP shard {batch.cp_rank} of {batch.cp_size} but this module runs as CP rank "
            f"{cp_rank} of {cp_size}; shard with seqpack.thd.shard_for_cp(batch, {cp_size}, {cp_rank})"
        )
    if layout is not None and cp_size > 1 and batch.cp_layout != layout:
        raise SeqpackError(
            f"batch is cut in cp_layout={batch.cp_layout.value!r} but this module was built for "
            f"cp_layout={layout.value!r}; shard with seqpack.thd.shard_for_cp(..., layout={layout.value!r}) "
            "or build the module with cp_layout=None to follow each batch"
        )


def _check_batch_group(batch: PackedBatch) -> None:
    group = batch.cp_group
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if (size, rank) != (batch.cp_size, batch.cp_rank):
        raise SeqpackError(
            f"batch is CP shard {batch.cp_rank} of {batch.cp_size} but its cp_group has {size} ranks with this "
            f"rank at {rank}: a batch's cp_group must be the group of its shard"
        )


def _all_to_all_split(
    x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    out = x.new_empty(sum(recv_counts), *x.shape[1:])
    dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=group)
    return out


class _AllToAllSplit(torch.autograd.Function):
    """All-to-all along dim 0 with given splits; its adjoint is the all-to-all back (splits swapped)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.group, ctx.send_counts, ctx.recv_counts = group, send_counts, recv_counts
        return _all_to_all_split(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _all_to_all_split(grad, ctx.recv_counts, ctx.send_counts, ctx.group), None, None, None


def all_to_all_tokens(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Send row block ``j`` of ``x`` (dim 0 cut in equal blocks) to rank ``j``; return the
    blocks received, in rank order."""
    size = dist.get_world_size(group)
    counts = [x.shape[0] // size] * size
    return all_to_all_rows(x, counts, counts, group)


def all_to_all_rows(
    x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Send the next ``send_counts[j]`` rows of ``x`` to rank ``j``; return the rows received,
    ``recv_counts[i]`` from rank ``i``, in rank order. Gradients travel back the same way.

    Every rank of ``group`` must call it (with matching counts), also with nothing to send.
    """
    out: torch.Tensor = _AllToAllSplit.apply(x, [int(n) for n in send_counts], [int(n) for n in recv_counts], group)
    return out


def cp_token_orders(
    cu_seqlens_padded: torch.Tensor,
    total_tokens: int,
    cp_size: int,
    device: torch.device,
    layout: CpLayout = CpLayout.DUALCHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, to_global)`` for the rank-major concatenation of all CP shards in ``layout``.

    ``order[i]`` is the global token index of row ``i`` (``seqpack.thd.cp.gather_order``), so
    ``rank_major.index_select(0, to_global)`` is the pack in global order and
    ``global_order.index_select(0, order)`` goes back, both differentiable.
    """
    order = gather_order(cu_seqlens_padded, total_tokens, cp_size, layout=layout).to(device)
    to_global = torch.empty_like(order)
    to_global[order] = torch.arange(order.numel(), device=device)
    return order, to_global
