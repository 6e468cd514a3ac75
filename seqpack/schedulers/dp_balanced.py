"""``"dp_balanced"``: Megatron-LM's sequence-packing scheduler (``megatron/core/datasets/
data_schedule.py``, ``DpBalancedScheduler.get_groups_and_subsamples``), for parity and as a
baseline; the rules it matches and where it continues past Megatron's asserts:
docs/schedulers.md."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers import _kernels
from seqpack.schedulers.base import GridScheduler
from seqpack.schedulers.request import Request, check_microbatches
from seqpack.schedulers.schedule import Grid
from seqpack.thd import padded_lengths
from seqpack.validation import check_positive_int


def megatron_groups(padded: np.ndarray, capacity: int, dp_size: int, microbatch_multiple: int = 1) -> Grid:
    """Megatron's groups of ``padded`` (global order, each at most ``capacity``) as a
    :class:`Grid` of positions: group ``i * dp + j`` is microbatch ``i`` of replica ``j``."""
    padded = np.ascontiguousarray(padded, dtype=np.int64)
    n = padded.shape[0]
    group_of, n_groups = _kernels.next_fit(padded, capacity)
    opens = np.diff(group_of, prepend=-1) > 0  # the positions that start a group
    starts = np.flatnonzero(opens)
    # The backward walk pops the last position of the group it stands on while that group
    # holds more than one, each into a new group appended in pop order, then appends empty
    # groups: it pops the `to_move` largest positions that start no group, and every
    # position below the smallest of them stays where next-fit put it.
    to_move = -n_groups % (dp_size * microbatch_multiple)
    popped = np.flatnonzero(~opens)[::-1][:to_move]
    first_popped = int(popped[-1]) if popped.size else n
    kept = np.clip(first_popped, starts + 1, np.append(starts[1:], n)) - starts
    positions = np.concatenate([np.arange(first_popped), starts[starts >= first_popped], popped])
    counts = np.concatenate([kept, np.ones(popped.shape[0], np.int64), np.zeros(to_move - popped.shape[0], np.int64)])
    return Grid(positions, counts, dp_size)


class DpBalancedScheduler(GridScheduler):
    """Megatron's next-fit scheduler (module docstring).

    Args:
        microbatch_multiple: Megatron's ``microbatch_group_size_per_vp_stage`` (interleaved
            pipelines): the microbatch count becomes a multiple of it.
    """

    name = "dp_balanced"

    def __init__(self, *, microbatch_multiple: int = 1) -> None:
        self.microbatch_multiple = check_positive_int("microbatch_multiple", microbatch_multiple)

    def _plan(self, request: Request) -> tuple[Grid, np.ndarray]:
        check_microbatches(request.dp_size, microbatch_multiple=self.microbatch_multiple)
        padded = padded_lengths(request.lengths, request.pad_multiple)
        grid = megatron_groups(padded, request.capacity, request.dp_size, self.microbatch_multiple)
        return grid, np.zeros(0, np.int64)

    def __repr__(self) -> str:
        return f"DpBalancedScheduler(microbatch_multiple={self.microbatch_multiple})"
