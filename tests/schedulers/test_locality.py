"""Locality (seqpack/schedulers/locality.py) and the scale of the balanced plan."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_reference import deal_local_reference

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.mock_data import lognormal_lengths
from seqpack.schedulers import _kernels, get_scheduler
from seqpack.schedulers.balanced import plan_balanced, relabel_replicas
from seqpack.schedulers.base import default_origin
from seqpack.schedulers.locality import plan_local, step_time
from seqpack.stats import StepStats, microbatch_costs

COST = CostModel(24576.0, 1.0)  # issue 12's cost: 24576*s + s**2


def _sft(n, seed=0):
    return lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=seed)


def _wait(schedule, objective):
    costs = microbatch_costs(schedule, COST)
    return step_time(costs, 0.0, objective)


def test_the_16k_plan_is_valid_and_keeps_data_home():
    dp = 16_384
    lengths = _sft(4 * dp)
    s = get_scheduler("balanced").schedule(lengths, dp_size=dp, max_tokens_per_rank=16384, cost=COST)
    s.validate(lengths, dp_size=dp, max_tokens_per_rank=16384)  # every id once, capacity respected
    replica, _, _ = s.placement()
    assert np.array_equal(np.sort(np.concatenate([ids for row in s.assignment for ids in row])), np.arange(4 * dp))
    assert s.microbatch_tokens().max() <= 16384 and len(s.assignment[0]) == dp
    stats = StepStats.from_schedule(s, COST)
    off = get_scheduler("balanced", locality=False).schedule(lengths, dp_size=dp, max_tokens_per_rank=16384, cost=COST)
    assert stats.moved_fraction < StepStats.from_schedule(off, COST).moved_fraction
    assert stats.moved_tokens == int(lengths[replica != default_origin(4 * dp, dp)].sum())


@pytest.mark.parametrize("objective", ["both", "rounds", "replicas"])
@pytest.mark.parametrize("dp, per_replica", [(64, 64), (256, 16), (1024, 16)])
def test_locality_costs_at_most_the_tolerance_and_moves_less(objective, dp, per_replica):
    kept = 0
    for seed in range(3):
        lengths = _sft(dp * per_replica, seed)
        args = dict(dp_size=dp, max_tokens_per_rank=16384, cost=COST)
        on = get_scheduler("balanced", objective=objective).schedule(lengths, **args)
        off = get_scheduler("balanced", objective=objective, locality=False).schedule(lengths, **args)
        on.validate(lengths, dp_size=dp, max_tokens_per_rank=16384)
        assert on.num_microbatches == off.num_microbatches
        assert _wait(on, objective) <= _wait(off, objective) * (1 + 1e-3) * (1 + 1e-12)
        moved_on = StepStats.from_schedule(on, COST).moved_tokens
        moved_off = StepStats.from_schedule(off, COST).moved_tokens
        assert moved_on <= moved_off
        kept += moved_on < 0.7 * moved_off
    assert kept >= 1  # not vacuous: locality took effect on some of these steps


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=0, max_size=60),
    dp=st.integers(1, 6),
    capacity=st.integers(300, 700),
    objective=st.sampled_from(["both", "rounds", "replicas"]),
    seed=st.integers(0, 1000),
)
def test_locality_never_changes_which_sequences_a_step_holds(lengths, dp, capacity, objective, seed):
    lengths = np.array(lengths, dtype=np.int64)
    origin = np.sort(np.random.default_rng(seed).integers(0, dp, lengths.shape[0]))
    args = dict(dp_size=dp, max_tokens_per_rank=capacity, cost=CostModel(1.0, 0.01), origin=origin)
    on = get_scheduler("balanced", objective=objective).schedule(lengths, **args)
    off = get_scheduler("balanced", objective=objective, locality=False).schedule(lengths, **args)
    on.validate(lengths, dp_size=dp, max_tokens_per_rank=capacity)
    held_on = np.sort(np.concatenate([ids for row in on.assignment for ids in row] + [np.zeros(0, np.int64)]))
    held_off = np.sort(np.concatenate([ids for row in off.assignment for ids in row] + [np.zeros(0, np.int64)]))
    assert np.array_equal(held_on, held_off) and np.array_equal(held_on, np.arange(lengths.shape[0]))
    assert on.num_microbatches == off.num_microbatches
    assert np.array_equal(on.lengths, off.lengths) and np.array_equal(on.origin, origin)


def test_locality_off_is_the_renamed_balance_plan():
    lengths = _sft(640, 3)
    origin = default_origin(640, 16)
    s = get_scheduler("balanced", locality=False).schedule(lengths, dp_size=16, max_tokens_per_rank=16384, cost=COST)
    plan = plan_balanced(lengths, COST.cost(lengths), dp_size=16, capacity=16384, origin=origin)
    expected = relabel_replicas(plan.replica_of, origin, lengths, 16)
    assert np.array_equal(s.placement()[0], expected)


def test_plan_local_declines_what_it_cannot_improve():
    lengths = _sft(64)
    costs = COST.cost(lengths)
    ref = plan_balanced(lengths, costs, dp_size=1, capacity=16384)
    assert plan_local(lengths, costs, np.zeros(64, np.int64), ref, dp_size=1, capacity=16384) is None
    # Equal lengths read in rank order already stay home in the reference: nothing to gain.
    equal = np.full(256, 4096, dtype=np.int64)
    origin = default_origin(256, 8)
    ref = plan_balanced(equal, COST.cost(equal), dp_size=8, capacity=16384, origin=origin)
    assert plan_local(equal, COST.cost(equal), origin, ref, dp_size=8, capacity=16384) is None


def test_locality_options_are_checked():
    with pytest.raises(SeqpackTypeError, match="locality must be True or False, got 'yes'"):
        get_scheduler("balanced", locality="yes")
    with pytest.raises(ConfigError, match="locality_tolerance must be >= 0.0, got -1"):
        get_scheduler("balanced", locality_tolerance=-1)
    assert "locality=False" in repr(get_scheduler("balanced", locality=False))


@settings(max_examples=60, deadline=None)
@given(dp=st.integers(1, 5), rounds=st.integers(1, 4), seed=st.integers(0, 10_000), ties=st.booleans())
def test_deal_local_matches_reference(dp, rounds, seed, ties):
    rng = np.random.default_rng(seed)
    n_bins = dp * rounds
    load = rng.integers(0, 4, n_bins).astype(float) if ties else rng.random(n_bins)
    by_cost = np.lexsort((np.arange(n_bins), -load))
    round_of, replica_of = _kernels.deal_local(by_cost, load, dp)
    ref_round, ref_replica = deal_local_reference(by_cost.tolist(), load.tolist(), dp)
    assert round_of.tolist() == ref_round and replica_of.tolist() == ref_replica
    for m in range(rounds):  # every round holds each replica once
        assert sorted(replica_of[round_of == m].tolist()) == list(range(dp))


def test_lightest_reads_a_heap_in_order():
    rng = np.random.default_rng(5)
    total = rng.integers(0, 5, 40).astype(float)  # ties: lower index first
    heap = np.arange(40, dtype=np.int64)
    pos = np.arange(40, dtype=np.int64)
    for i in range(19, -1, -1):
        _kernels._total_down(heap, pos, 40, i, total, 1.0)
    out = np.empty(9, dtype=np.int64)
    _kernels._lightest(heap, 40, total, out)
    assert out.tolist() == np.lexsort((np.arange(40), total))[:9].tolist()
    assert all(heap[pos[d]] == d for d in range(40))
