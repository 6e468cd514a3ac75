"""seqpack.packing.pack_lengths and its kernel: against the slow reference, the invariants
(every sequence in one pack, no pack over max_tokens, never fewer packs than the token
bound), the quality target (the token bound or one more on lognormal, Pareto and bimodal
lengths) and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_tier import large, small
from packing_reference import pack_sizes_reference

from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackError, SeqpackTypeError
from seqpack.mock_data import generate_lengths
from seqpack.packing import _kernel as kernel
from seqpack.packing import pack_lengths

pytestmark = pytest.mark.kernels

# The workloads of benchmarks/packing.py: (distribution, parameters, max_tokens).
WORKLOADS = {
    "lognormal": ("lognormal", dict(min_seq_len=16, max_seq_len=8192, mean_seq_len=1000, sigma=1.1), 8192),
    "pareto": ("pareto", dict(min_seq_len=128, max_seq_len=32768, alpha=1.2), 32768),
    "bimodal": (
        "bimodal",
        dict(min_seq_len=64, max_seq_len=32768, short_mean=1024, long_mean=16384, long_fraction=0.25),
        32768,
    ),
}


def check_packing(packing, lengths, max_tokens):
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.shape[0]
    assert sorted(packing.order.tolist()) == list(range(n))  # every sequence exactly once
    assert packing.cu_packs[0] == 0 and packing.cu_packs[-1] == n
    for k in range(packing.num_packs):
        members = packing.pack(k)
        assert members.size > 0  # no empty pack
        assert (np.diff(members) > 0).all()  # ascending index within a pack
        assert (packing.pack_of[members] == k).all()
        assert int(lengths[members].sum()) == int(packing.tokens[k]) <= max_tokens
    bound = -(-int(lengths.sum()) // max_tokens)
    assert packing.token_bound == bound <= packing.num_packs


@settings(max_examples=300 if not small() else 60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=0, max_size=60),
    max_tokens=st.integers(64, 160),
)
@pytest.mark.slow
def test_kernel_equals_the_reference(lengths, max_tokens):
    for use_table in (True, False):
        pack_of, num_packs = kernel.pack_sizes(np.array(lengths, dtype=np.int64), max_tokens, use_table)
        assert pack_of.tolist() == pack_sizes_reference(lengths, max_tokens)
        assert num_packs == (max(pack_of.tolist()) + 1 if lengths else 0)


@settings(max_examples=150 if not small() else 40, deadline=None)
@given(data=st.data(), max_tokens=st.integers(1, 10**6))
@pytest.mark.slow
def test_invariants(data, max_tokens):
    lengths = data.draw(st.lists(st.integers(1, max_tokens), min_size=0, max_size=80))
    packing = pack_lengths(lengths, max_tokens)
    check_packing(packing, lengths, max_tokens)


def test_the_two_lookups_agree_at_scale():
    lengths = generate_lengths("lognormal", 3000 if small() else 50_000, seed=3, **WORKLOADS["lognormal"][1])
    a = kernel.pack_sizes(lengths, 8192, True)
    b = kernel.pack_sizes(lengths, 8192, False)
    assert a[1] == b[1] and np.array_equal(a[0], b[0])
    head = lengths[:2000]
    assert kernel.pack_sizes(head, 8192, True)[0].tolist() == pack_sizes_reference(head.tolist(), 8192)


def test_a_length_equal_to_max_tokens_and_halves():
    packing = pack_lengths([5, 10, 5, 3, 7, 10], 10)
    check_packing(packing, [5, 10, 5, 3, 7, 10], 10)
    assert packing.num_packs == 4  # 10 | 10 | 5 5 | 7 3
    assert sorted(packing.tokens.tolist()) == [10, 10, 10, 10]


def test_huge_max_tokens_uses_no_table():
    lengths = [2**40, 2**40, 3, 2**41 - 5]
    packing = pack_lengths(lengths, 2**41)
    check_packing(packing, lengths, 2**41)
    assert packing.num_packs == 2


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.slow
def test_the_token_bound_or_one_more_at_10k(name):
    dist, params, max_tokens = WORKLOADS[name]
    for seed in range(3):
        lengths = generate_lengths(dist, 2000 if small() else 10_000, seed=seed, **params)
        packing = pack_lengths(lengths, max_tokens)
        if not small():
            check_packing(packing, lengths, max_tokens)
        assert packing.num_packs <= packing.token_bound + 1, (name, seed)


@large
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_token_bound_or_one_more_at_1m(name):
    dist, params, max_tokens = WORKLOADS[name]
    lengths = generate_lengths(dist, 1_000_000, seed=0, **params)
    packing = pack_lengths(lengths, max_tokens)
    assert packing.num_packs <= packing.token_bound + 1
    assert np.bincount(packing.pack_of, lengths, packing.num_packs).max() <= max_tokens


def test_an_oversize_length_is_refused_by_name():
    with pytest.raises(ScheduleError, match=r"sequence 2 has 11 tokens > max_tokens=10"):
        pack_lengths([3, 4, 11, 2], 10)


@pytest.mark.parametrize(
    ("lengths", "max_tokens", "error", "match"),
    [
        ([3, 0, 2], 10, SampleError, r"sequence 1 has length 0: every sequence needs at least one token"),
        ([3, -4], 10, SampleError, r"sequence 1 has length -4"),
        ([1.5, 2], 10, SeqpackTypeError, r"lengths must be integers"),
        ([3, True], 10, SeqpackTypeError, r"lengths must be integers, got True \(sequence 1 has length not one\)"),
        ((np.True_, 3), 10, SeqpackTypeError, r"got np.True_ \(sequence 0 has length not one\)"),
        ([[1, 2]], 10, ConfigError, r"lengths must be 1-D .* got shape \(1, 2\)"),
        ([2**64], 10, SampleError, r"sequence 0 has length 18446744073709551616, too large"),
        ([1], 0, ConfigError, r"max_tokens"),
        ([1], 2**53 + 1, ConfigError, r"max_tokens"),
        ([1], 4.0, SeqpackTypeError, r"max_tokens"),
        ("abc", 10, SeqpackError, r"lengths"),
    ],
)
def test_refusals(lengths, max_tokens, error, match):
    with pytest.raises(error, match=match):
        pack_lengths(lengths, max_tokens)


def test_empty_input():
    packing = pack_lengths([], 10)
    assert packing.num_packs == 0 and packing.order.size == 0 and packing.token_bound == 0
