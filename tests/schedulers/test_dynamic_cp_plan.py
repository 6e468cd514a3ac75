"""Schedule: every invariant of validate, the wire arrays, the fingerprint."""

import dataclasses

import numpy as np
import pytest
from dynamic_cp_reference import plan_dcp

from seqpack.cost import CostModel
from seqpack.errors import ScheduleError, SeqpackTypeError
from seqpack.schedulers import Schedule
from seqpack.schedulers.group_sizes import allowed_group_sizes
from seqpack.thd import group_pad_multiple, group_padded_lengths

LENGTHS = np.array([300, 90, 60, 40, 30, 20, 20, 10, 5], dtype=np.int64)


def a_plan(**kwargs: object) -> Schedule:
    cost = CostModel(1.0, 0.01, 2.0, ring_step=1.0, ring_token=0.1, ranks_per_node=2, reference_size=1)
    options = {"dp_size": 2, "cp_size": 2, "max_tokens_per_rank": 100, "pad_multiple": 2, "cost": cost} | kwargs
    return plan_dcp(LENGTHS, **options)  # type: ignore[arg-type]


def int64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_a_plan_holds_a_group_and_singles():
    plan = a_plan()
    plan.validate(LENGTHS, dp_size=2, cp_size=2, max_tokens_per_rank=100, pad_multiple=2)
    assert plan.num_ranks == 4 and plan.group_size.max() == 4  # 300 tokens need all 4 ranks
    group = plan.per_id(np.arange(plan.num_groups))
    assert plan.group_size[group[0]] == 4 and (group >= 0).all()
    assert plan.rank_group().shape == (plan.num_microbatches, 4)
    assert plan.group_tokens().max() <= 4 * 100
    assert list(plan.round_groups(0)) == [g for g in range(plan.num_groups) if plan.group_round[g] == 0]


def test_padding_rule():
    assert group_pad_multiple(1, 8) == 8 and group_pad_multiple(4, 8) == 64
    assert group_padded_lengths(np.array([1, 64, 65]), 4, 8).tolist() == [64, 64, 128]
    assert group_padded_lengths(np.array([5, 5]), np.array([1, 2]), 2).tolist() == [6, 8]
    assert allowed_group_sizes(12, "pow2").tolist() == [1, 2, 4, 8, 12]
    assert allowed_group_sizes(3, "any").tolist() == [1, 2, 3]


def test_wire_round_trip_and_fingerprint():
    plan = a_plan()
    arrays = plan.to_arrays()
    assert all(a.dtype == np.int64 for a in arrays.values())
    back = Schedule.from_arrays(arrays)
    back.validate(LENGTHS)
    assert back.fingerprint() == plan.fingerprint()
    for name in ("limits", *Schedule.ARRAY_FIELDS):
        assert np.array_equal(back.to_arrays()[name], arrays[name])
    any_size = Schedule.from_arrays(a_plan(group_sizes="any").to_arrays())
    assert any_size.group_sizes == "any"
    moved = dataclasses.replace(plan, assigned=plan.assigned[::-1].copy())
    assert moved.fingerprint() != plan.fingerprint()


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda a: a.pop("deferred"), "missing"),
        (lambda a: a.update(limits=a["limits"][:5]), "must hold 6 values"),
        (lambda a: a.update(limits=np.concatenate([a["limits"][:5], [7]])), "group_sizes code 7"),
        (lambda a: a.update(group_start=a["group_start"][:-1]), "entries for"),
        (lambda a: a.update(assigned=a["assigned"][:-1]), "sum to"),
        (lambda a: a.update(lengths=np.array([1.5])), "must be integers"),
    ],
)
def test_from_arrays_refuses(change, text):
    arrays = a_plan().to_arrays()
    change(arrays)
    with pytest.raises(ScheduleError, match=text):
        Schedule.from_arrays(arrays)


def test_from_arrays_needs_a_mapping():
    with pytest.raises(SeqpackTypeError):
        Schedule.from_arrays([1, 2])  # type: ignore[arg-type]


def hand_plan(**fields: object) -> Schedule:
    """Round 0: ranks 0-3 one group of 4 holding id 0; round 1: four singles (ids 1, 2, -, 3)."""
    base = {
        "num_microbatches": 2,
        "group_round": int64([0, 1, 1, 1, 1]),
        "group_start": int64([0, 0, 1, 2, 3]),
        "group_size": int64([4, 1, 1, 1, 1]),
        "group_counts": int64([1, 1, 1, 0, 1]),
        "assigned": int64([0, 1, 2, 3]),
        "lengths": int64([300, 50, 40, 30]),
        "original_lengths": int64([300, 50, 40, 30]),
        "dp_size": 2,
        "cp_size": 2,
        "max_tokens_per_rank": 100,
        "pad_multiple": 2,
        "group_sizes": "pow2",
    }
    return Schedule(**(base | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({}, None),
        ({"dp_size": 1, "cp_size": 4}, "expected 2"),
        ({"group_start": int64([0, 0, 2, 2, 3])}, "starts at rank 2, expected 1"),
        ({"group_size": int64([4, 1, 1, 1, 2])}, "end at rank 5, not at R=4"),
        ({"group_round": int64([0, 1, 1, 1, 3]), "num_microbatches": 4}, "round 2 has no groups"),
        ({"group_size": int64([3, 1, 1, 1, 1]), "group_start": int64([0, 0, 1, 2, 3])}, "end at rank 3"),
        ({"assigned": int64([0, 1, 2, 2])}, "sample 2 appears 2 times"),
        ({"assigned": int64([0, 1, 2, 9])}, "outside 0..3"),
        ({"lengths": int64([300, 50, 40, 20])}, "neither truncated nor dropped"),
        ({"lengths": int64([401, 50, 40, 30]), "original_lengths": int64([401, 50, 40, 30])}, "416 padded tokens"),
        ({"group_counts": int64([1, 1, 1, 1, 0])}, None),
        ({"group_counts": int64([1, 1, 1, 0, 0]), "assigned": int64([0, 1, 2])}, "sample 3 appears nowhere"),
        ({"group_counts": int64([1, 1, 1, 0])}, "holds 4 entries for 5 groups"),
        ({"assigned": np.array([0, 1, 2, 3], dtype=np.int32)}, "1-D int64"),
    ],
)
def test_validate_names_the_broken_invariant(fields, text):
    plan = hand_plan(**fields)
    if text is None:
        plan.validate()
        return
    with pytest.raises(ScheduleError, match=text):
        plan.validate(dp_size=2, cp_size=2)


def test_validate_alignment_under_pow2_only():
    """Round 0 as a group of 2 at rank 1 (misaligned) plus singles: refused under pow2,
    fine under any."""
    fields = {
        "group_round": int64([0, 0, 0, 1, 1, 1, 1]),
        "group_start": int64([0, 1, 3, 0, 1, 2, 3]),
        "group_size": int64([1, 2, 1, 1, 1, 1, 1]),
        "group_counts": int64([0, 1, 0, 1, 1, 0, 1]),
        "lengths": int64([150, 50, 40, 30]),
        "original_lengths": int64([150, 50, 40, 30]),
    }
    with pytest.raises(ScheduleError, match="not an aligned power-of-2 block"):
        hand_plan(**fields).validate()
    hand_plan(group_sizes="any", **fields).validate()


def test_validate_checks_lengths_given():
    with pytest.raises(ScheduleError, match="different lengths"):
        hand_plan().validate([1, 2, 3, 4])
