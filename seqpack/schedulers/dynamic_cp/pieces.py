"""The pieces of a dynamic-CP step, one per sequence and rank of its group (pure): who runs
and who sends each (docs/dynamic_cp.md, "The exchange"), the one definition the exchange
(``seqpack.collective.exchange``) and the stats (:mod:`.stats`) read.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.schedulers.schedule import Schedule

__all__ = ["Pieces", "plan_pieces", "shard_layout"]


def shard_layout(plan: Schedule, spans: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int64 ``[N]`` each: every id's group's first plane rank and size (-1 unassigned), and
    its tokens per shard (``spans``, default ``plan.packed_spans()``, / size; 0 unassigned)."""
    size, start = plan.per_id(plan.group_size), plan.per_id(plan.group_start)
    padded = plan.packed_spans() if spans is None else spans
    return start, size, np.where(size > 0, padded // np.maximum(size, 1), 0)


@dataclasses.dataclass(frozen=True)
class Pieces:
    """Every piece as flat int64 arrays: the id, its CP rank ``j`` in the group, the plane
    ranks that run it (``dst``) and send it (``src``), its tokens."""

    gid: np.ndarray
    j: np.ndarray
    dst: np.ndarray
    src: np.ndarray
    tokens: np.ndarray

    @classmethod
    def of(cls, start: np.ndarray, size: np.ndarray, tokens: np.ndarray, origin: np.ndarray, cp_size: int) -> Pieces:
        """From per-id arrays (:func:`shard_layout`, and the DP rank that read each id)."""
        ids = np.flatnonzero(size > 0).astype(np.int64)
        reps = size[ids]
        gid = np.repeat(ids, reps)
        j = np.arange(gid.shape[0], dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
        dst = start[gid] + j
        return cls(gid, j, dst, origin[gid] * cp_size + dst % cp_size, tokens[gid])

    @property
    def moving(self) -> np.ndarray:
        """bool: the piece crosses the wire (it is not cut where it runs)."""
        return self.src != self.dst


def plan_pieces(plan: Schedule) -> Pieces:
    """The pieces of ``plan``, read by the DP ranks in ``plan.origin``."""
    assert plan.origin is not None  # filled in __post_init__
    start, size, tokens = shard_layout(plan)
    return Pieces.of(start, size, tokens, plan.origin, plan.cp_size)
