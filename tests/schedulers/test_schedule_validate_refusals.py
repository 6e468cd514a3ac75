"""Schedule.validate's refusals that the schedulers never trigger (a plan corrupted on the wire
or built by hand): each names the broken invariant and where it broke, a static plan's cell as
``assignment[m][d]`` / ``microbatch m of replica d``; the plan before corruption validates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seqpack.errors import ScheduleError
from seqpack.schedulers.schedule import Schedule
from seqpack.thd import StaticShapes


def int64(values):
    return np.array(values, dtype=np.int64)


def static_plan(cp_size=1, max_tokens_per_rank=100):
    """dp=2: microbatch 0 holds ids [0, 1] and [2], microbatch 1 holds [3] and nothing."""
    lengths = int64([60, 30, 50, 20])
    return Schedule.from_assignment(
        [[[0, 1], [2]], [[3], []]], lengths=lengths, original_lengths=lengths.copy(), dp_size=2, cp_size=cp_size,
        max_tokens_per_rank=max_tokens_per_rank, pad_multiple=1,
    )  # fmt: skip


def dynamic_plan(**fields):
    """R=4 ranks: round 0 one group of 4 holding id 0; round 1 four singles (ids 1, 2, -, 3)."""
    base = dict(
        num_microbatches=2, group_round=int64([0, 1, 1, 1, 1]), group_start=int64([0, 0, 1, 2, 3]),
        group_size=int64([4, 1, 1, 1, 1]), group_counts=int64([1, 1, 1, 0, 1]), assigned=int64([0, 1, 2, 3]),
        lengths=int64([300, 50, 40, 30]), original_lengths=int64([300, 50, 40, 30]), dp_size=2, cp_size=2,
        max_tokens_per_rank=100, pad_multiple=2, group_sizes="any",
    )  # fmt: skip
    return Schedule(**(base | fields))


def test_the_plans_before_corruption_are_valid():
    static_plan().validate(dp_size=2, cp_size=1)
    static_plan(cp_size=2).validate()
    dynamic_plan().validate(dp_size=2, cp_size=2)


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"dp_size": 0}, r"schedule has dp_size=0; it must be a positive int"),
        ({"max_tokens_per_rank": 1.5}, r"schedule has max_tokens_per_rank=1.5; it must be a positive int"),
        ({"num_microbatches": -1}, r"num_microbatches=-1 is negative"),
        ({"group_counts": int64([3, -1, 1, 0])}, r"group_counts holds a negative count"),
        ({"lengths": int64([60, 30, 50])}, r"schedule lengths and original lengths differ in shape"),
        ({"assigned": int64([0, 1, 7, 3])}, r"assignment\[0\]\[1\] holds an id outside 0\.\.3"),
        ({"origin": int64([0, 1])}, r"origin must hold one DP rank per sample \(4\)"),
        ({"origin": int64([0, 0, 1, 2])}, r"origin of sample 3 is DP rank 2, outside 0\.\.1"),
        ({"origin": int64([0, -1, 1, 1])}, r"origin of sample 1 is DP rank -1"),
        ({"lengths": int64([61, 30, 50, 20])}, r"a scheduled length exceeds its original length or is negative"),
        ({"lengths": int64([60, -1, 50, 20])}, r"a scheduled length exceeds its original length or is negative"),
        ({"lengths": int64([60, 30, 0, 20]), "truncated": int64([2])}, r"sample 2 is assigned with length 0"),
        ({"group_counts": int64([2, 1, 0, 0]), "assigned": int64([0, 1, 2]), "dropped": int64([3])},
         r"a dropped sample keeps a non-zero length"),
    ],
)  # fmt: skip
def test_a_corrupted_static_plan_is_refused_naming_what_broke(fields, text):
    plan = dataclasses.replace(static_plan(), **fields)
    with pytest.raises(ScheduleError, match=text):
        plan.validate()


def test_a_dropped_sample_at_length_0_is_valid():
    lengths = int64([60, 30, 50, 0])
    plan = dataclasses.replace(static_plan(), group_counts=int64([2, 1, 0, 0]), assigned=int64([0, 1, 2]),
                               dropped=int64([3]), lengths=lengths)  # fmt: skip
    plan.validate()


def test_a_static_cell_over_capacity_is_named_by_microbatch_and_replica():
    with pytest.raises(
        ScheduleError,
        match=r"microbatch 0 of replica 0 holds 90 padded tokens > capacity 80 \(max_tokens_per_rank=80 x",
    ):
        static_plan(max_tokens_per_rank=80).validate()
    with pytest.raises(ScheduleError, match=r"capacity 80 \(max_tokens_per_rank=40 x cp_size=2\)"):
        static_plan(cp_size=2, max_tokens_per_rank=40).validate()
    static_plan(max_tokens_per_rank=90).validate()  # exactly full


def test_a_static_plan_whose_groups_are_not_the_replicas_cp_blocks_is_refused():
    plan = static_plan(cp_size=2)  # R=4: round 0 groups [0, 2) and [2, 4)
    odd = dataclasses.replace(plan, group_start=int64([0, 1, 0, 2]), group_size=int64([1, 3, 2, 2]))
    with pytest.raises(ScheduleError, match=r"group 0 of round 0 has 1 ranks: .*CP blocks of cp_size=2"):
        odd.validate()


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"group_size": int64([4, 1, 1, 1, 0]), "group_start": int64([0, 0, 1, 2, 3])}, r"group 4 has size 0"),
        ({"group_round": int64([1, 0, 0, 0, 0])}, r"group rounds must be sorted and within 0\.\.1"),
        ({"group_round": int64([0, 1, 1, 1, 2])}, r"group rounds must be sorted and within 0\.\.1"),
        ({"group_round": int64([-1, 1, 1, 1, 1])}, r"group rounds must be sorted and within 0\.\.1"),
        ({"assigned": int64([0, 1, 2, -3])}, r"group 4 of round 1 holds an id outside 0\.\.3"),
    ],
)  # fmt: skip
def test_a_corrupted_dynamic_plan_is_refused_naming_the_group(fields, text):
    with pytest.raises(ScheduleError, match=text):
        dynamic_plan(**fields).validate()


def test_static_shapes_are_refused_on_a_dynamic_plan_and_hold_on_a_static_one():
    shapes = StaticShapes(max_sequences=3)
    with pytest.raises(
        ScheduleError, match=r"static_shapes holds for static-CP schedules only; this one is dynamic CP"
    ):
        dynamic_plan().validate(static_shapes=shapes)
    static_plan().validate(static_shapes=shapes)
    with pytest.raises(ScheduleError, match=r"microbatch 0 of replica 0 holds 2 sequences > 1"):
        static_plan().validate(static_shapes=StaticShapes(max_sequences=2))
