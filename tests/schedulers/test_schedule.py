"""The one plan type: ScheduleLimits, static plans as groups, one predicted_step_time for
static and dynamic plans and its refusal of a schedule built for other lengths, and the one
int64 coercer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from dynamic_cp_reference import plan_dcp

from seqpack.cost import CostModel
from seqpack.errors import SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import GroupSizes
from seqpack.schedulers import Schedule, ScheduleLimits, get_scheduler, predicted_step_time
from seqpack.validation import int64_array


def _schedule() -> Schedule:
    return get_scheduler("balanced").schedule([5, 3, 8, 2, 7, 1], dp_size=2, max_tokens_per_rank=10)


def test_limits_round_trip_and_name_their_fields():
    s = _schedule()
    limits = s.limits
    assert limits == ScheduleLimits(s.num_microbatches, 2, 1, 10, 1, GroupSizes.STATIC)
    assert ScheduleLimits.from_array(limits.to_array()) == limits
    assert s.to_arrays()["limits"].tolist() == [s.num_microbatches, 2, 1, 10, 1, 0]
    with pytest.raises(ScheduleError, match=r"must hold 6 values \(num_microbatches, dp_size, cp_size"):
        ScheduleLimits.from_array(np.array([1, 2, 3], dtype=np.int64))
    with pytest.raises(ScheduleError, match="group_sizes code 7 is not one of 0..2"):
        ScheduleLimits.from_array(np.array([1, 2, 1, 10, 1, 7], dtype=np.int64))


def test_a_static_plan_is_groups_on_the_replicas_blocks():
    s = get_scheduler("balanced").schedule([5, 3, 8, 2, 7, 1, 9], dp_size=2, cp_size=2, max_tokens_per_rank=10)
    m, dp = s.num_microbatches, 2
    assert s.is_static and s.num_groups == m * dp
    assert s.group_round.tolist() == [g // dp for g in range(m * dp)]
    assert s.group_start.tolist() == [(g % dp) * 2 for g in range(m * dp)]
    assert s.group_size.tolist() == [2] * (m * dp)
    assert [s.group_ids(g).tolist() for g in range(m * dp)] == [ids.tolist() for row in s.assignment for ids in row]
    again = Schedule.from_arrays(s.to_arrays())
    assert again.fingerprint() == s.fingerprint() and again.is_static
    bad = dataclasses.replace(s, group_size=np.full(m * dp, 1, dtype=np.int64), group_start=s.group_start // 2)
    with pytest.raises(ScheduleError):
        bad.validate()


@pytest.mark.parametrize(
    "value, kwargs, error, match",
    [
        ([1, 2.5], {"integral_floats": True}, SeqpackTypeError, "x must be integers, got dtype float64"),
        ([1.0, 2.0], {}, SeqpackTypeError, "x must be integers, got dtype float64"),
        ([True], {}, SeqpackTypeError, "x must be integers, got dtype bool"),
        ([1, "a"], {}, SeqpackTypeError, "x must be integers"),
        ([[1, 2], [3]], {}, SeqpackTypeError, "x must be integers"),
        ([1, 2**64], {"too_large": SampleError}, SampleError, r"x element 1 is 18446744073709551616, too large"),
        (np.array([2**63], dtype=np.uint64), {}, SeqpackTypeError, "x element 0 is 9223372036854775808, too large"),
        ([1.0, 2.0**70], {"integral_floats": True}, SeqpackTypeError, "x element 1 is 1180591620717411303424"),
    ],
)
def test_int64_array_refuses_what_is_not_an_int64(value, kwargs, error, match):
    with pytest.raises(error, match=match):
        int64_array("x", value, **kwargs)


def test_int64_array_keeps_values_and_shape():
    assert int64_array("x", [[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert int64_array("x", [3.0, 4.0], integral_floats=True).tolist() == [3, 4]
    assert int64_array("x", [2**63 - 1]).tolist() == [2**63 - 1]
    assert int64_array("x", []).dtype == np.int64
    source = np.array([1, 2], dtype=np.int64)
    assert int64_array("x", source) is not source  # a new array


def test_predicted_step_time_refuses_a_schedule_of_other_lengths():
    s = _schedule()
    cost = CostModel(1.0, 0.0, 0.0)
    assert predicted_step_time(s, cost) > 0
    shorter = dataclasses.replace(s, lengths=s.lengths[:3], original_lengths=s.original_lengths[:3], origin=None)
    with pytest.raises(ScheduleError, match="assigns sample ids up to 5 but holds 3 lengths"):
        predicted_step_time(shorter, cost)


def test_one_predicted_step_time_for_static_and_dynamic_plans():
    cost = CostModel(1e-6, 1e-12, 1e-4, ring_step=1e-4, ring_token=1e-8, reference_size=1)
    plan = plan_dcp([9000, 300, 200, 100], dp_size=2, cp_size=2, max_tokens_per_rank=4096, cost=cost)
    assert isinstance(plan, Schedule) and plan.group_sizes == GroupSizes.POW2
    assert predicted_step_time(plan, cost) > 0
    with pytest.raises(SeqpackTypeError, match="cost must be a seqpack.CostModel, got str"):
        predicted_step_time(plan, "flops")
    # A plain CostModel is a microbatch's cost on the static group: a static plan's time is
    # its microbatches' costs, and the same model with its reference size given agrees.
    s = _schedule()
    model = CostModel(1.0, 0.01, 2.0)
    rounds = [max(model.microbatch_cost(s.lengths[ids]) for ids in row) for row in s.assignment]
    assert predicted_step_time(s, model) == pytest.approx(sum(rounds), rel=1e-12)
    assert predicted_step_time(s, dataclasses.replace(model, reference_size=1)) == predicted_step_time(s, model)


def test_a_flat_grid_is_the_same_schedule_as_its_rows():
    from seqpack.schedulers.schedule import Grid

    grid = Grid(np.array([4, 0, 2, 5, 1, 3]), np.array([2, 0, 1, 3]), dp_size=2)
    assert len(grid) == 2
    assert [[c.tolist() for c in row] for row in grid] == [[[4, 0], []], [[2], [5, 1, 3]]]
    assert [[c.tolist() for c in row] for row in grid[-1:]] == [[[2], [5, 1, 3]]]
    with pytest.raises(IndexError):
        grid[2]
    keywords = dict(
        lengths=np.arange(1, 7), original_lengths=np.arange(1, 7), dp_size=2, cp_size=1, max_tokens_per_rank=16,
        pad_multiple=1,
    )  # fmt: skip
    flat = Schedule.from_assignment(grid, **keywords)
    rows = Schedule.from_assignment([[list(c) for c in row] for row in grid], **keywords)
    assert flat.fingerprint() == rows.fingerprint() and flat.group_counts.tolist() == [2, 0, 1, 3]
    flat.validate(np.arange(1, 7))
    with pytest.raises(ScheduleError, match="does not hold 6 ids in rows of dp_size=4"):
        Grid(np.arange(6), np.array([2, 0, 1, 3, 0, 0]), dp_size=4)
    with pytest.raises(ScheduleError, match="microbatch 0 has 2 replicas, expected dp_size=3"):
        Schedule.from_assignment(grid, **dict(keywords, dp_size=3))


def test_balanced_hands_its_plan_over_flat():
    from seqpack.schedulers.balanced.scheduler import BalancedScheduler
    from seqpack.schedulers.schedule import Grid

    ids = np.arange(40, dtype=np.int64)
    lengths = (np.arange(40) * 37 % 900 + 50).astype(np.int64)
    from seqpack.schedulers.request import Request

    request = Request.of(lengths, dp_size=4, max_tokens_per_rank=2048, origin=ids % 4)
    rounds, _ = BalancedScheduler()._plan(request)
    assert isinstance(rounds, Grid)
    assert sorted(np.concatenate([c for row in rounds for c in row]).tolist()) == ids.tolist()


def test_the_fingerprint_is_hashed_once_per_schedule():
    import pickle
    from unittest import mock

    from seqpack.schedulers import schedule as schedule_module

    s = _schedule()
    with mock.patch.object(schedule_module, "_digest", wraps=schedule_module._digest) as digest:
        assert s.fingerprint() == s.fingerprint() == 792207500722211044  # the value cad467f hashed
        assert digest.call_count == 1
        back = pickle.loads(pickle.dumps(s))  # a pickled schedule carries it
        assert back.fingerprint() == s.fingerprint() and digest.call_count == 1
        lengths = s.lengths.copy()
        lengths[0] -= 1
        other = dataclasses.replace(s, lengths=lengths)  # a new schedule is hashed anew
        assert other.fingerprint() != s.fingerprint() and digest.call_count == 2
    assert Schedule.from_arrays(back.to_arrays()).fingerprint() == s.fingerprint()
