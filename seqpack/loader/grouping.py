"""The ``group_id`` sample field: sequences of one group stay on one DP replica.

A sample may carry ``group_id``, any integer (the responses of one prompt, a chosen / rejected
pair); samples of every DP rank with the same id form one group. The reader keeps it as
:data:`GROUP_KEY`, the length gather carries it in the ``grouped`` and ``group_id`` columns.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError

__all__ = ["GROUP_KEY", "group_columns", "group_id_of"]

GROUP_KEY = "group_id"


def group_id_of(item: Any, where: str) -> int | None:
    """The ``group_id`` of one raw sample, or ``None`` when it has none.

    Raises:
        SampleError: A value that is not one integer of int64 range, named with ``where``.
    """
    if not isinstance(item, Mapping) or GROUP_KEY not in item:
        return None
    value = item[GROUP_KEY]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        if not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
            value = int(value.reshape(-1)[0])
    elif isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu":
        value = int(value.reshape(-1)[0])
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and -(2**63) <= int(value) < 2**63:
        return int(value)
    raise SampleError(f"{where}: group_id must be one integer (int64 range), got {value!r:.60}")


def group_columns(pool: Sequence[Mapping[str, torch.Tensor]]) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(grouped, group_id)`` of every sequence of ``pool`` (``group_id`` 0 where
    ``grouped`` is 0)."""
    grouped = np.fromiter((GROUP_KEY in s for s in pool), dtype=np.int64, count=len(pool))
    ids = np.fromiter((int(s[GROUP_KEY]) if GROUP_KEY in s else 0 for s in pool), dtype=np.int64, count=len(pool))
    return grouped, ids
