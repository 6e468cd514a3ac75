"""Process-group helpers every collective of seqpack uses.

A group of ``None`` stands for a single rank: every helper answers for it without touching
``torch.distributed``, so the same code runs in one process and on many.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_objects", "comm_device", "global_rank", "group_rank", "group_size", "this_rank"]


def group_size(group: Any) -> int:
    """Ranks in ``group`` (1 for ``None``)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Any) -> int:
    """This rank's index in ``group`` (0 for ``None``)."""
    return 0 if group is None else dist.get_rank(group)


def global_rank(group: Any, rank_in_group: int) -> int:
    """Global rank of ``rank_in_group``, read from the group's membership, never computed."""
    if group is None:
        return this_rank()
    return dist.get_global_rank(group, rank_in_group)


def this_rank() -> int:
    """This process's global rank (0 without ``torch.distributed``)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def comm_device(group: Any) -> torch.device:
    """Device collectives on ``group`` need: CUDA for NCCL, CPU otherwise."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_objects(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` in group-rank order (pickled; use off the hot path only)."""
    out: list[Any] = [None] * group_size(group)
    if group is None:
        out[0] = obj
        return out
    dist.all_gather_object(out, obj, group=group)
    return out
