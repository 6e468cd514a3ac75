"""The CP key/value exchange of the torch attention: each rank receives only the keys in reach.

Under a mask a chunk of real queries reaches one run of real keys of its sequence, so instead
of an all-gather of every rank's K/V, every rank sends each other rank just the rows that rank
needs, in one all-to-all with uneven splits whose backward returns every key's gradient to its
owner. The plan (:func:`plan_kv_exchange`) is pure index arithmetic on the global offsets,
cached per pack.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from seqpack.compute._collectives import all_to_all_rows
from seqpack.compute.attention.masks import AttentionMask, key_range
from seqpack.options import CpLayout
from seqpack.thd.cp import gather_order, held_runs
from seqpack.thd.padding import check_cp
from seqpack.validation import check_choice

__all__ = ["KvExchangePlan", "exchange_kv", "keys_in_reach", "plan_kv_exchange"]


@dataclasses.dataclass(frozen=True)
class KvExchangePlan:
    """One CP rank's side of the exchange (host arrays, int64).

    Attributes:
        send_index: Local rows this rank sends, grouped by destination rank (in rank order),
            increasing within each group.
        send_counts, recv_counts: Rows sent to / received from each rank (itself included).
        recv_order: ``received.index_select(0, recv_order)`` puts the received rows in key order.
        key_positions: The global position of every key after that reordering (increasing).
    """

    send_index: np.ndarray
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    recv_order: np.ndarray
    key_positions: np.ndarray


def keys_in_reach(
    real: Sequence[int], padded: Sequence[int], cp_size: int, layout: CpLayout, mask: AttentionMask
) -> np.ndarray:
    """bool ``[cp_size, T]``: ``[r, t]`` is True when a real query of CP rank ``r`` attends key ``t``."""
    cu_real, cu_padded = np.asarray(real, dtype=np.int64), np.asarray(padded, dtype=np.int64)
    total = int(cu_padded[-1])
    seq_start = cu_padded[:-1]  # [N]
    real_end = seq_start + np.diff(cu_real)
    diff = np.zeros((cp_size, total + 1), dtype=np.int64)  # +1 at a run's start, -1 past its end
    for rank in range(cp_size):
        q_start, q_len = held_runs(seq_start, np.diff(cu_padded), cp_size, rank, layout)  # [N, k]
        starts, ends = (np.broadcast_to(a[:, None], q_start.shape) for a in (seq_start, real_end))
        q_end = np.minimum(q_start + q_len, ends)  # real queries only
        lo, hi = key_range(q_start, q_end, starts, ends, mask)
        has_queries = q_end > q_start
        np.add.at(diff[rank], np.asarray(lo)[has_queries], 1)
        np.add.at(diff[rank], np.asarray(hi)[has_queries], -1)
    return np.cumsum(diff[:, :total], axis=1) > 0


@functools.lru_cache(maxsize=32)
def _plan(
    real: tuple[int, ...], padded: tuple[int, ...], cp_size: int, cp_rank: int, layout: CpLayout, mask: AttentionMask
) -> KvExchangePlan:
    total = padded[-1]
    need = keys_in_reach(real, padded, cp_size, layout, mask)  # [cp, T]
    owned = gather_order(torch.tensor(padded), total, cp_size, layout=layout).numpy().reshape(cp_size, -1)
    to_each, my_rows = np.nonzero(need[:, owned[cp_rank]])  # who needs which of my rows, rank-major
    from_each, their_rows = np.nonzero(need[cp_rank][owned])  # which of each rank's rows I need
    positions = owned[from_each, their_rows]  # global position of every row I receive, in arrival order
    recv_order = np.argsort(positions, kind="stable")
    return KvExchangePlan(
        send_index=my_rows.astype(np.int64),
        send_counts=tuple(np.bincount(to_each, minlength=cp_size).tolist()),
        recv_counts=tuple(np.bincount(from_each, minlength=cp_size).tolist()),
        recv_order=recv_order.astype(np.int64),
        key_positions=positions[recv_order].astype(np.int64),
    )


def plan_kv_exchange(
    cu_seqlens: torch.Tensor | Sequence[int],
    cu_seqlens_padded: torch.Tensor | Sequence[int],
    cp_size: int,
    cp_rank: int,
    *,
    mask: AttentionMask,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
) -> KvExchangePlan:
    """What CP rank ``cp_rank`` sends and receives so that it holds every key its queries reach.

    Raises:
        ConfigError: Offsets the layout cannot split (see :func:`seqpack.thd.cp.partition_indices`).
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    layout = check_choice("cp_layout", layout, CpLayout)
    return _plan(_host(cu_seqlens), _host(cu_seqlens_padded), cp_size, cp_rank, layout, mask)


def _host(offsets: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    return tuple(offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets)


def exchange_kv(
    k: torch.Tensor, v: torch.Tensor, plan: KvExchangePlan, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at ``plan.key_positions`` (``[K, Hkv, D]`` each), from this rank's ``k, v``
    (``[T_local, Hkv, D]``). A collective: every rank of ``group`` calls it with its own plan."""
    device = k.device
    kv = torch.stack((k, v), dim=1)  # (T_local, 2, Hkv, D)
    send = kv.index_select(0, torch.from_numpy(plan.send_index).to(device))  # (S, 2, Hkv, D), by destination
    received = all_to_all_rows(send, plan.send_counts, plan.recv_counts, group)  # (K, 2, Hkv, D), by source
    keys = received.index_select(0, torch.from_numpy(plan.recv_order).to(device))  # (K, 2, Hkv, D), key order
    return keys[:, 0], keys[:, 1]
