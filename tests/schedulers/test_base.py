import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqpack.schedulers import Schedule, available_schedulers, get_scheduler
from seqpack.schedulers.request import Request, as_lengths, default_origin
from seqpack.stats import StepStats


def test_registry():
    assert "empty" in available_schedulers()
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        get_scheduler("nope")


def test_empty_keeps_samples_on_their_rank_in_order():
    lengths = np.array([5, 5, 5, 2, 9, 1, 1, 1])
    s = get_scheduler("empty").schedule(lengths, dp_size=2, max_tokens_per_rank=10)
    s.validate(lengths, dp_size=2, max_tokens_per_rank=10)
    # Rank 0 holds ids 0..3 -> [0,1] [2,3]; rank 1 holds 4..7 -> [4,5] [6,7].
    assert [[ids.tolist() for ids in row] for row in s.assignment] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    replica, micro, slot = s.placement()
    assert replica.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert micro.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert slot.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]


def test_empty_uneven_replicas_get_empty_microbatches():
    lengths = np.array([10, 10, 10, 10, 1, 1])
    s = get_scheduler("empty").schedule(lengths, dp_size=2, max_tokens_per_rank=10)
    s.validate()
    assert s.num_microbatches == 3
    assert [ids.tolist() for ids in s.assignment[1]] == [[1], [4, 5]]
    assert s.assignment[2][1].size == 0


def test_oversize_policies():
    lengths = np.array([3, 50, 7])
    with pytest.raises(ValueError, match=r"sample 1 has 50 tokens, .*capacity 16"):
        get_scheduler("empty").schedule(lengths, dp_size=1, cp_size=2, max_tokens_per_rank=8, pad_multiple=4)
    s = get_scheduler("empty").schedule(
        lengths, dp_size=1, cp_size=2, max_tokens_per_rank=8, pad_multiple=4, on_oversize="drop"
    )
    s.validate()
    assert s.dropped.tolist() == [1] and s.lengths.tolist() == [3, 0, 7]
    stats = StepStats.from_schedule(s)
    assert stats.dropped_sequences == 1 and stats.dropped_tokens == 50 and stats.num_sequences == 2
    t = get_scheduler("empty").schedule(
        lengths, dp_size=1, cp_size=2, max_tokens_per_rank=8, pad_multiple=4, on_oversize="truncate"
    )
    t.validate()
    assert t.truncated.tolist() == [1] and t.lengths.tolist() == [3, 16, 7]
    stats = StepStats.from_schedule(t)
    assert stats.truncated_sequences == 1 and stats.truncated_tokens == 34
    assert stats.seqlen_sum == 26 and stats.seqlen_sq_sum == 9 + 256 + 49
    with pytest.raises(ValueError, match="on_oversize must be one of"):
        Request.of(lengths, dp_size=1, max_tokens_per_rank=16, on_oversize="ignore")


@pytest.mark.parametrize(
    "lengths, error, match",
    [
        ([[1, 2]], ValueError, "1-D"),
        ([1.5, 2], TypeError, "integers"),
        ([3, 0, 2], ValueError, "sample 1 has length 0"),
        (["a"], TypeError, "integers"),
    ],
)
def test_as_lengths_rejects(lengths, error, match):
    with pytest.raises(error, match=match):
        as_lengths(lengths)


def test_schedule_argument_errors():
    sched = get_scheduler("empty")
    with pytest.raises(ValueError, match="dp_size must be a positive integer, got 0"):
        sched.schedule([1, 2], dp_size=0, max_tokens_per_rank=4)
    # The bad rank and the valid range are named (not the array's shape).
    with pytest.raises(ValueError, match=r"origin of sample 1 is DP rank 2, outside 0\.\.1"):
        sched.schedule([1, 2], dp_size=2, max_tokens_per_rank=4, origin=[0, 2])
    with pytest.raises(ValueError, match=r"origin must hold one DP rank per sample \(2\), got shape \(3,\)"):
        sched.schedule([1, 2], dp_size=2, max_tokens_per_rank=4, origin=[0, 1, 1])


def _bad(schedule: Schedule, assignment, dp_size=None) -> Schedule:
    """``schedule``'s fields with another grid (unchecked: validate judges it)."""
    return Schedule.from_assignment(
        assignment,
        lengths=schedule.lengths,
        original_lengths=schedule.original_lengths,
        dp_size=schedule.dp_size if dp_size is None else dp_size,
        cp_size=schedule.cp_size,
        max_tokens_per_rank=schedule.max_tokens_per_rank,
        pad_multiple=schedule.pad_multiple,
    )


def test_validate_catches_violations():
    lengths = np.array([4, 4, 4, 4])
    s = get_scheduler("empty").schedule(lengths, dp_size=2, max_tokens_per_rank=8)
    s.validate()
    dup = [[np.array([0, 1]), np.array([1, 3])]]
    with pytest.raises(ValueError, match="sample 1 appears 2 times"):
        _bad(s, dup).validate()
    missing = [[np.array([0, 1]), np.array([3])]]
    with pytest.raises(ValueError, match="sample 2 appears nowhere"):
        _bad(s, missing).validate()
    over = [[np.array([0, 1, 2]), np.array([3])]]
    with pytest.raises(ValueError, match="microbatch 0 of replica 0 holds 12 padded tokens > capacity 8"):
        _bad(s, over).validate()
    with pytest.raises(ValueError, match="round 1 has no groups"):
        dataclasses.replace(s, num_microbatches=3).validate()
    with pytest.raises(ValueError, match="microbatch 0 has 1 replicas, expected dp_size=2"):
        _bad(s, [[np.array([0, 1, 2, 3])]])
    with pytest.raises(ValueError, match="different lengths"):
        s.validate([4, 4, 4, 5])
    with pytest.raises(ValueError, match="max_tokens_per_rank=8, expected 16"):
        s.validate(max_tokens_per_rank=16)


@given(
    lengths=st.lists(st.integers(1, 64), min_size=0, max_size=60),
    dp=st.integers(1, 6),
    cp=st.sampled_from([1, 2]),
    cap=st.integers(16, 96),
)
@pytest.mark.slow
def test_empty_scheduler_invariants(lengths, dp, cp, cap):
    pm = 2 * cp if cp > 1 else 1
    s = get_scheduler("empty").schedule(
        lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=cap, pad_multiple=pm, on_oversize="truncate"
    )
    s.validate(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=cap, pad_multiple=pm)
    replica, _, _ = s.placement()
    origin = default_origin(len(lengths), dp)
    assigned = replica >= 0
    assert np.array_equal(replica[assigned], origin[assigned])  # nothing moves
    assert (
        s.fingerprint()
        == get_scheduler("empty")
        .schedule(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=cap, pad_multiple=pm, on_oversize="truncate")
        .fingerprint()
    )


def test_stats_counts_exact_ints():
    lengths = np.array([100_000, 3, 70_000])
    s = get_scheduler("empty").schedule(lengths, dp_size=1, max_tokens_per_rank=200_000)
    stats = StepStats.from_schedule(s)
    assert stats.seqlen_sq_sum == 100_000**2 + 9 + 70_000**2
    assert isinstance(stats.seqlen_sq_sum, int)
    assert stats.real_tokens == stats.padded_tokens == 170_003 and stats.pad_fraction == 0.0
    assert stats.imbalance == 1.0 and stats.min_microbatches == 1
