"""The K/V rows and bytes ``ThdAttention(backend="torch")`` moves between CP ranks for one pack,
against an all-gather of K/V: measurement for benchmarks/compute.py (not part of the product).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.compute.attention.kv_exchange import _host, keys_in_reach
from seqpack.compute.attention.masks import attention_mask
from seqpack.options import CpLayout
from seqpack.thd.cp import gather_order
from seqpack.thd.padding import check_cp
from seqpack.validation import check_choice, check_positive_int


@dataclasses.dataclass(frozen=True)
class KvTraffic:
    """K/V rows and bytes one pack's attention moves between CP ranks, against an all-gather.

    Attributes:
        rows_received: Per rank, rows received from other ranks by the exchange.
        rows_all_gather: Rows each rank receives in an all-gather of K/V (``(cp-1) T / cp``).
        bytes_per_row: Bytes of one token's K and V (``2 * num_kv_heads * head_dim * element_size``).
    """

    rows_received: tuple[int, ...]
    rows_all_gather: int
    bytes_per_row: int

    @property
    def bytes(self) -> int:
        """Bytes the exchange moves (all ranks)."""
        return sum(self.rows_received) * self.bytes_per_row

    @property
    def bytes_all_gather(self) -> int:
        """Bytes an all-gather of K/V moves (all ranks)."""
        return len(self.rows_received) * self.rows_all_gather * self.bytes_per_row

    @property
    def max_rank_bytes(self) -> int:
        """Bytes the busiest rank receives."""
        return max(self.rows_received, default=0) * self.bytes_per_row

    @property
    def saving(self) -> float:
        """Fraction of the all-gather's bytes not moved (0 when the all-gather moves nothing)."""
        return 1.0 - self.bytes / self.bytes_all_gather if self.bytes_all_gather else 0.0


def kv_exchange_traffic(
    cu_seqlens: torch.Tensor | Sequence[int],
    cu_seqlens_padded: torch.Tensor | Sequence[int],
    cp_size: int,
    *,
    causal: bool = True,
    window: Sequence[int] | None = None,
    layout: CpLayout | str = CpLayout.DUALCHUNK,
    num_kv_heads: int = 1,
    head_dim: int = 1,
    element_size: int = 2,
) -> KvTraffic:
    """Rows and bytes of K/V that ``ThdAttention(backend="torch")`` moves for one pack under CP
    (what ``seqpack.compute.attention.kv_exchange.exchange_kv`` sends between ranks), and an
    all-gather's for comparison.

    Raises:
        ConfigError: A bad mask or sizes, or offsets the layout cannot split.
    """
    cp_size, _ = check_cp(cp_size)
    layout = check_choice("layout", layout, CpLayout)
    mask = attention_mask(causal, window)
    per_row = 2 * check_positive_int("num_kv_heads", num_kv_heads) * check_positive_int("head_dim", head_dim)
    per_row *= check_positive_int("element_size", element_size)
    real, padded = _host(cu_seqlens), _host(cu_seqlens_padded)
    total = padded[-1]
    owned = gather_order(torch.tensor(padded), total, cp_size, layout=layout).numpy().reshape(cp_size, -1)
    need = keys_in_reach(real, padded, cp_size, layout, mask)
    own_needed = np.take_along_axis(need, owned, axis=1).sum(axis=1)  # keys a rank needs and holds itself
    received = need.sum(axis=1) - own_needed
    return KvTraffic(tuple(int(n) for n in received), (cp_size - 1) * (total // cp_size), per_row)
