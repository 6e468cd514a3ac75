"""``balanced``'s microbatch order: ``"as_planned"`` keeps the planner's rounds in its own
order, ``"heavy_first"`` and ``"pipeline"`` permute those same rounds."""

from __future__ import annotations

import numpy as np
import pytest

from seqpack.schedulers import get_scheduler
from seqpack.schedulers.balanced import round_position
from seqpack.schedulers.request import Request
from seqpack.schedulers.sample_groups import schedule_groups


def test_round_position_as_planned_is_the_identity():
    load = np.array([[1.0, 0.5], [3.0, 2.0], [2.0, 2.5], [0.2, 0.1]])
    assert round_position(load, "as_planned").tolist() == [0, 1, 2, 3]
    assert round_position(load, "heavy_first").tolist() == [2, 0, 1, 3]  # not the identity here
    assert round_position(np.zeros((0, 2)), "as_planned").tolist() == []
    with pytest.raises(ValueError, match="order must be one of.*'as_planned'"):
        round_position(load, "planned")


def _rounds(schedule):
    return [tuple(tuple(cell.tolist()) for cell in row) for row in schedule.assignment]


def _peak(schedule, row) -> int:
    return max(int(schedule.lengths[np.asarray(cell, dtype=np.int64)].sum()) for cell in row)


@pytest.mark.parametrize("seed", range(4))
def test_other_orders_permute_the_as_planned_rounds(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 900, size=48)
    kw = dict(dp_size=4, max_tokens_per_rank=1024, origin=np.repeat(np.arange(4), 12))
    planned = get_scheduler("balanced", order="as_planned").schedule(lengths, **kw)
    rounds = _rounds(planned)
    assert len(rounds) > 2
    for order in ("heavy_first", "pipeline"):
        other = _rounds(get_scheduler("balanced", order=order).schedule(lengths, **kw))
        assert sorted(other) == sorted(rounds), order
    # heavy_first is the as-planned rounds sorted by round maximum, ties in planned order
    # (the token sum stands in for the cost here: the default cost rises with it).
    heavy = _rounds(get_scheduler("balanced", order="heavy_first").schedule(lengths, **kw))
    peaks = [_peak(planned, row) for row in rounds]
    assert [_peak(planned, row) for row in heavy] == sorted(peaks, reverse=True)


def test_as_planned_with_groups_keeps_groups_whole():
    lengths = np.array([30, 20, 50, 10, 20, 30, 5, 25])  # every group fits a microbatch
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    sched = schedule_groups(
        get_scheduler("balanced", order="as_planned"),
        Request.of(lengths, dp_size=2, max_tokens_per_rank=64),
        groups,
        np.ones(8, bool),
        together=True,
    )
    replica, micro, _ = sched.placement()
    for g in range(4):
        ids = np.flatnonzero(groups == g)
        assert len(set(replica[ids].tolist())) == 1 and len(set(micro[ids].tolist())) == 1
