"""``"dp_balanced"``: Megatron-LM's sequence-packing scheduler, for parity and as a baseline.

Behaviour matched (Megatron-LM ``megatron/core/datasets/data_schedule.py``,
``DpBalancedScheduler.get_groups_and_subsamples``, and the lengths it is given by
``get_batch_and_global_seqlens``):

* It schedules *padded* lengths, in global order (DP rank 0's samples first).
* Next-fit in that order: a group takes sequences while their sum stays within
  ``max_seqlen_per_dp_cp_rank * cp_size`` (here ``max_tokens_per_rank * cp_size``), else a new
  group starts. No sorting, no cost model.
* If the number of groups is not a multiple of ``dp_size * microbatch_group_size_per_vp_stage``
  (``microbatch_multiple`` here; 1 without interleaved pipelines), it splits groups: starting
  from the last group and walking backwards, while a group holds more than one sequence its
  last sequence is popped into a new one-sequence group appended at the end; a group of one
  moves the walk to the previous group.
* Microbatch ``i`` of DP replica ``j`` is group ``i * dp_size + j`` (all CP ranks of a replica
  share it).

Where Megatron asserts, seqpack continues, documented here: Megatron never splits the first
group (``assert i > 0``); seqpack splits it too when it must, and when even one sequence per
group leaves the count short of a multiple (fewer sequences than replicas), it appends empty
groups (the wrapper fills them with padding) instead of failing. On every input Megatron
accepts, the result is identical. Megatron also rounds the per-rank capacity down to its
padding alignment; pass a ``max_tokens_per_rank`` that is already a multiple of it.
"""

from __future__ import annotations

import numpy as np

from seqpack.cost import CostModel
from seqpack.schedulers import _kernels
from seqpack.schedulers.base import GridScheduler
from seqpack.schedulers.request import check_microbatches
from seqpack.thd import padded_lengths
from seqpack.validation import check_positive_int


def megatron_groups(padded: np.ndarray, capacity: int, dp_size: int, microbatch_multiple: int = 1) -> list[np.ndarray]:
    """Megatron's groups of positions (next-fit, then split to a multiple of ``dp * multiple``).

    Args:
        padded: Padded lengths in global order, each at most ``capacity``.
        capacity: Tokens per group.
        dp_size, microbatch_multiple: The group count becomes a multiple of their product.

    Returns:
        Position arrays, one per group; microbatch ``i`` of replica ``j`` is group ``i*dp + j``.
    """
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    group_of, n_groups = _kernels.next_fit(padded, capacity)
    starts = np.searchsorted(group_of, np.arange(n_groups), side="left")
    ends = np.append(starts[1:], padded.shape[0]).astype(np.int64)
    bounds = [[int(a), int(b)] for a, b in zip(starts, ends, strict=False)]
    multiple = dp_size * microbatch_multiple
    remainder = len(bounds) % multiple
    if remainder:
        to_move = multiple - remainder
        i = len(bounds) - 1
        while to_move > 0 and i >= 0:
            start, end = bounds[i]
            if end - start > 1:
                bounds[i][1] = end - 1
                bounds.append([end - 1, end])
                to_move -= 1
            else:
                i -= 1
        bounds.extend([[0, 0]] * to_move)
    return [np.arange(a, b, dtype=np.int64) for a, b in bounds]


class DpBalancedScheduler(GridScheduler):
    """Megatron's next-fit scheduler (module docstring).

    Args:
        microbatch_multiple: Megatron's ``microbatch_group_size_per_vp_stage`` (interleaved
            pipelines): the microbatch count becomes a multiple of it.
    """

    name = "dp_balanced"

    def __init__(self, *, microbatch_multiple: int = 1) -> None:
        self.microbatch_multiple = check_positive_int("microbatch_multiple", microbatch_multiple)

    def _plan(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        dp_size: int,
        capacity: int,
        pad_multiple: int,
        cost: CostModel | None,
        origin: np.ndarray,
    ) -> tuple[list[list[np.ndarray]], np.ndarray]:
        check_microbatches(dp_size, microbatch_multiple=self.microbatch_multiple)
        groups = megatron_groups(padded_lengths(lengths, pad_multiple), capacity, dp_size, self.microbatch_multiple)
        if not ids.size:
            return [], np.zeros(0, dtype=np.int64)
        m_count = len(groups) // dp_size
        rounds = [[ids[groups[m * dp_size + d]] for d in range(dp_size)] for m in range(m_count)]
        return rounds, np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return f"DpBalancedScheduler(microbatch_multiple={self.microbatch_multiple})"
