"""64-bit edges and absurd sizes: every scheduler refuses them with a clear error naming the
value (never a negative "length", a wrapped sum, a kernel OverflowError or a MemoryError),
and stats stay exact Python ints past int64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cost import ModelSpec, model_preset
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.options import INT64_MAX, MAX_TOKENS
from seqpack.schedulers import available_schedulers, get_scheduler
from seqpack.schedulers.objective import exact_sum
from seqpack.schedulers.request import as_lengths
from seqpack.stats import StepStats
from seqpack.thd import padded_lengths
from seqpack.validation import check_fits_memory, memory_limit

SCHEDULERS = sorted(available_schedulers())


@pytest.mark.parametrize(
    "lengths, match",
    [
        ([2**63], r"sample 0 has length 9223372036854775808, too large \(at most 2\*\*63 - 1\)"),
        ([5, 2**70], r"sample 1 has length 1180591620717411303424, too large"),
        (np.array([3, 2**63 + 5], dtype=np.uint64), r"sample 1 has length 9223372036854775813, too large"),
        (np.array([1e30]), r"sample 0 has length 1000000000000000019884624838656, too large"),
    ],
)
def test_lengths_past_int64_are_named_not_wrapped_negative(lengths, match):
    with pytest.raises(SampleError, match=match):
        as_lengths(lengths)


@pytest.mark.parametrize(
    "lengths, match",
    [
        (None, "lengths must be a 1-D sequence of integers, got NoneType"),
        ([1, "a"], "lengths must be integers"),
        ([1, 2.5], "lengths must be integers, got dtype float64"),
        ([[1, 2], [3]], "lengths must be a 1-D sequence of integers, got list"),
        ([True, False], "lengths must be integers, got dtype bool"),
    ],
)
def test_lengths_of_the_wrong_type(lengths, match):
    with pytest.raises(SeqpackTypeError, match=match):
        as_lengths(lengths)


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("max_tokens, cp", [(MAX_TOKENS + 1, 1), (2**62, 4), (2**64, 1), (2**52, 4)])
def test_a_capacity_past_2_53_is_too_large_not_a_kernel_overflow(name, max_tokens, cp):
    with pytest.raises(ConfigError, match=rf"max_tokens_per_rank={max_tokens} x cp_size={cp} = \d+ .* too large"):
        get_scheduler(name).schedule([5, 6], dp_size=1, cp_size=cp, max_tokens_per_rank=max_tokens)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_at_the_largest_capacity_everything_stays_exact(name):
    lengths = np.array([MAX_TOKENS] * 600 + [3, MAX_TOKENS - 1], dtype=np.int64)
    schedule = get_scheduler(name).schedule(lengths, dp_size=4, max_tokens_per_rank=MAX_TOKENS // 2, cp_size=2)
    schedule.validate(lengths)
    stats = StepStats.from_schedule(schedule)
    total = sum(lengths.tolist())
    assert total > 2**62  # not vacuous: the step's sum is near int64's end
    assert stats.seqlen_sum == stats.real_tokens == total
    assert stats.seqlen_sq_sum == sum(v * v for v in lengths.tolist())


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_step_whose_tokens_do_not_fit_int64_is_refused(name):
    lengths = [MAX_TOKENS] * 1025  # 1025 * 2**53 > 2**63
    with pytest.raises(ScheduleError, match=r"the step's 1025 sequences hold \d+ padded tokens, too many"):
        get_scheduler(name).schedule(lengths, dp_size=2, max_tokens_per_rank=MAX_TOKENS)


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_a_length_near_int64_max_is_oversize_not_wrapped(name, pad_multiple):
    lengths = [INT64_MAX, 7]
    with pytest.raises(ScheduleError, match=rf"sample 0 has {INT64_MAX} tokens"):
        get_scheduler(name).schedule(lengths, dp_size=1, max_tokens_per_rank=64, pad_multiple=pad_multiple)
    for policy in ("truncate", "drop"):
        schedule = get_scheduler(name).schedule(
            lengths, dp_size=1, max_tokens_per_rank=64, pad_multiple=pad_multiple, on_oversize=policy
        )
        schedule.validate(lengths)
        stats = StepStats.from_schedule(schedule)
        if policy == "truncate":
            assert schedule.lengths[0] == 64 and stats.truncated_tokens == INT64_MAX - 64
        else:
            assert stats.dropped_tokens == INT64_MAX and stats.dropped_sequences == 1


@pytest.mark.parametrize("name", SCHEDULERS)
def test_dropped_and_truncated_token_counts_past_int64_are_exact(name):
    lengths = [2**62, 2**62, 2**62, 5]
    for policy, field in (("truncate", "truncated_tokens"), ("drop", "dropped_tokens")):
        schedule = get_scheduler(name).schedule(lengths, dp_size=2, max_tokens_per_rank=8, on_oversize=policy)
        got = getattr(StepStats.from_schedule(schedule), field)
        assert got == 3 * 2**62 - (3 * 8 if policy == "truncate" else 0)
        assert got > INT64_MAX  # not vacuous: numpy's int64 sum would have wrapped


@pytest.mark.parametrize("name", SCHEDULERS)
def test_more_replicas_than_memory_holds_are_refused_before_allocating(name):
    with pytest.raises(ConfigError, match=r"dp_size=10000000000000 for 3 samples is too large: it needs at least"):
        get_scheduler(name).schedule([5, 5, 5], dp_size=10**13, max_tokens_per_rank=10)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_model_spec_as_cost_is_a_type_error_with_the_hint(name):
    spec = model_preset("llama3-8b")
    assert isinstance(spec, ModelSpec)
    with pytest.raises(SeqpackTypeError, match=r"cost must be a seqpack.CostModel or None, got ModelSpec \(ModelSpec"):
        get_scheduler(name).schedule([5], dp_size=1, max_tokens_per_rank=10, cost=spec)
    with pytest.raises(TypeError, match="got str"):
        get_scheduler(name).schedule([5], dp_size=1, max_tokens_per_rank=10, cost="flops")


@pytest.mark.parametrize("name", SCHEDULERS)
def test_fractional_origin_is_refused_not_truncated(name):
    with pytest.raises(SeqpackTypeError, match="origin must be integers, got dtype float64"):
        get_scheduler(name).schedule([5, 5], dp_size=2, max_tokens_per_rank=10, origin=[0.5, 1])
    schedule = get_scheduler(name).schedule([5, 5], dp_size=2, max_tokens_per_rank=10, origin=np.array([1.0, 0.0]))
    schedule.validate()


def test_padded_lengths_refuses_what_would_wrap():
    assert padded_lengths(np.array([INT64_MAX - 7], dtype=np.int64), 8).tolist() == [INT64_MAX - 7]
    with pytest.raises(SampleError, match=rf"length {INT64_MAX} padded to pad_multiple=8 is too large"):
        padded_lengths([INT64_MAX], 8)
    with pytest.raises(SampleError, match="lengths must be >= 0, got -1"):
        padded_lengths([3, -1], 2)
    with pytest.raises(SeqpackTypeError, match="lengths must be integers, got dtype float64"):
        padded_lengths([2.5], 2)
    with pytest.raises(SampleError, match=f"length at 0 is {2**64}, too large"):
        padded_lengths([2**64], 1)


@given(st.lists(st.integers(0, INT64_MAX), max_size=40), st.booleans())
@pytest.mark.slow
def test_exact_sum_matches_python(values, squares):
    arr = np.array(values, dtype=np.int64)
    expected = sum(v * v for v in values) if squares else sum(values)
    assert exact_sum(arr, squares=squares) == expected


def test_exact_sum_takes_both_paths():
    small = np.arange(10, dtype=np.int64)
    big = np.full(4, 2**62, dtype=np.int64)
    assert exact_sum(small) == 45 and exact_sum(small, squares=True) == 285
    assert exact_sum(big) == 2**64 and exact_sum(big, squares=True) == 4 * 2**124


def test_check_fits_memory_names_the_request():
    check_fits_memory("a small thing", 1 << 20)  # never refused, never asks the system
    limit = memory_limit()
    assert limit is not None and limit > 1 << 28  # this suite runs where memory is known
    with pytest.raises(ConfigError, match=r"n=7 things is too large: it needs at least [\d,.]+ GiB of memory"):
        check_fits_memory("n=7 things", limit + 1)
