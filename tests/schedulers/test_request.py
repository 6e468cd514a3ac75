"""The one request every planner takes (seqpack.schedulers.request.Request)."""

import dataclasses

import numpy as np
import pytest

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.schedulers import GridScheduler, Request, get_scheduler
from seqpack.schedulers.schedule import Grid
from seqpack.thd import StaticShapes


def test_of_checks_once_and_fills_the_defaults():
    request = Request.of([5, 7, 9, 11], dp_size=2, max_tokens_per_rank=16)
    assert request.lengths.dtype == np.int64 and request.origin.tolist() == [0, 0, 1, 1]
    assert (request.cp_size, request.pad_multiple, request.sync, request.on_oversize) == (1, 1, "lockstep", "error")
    assert request.capacity == 16 and request.cost is None and request.bytes_per_token is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.dp_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"lengths": [3, 0]}, SampleError, "sample 1 has length 0"),
        ({"dp_size": 0}, ConfigError, "dp_size"),
        ({"sync": "both"}, ConfigError, "sync must be one of"),
        ({"on_oversize": "clip"}, ConfigError, "on_oversize"),
        ({"origin": [0, 2]}, ConfigError, "origin of sample 1 is DP rank 2"),
        ({"bytes_per_token": -1.0}, ConfigError, "bytes_per_token"),
        ({"cost": "flops"}, SeqpackTypeError, "cost must be a seqpack.CostModel or None"),
    ],
)
def test_of_refuses_a_bad_value_by_name(change, error, match):
    arguments = {"lengths": [3, 4], "dp_size": 2, "max_tokens_per_rank": 8, **change}
    with pytest.raises(error, match=match):
        Request.of(arguments.pop("lengths"), **arguments)


def test_capacity_is_the_largest_bucket_under_static_shapes_and_subset_keeps_the_rest():
    shapes = StaticShapes(token_buckets=(8, 12), max_sequences=4)
    request = Request.of([5, 7, 9], dp_size=1, cp_size=2, max_tokens_per_rank=8, static_shapes=shapes, sync="replica")
    assert request.capacity == 12
    part = request.subset(np.array([2, 0]))
    assert part.lengths.tolist() == [9, 5] and part.origin.tolist() == [0, 0] and part.sync == "replica"
    assert request.subset(np.array([1]), lengths=np.array([3])).lengths.tolist() == [3]


class _Reversed(GridScheduler):
    """Test-only: one microbatch per replica, sequences dealt round-robin in reverse."""

    name = "test_reversed"

    def __init__(self) -> None:
        self.seen: list[Request] = []

    def _plan(self, request):
        self.seen.append(request)
        n, dp = request.num_sequences, request.dp_size
        positions = np.arange(n - 1, -1, -1, dtype=np.int64)
        cells = [positions[d::dp] for d in range(dp)]
        return Grid(np.concatenate(cells), np.array([c.shape[0] for c in cells]), dp), np.zeros(0, np.int64)


def test_a_grid_planner_gets_positions_of_the_sequences_left_and_the_base_maps_them_to_ids():
    scheduler = _Reversed()
    lengths = np.array([4, 40, 5, 6])  # sequence 1 is dropped: too long for 16 tokens
    plan = scheduler.schedule(lengths, dp_size=2, max_tokens_per_rank=16, on_oversize="drop", bytes_per_token=4)
    (seen,) = scheduler.seen
    assert seen.lengths.tolist() == [4, 5, 6] and seen.bytes_per_token == 4.0
    assert plan.dropped.tolist() == [1]
    assert [ids.tolist() for ids in plan.assignment[0]] == [[3, 0], [2]]
    plan.validate(lengths, dp_size=2, max_tokens_per_rank=16)


def test_the_old_keyword_plumbing_is_gone():
    scheduler = get_scheduler("balanced")
    for old in ("uses_sync", "uses_bytes_per_token", "_plan_options"):
        with pytest.raises(AttributeError):
            getattr(scheduler, old)
