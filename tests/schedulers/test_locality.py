"""Locality (seqpack/schedulers/locality.py) and the scale of the balanced plan."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_tier import large
from sched_reference import home_swaps_reference

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.mock_data import lognormal_lengths, pareto_lengths
from seqpack.schedulers import _kernels, get_scheduler
from seqpack.schedulers.balanced import locality, plan_balanced, relabel_replicas
from seqpack.schedulers.balanced.locality import (
    KEPT_HOME,
    LINK_BYTES_PER_SECOND,
    PLAN_SECONDS_PER_SEQUENCE,
    break_even_bytes_per_token,
    locality_pays,
    plan_local,
)
from seqpack.schedulers.objective import microbatch_costs, step_objective
from seqpack.schedulers.request import default_origin
from seqpack.stats import StepStats

pytestmark = pytest.mark.kernels

COST = CostModel(24576.0, 1.0)  # issue 12's cost: 24576*s + s**2


def _sft(n, seed=0):
    return lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=seed)


def _wait(schedule, sync):
    return step_objective(microbatch_costs(schedule, COST), sync)


@large
@pytest.mark.slow
def test_the_16k_plan_is_valid_and_keeps_data_home():
    dp = 16_384
    lengths = _sft(4 * dp)
    s = get_scheduler("balanced", locality=True).schedule(lengths, dp_size=dp, max_tokens_per_rank=16384, cost=COST)
    s.validate(lengths, dp_size=dp, max_tokens_per_rank=16384)  # every id once, capacity respected
    replica, _, _ = s.placement()
    assert np.array_equal(np.sort(np.concatenate([ids for row in s.assignment for ids in row])), np.arange(4 * dp))
    assert s.group_tokens().max() <= 16384 and len(s.assignment[0]) == dp
    stats = StepStats.from_schedule(s, COST)
    off = get_scheduler("balanced", locality=False).schedule(lengths, dp_size=dp, max_tokens_per_rank=16384, cost=COST)
    assert stats.moved_fraction < StepStats.from_schedule(off, COST).moved_fraction
    assert stats.moved_tokens == int(lengths[replica != default_origin(4 * dp, dp)].sum())


@large
@pytest.mark.parametrize("sync", ["lockstep", "replica"])
@pytest.mark.parametrize("dp, per_replica", [(64, 64), (256, 16), (1024, 16)])
@pytest.mark.slow
def test_locality_costs_at_most_the_tolerance_and_moves_less(sync, dp, per_replica):
    kept = 0
    for seed in range(3):
        lengths = _sft(dp * per_replica, seed)
        args = dict(dp_size=dp, max_tokens_per_rank=16384, cost=COST)
        on = get_scheduler("balanced", locality=True).schedule(lengths, **args, sync=sync)
        off = get_scheduler("balanced", locality=False).schedule(lengths, **args, sync=sync)
        on.validate(lengths, dp_size=dp, max_tokens_per_rank=16384)
        assert on.num_microbatches == off.num_microbatches
        assert _wait(on, sync) <= _wait(off, sync) * (1 + 1e-3) * (1 + 1e-12)
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
    sync=st.sampled_from(["lockstep", "replica"]),
    seed=st.integers(0, 1000),
)
@pytest.mark.slow
def test_locality_never_changes_which_sequences_a_step_holds(lengths, dp, capacity, sync, seed):
    lengths = np.array(lengths, dtype=np.int64)
    origin = np.sort(np.random.default_rng(seed).integers(0, dp, lengths.shape[0]))
    args = dict(dp_size=dp, max_tokens_per_rank=capacity, cost=CostModel(1.0, 0.01), origin=origin)
    on = get_scheduler("balanced", locality=True).schedule(lengths, **args, sync=sync)
    off = get_scheduler("balanced", locality=False).schedule(lengths, **args, sync=sync)
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
    assert plan_local(_local(lengths, costs, np.zeros(64, np.int64), ref, dp=1, cap=16384)) is None
    # Equal lengths read in rank order already stay home in the reference: nothing to gain.
    equal = np.full(256, 4096, dtype=np.int64)
    origin = default_origin(256, 8)
    ref = plan_balanced(equal, COST.cost(equal), dp_size=8, capacity=16384, origin=origin)
    assert plan_local(_local(equal, COST.cost(equal), origin, ref, dp=8, cap=16384)) is None


def _local(lengths, costs, origin, ref, *, dp, cap, sync="lockstep"):
    """The locality stages' view of a step planned as ``ref``."""
    ranks = relabel_replicas(ref.replica_of, origin, lengths, dp)
    return locality.Local(lengths, costs, origin, ref, ranks, dp, cap, 0.0, sync, None, 1e-3, relabel_replicas)


def test_locality_options_are_checked():
    with pytest.raises(ConfigError, match="locality must be 'auto', True or False, got 'yes'"):
        get_scheduler("balanced", locality="yes")
    with pytest.raises(SeqpackTypeError, match=r"locality must be 'auto', True or False, got 1 \(int\)"):
        get_scheduler("balanced", locality=1)
    with pytest.raises(ConfigError, match="locality_tolerance must be >= 0.0, got -1"):
        get_scheduler("balanced", locality_tolerance=-1)
    assert "locality=False" in repr(get_scheduler("balanced", locality=False))
    assert "locality='auto'" in repr(get_scheduler("balanced")) and get_scheduler("balanced").locality == "auto"
    # The spelling of states saved before "auto" was the default: they resume with locality=True.
    assert repr(get_scheduler("balanced", locality=True)).endswith("locality=True, locality_tolerance=0.001)")
    assert get_scheduler("balanced", locality=np.bool_(True)).locality is True
    with pytest.raises(ConfigError, match="bytes_per_token must be >= 0.0, got -1"):
        get_scheduler("balanced").schedule([5, 6], dp_size=2, max_tokens_per_rank=8, bytes_per_token=-1)
    with pytest.raises(SeqpackTypeError, match="bytes_per_token must be a number, got True"):
        get_scheduler("balanced").schedule([5, 6], dp_size=2, max_tokens_per_rank=8, bytes_per_token=True)


def test_break_even_grows_with_replicas_and_falls_with_longer_sequences():
    n, tokens = 65_536, 65_536 * 4096
    even = [break_even_bytes_per_token(sequences=n, tokens=tokens, dp_size=dp) for dp in (2, 64, 1024, 16_384)]
    assert even == sorted(even) and even[-1] == pytest.approx(8192 * even[0])
    assert break_even_bytes_per_token(sequences=n, tokens=2 * tokens, dp_size=64) == pytest.approx(even[1] / 2)
    # The rule in figures: 1 us of plan per sequence against half of a rank's tokens at 25 GB/s.
    assert even[2] == pytest.approx(PLAN_SECONDS_PER_SEQUENCE * n * 1024 * LINK_BYTES_PER_SECOND / (KEPT_HOME * tokens))
    assert break_even_bytes_per_token(sequences=n, tokens=tokens, dp_size=1) == float("inf")
    assert break_even_bytes_per_token(sequences=0, tokens=0, dp_size=8) == float("inf")
    # Token ids (20 bytes a token) never pay from two replicas of 4K-token sequences on.
    assert not locality_pays(None, sequences=n, tokens=tokens, dp_size=2)
    assert locality_pays(even[1] * 1.01, sequences=n, tokens=tokens, dp_size=64)
    assert not locality_pays(even[1] * 0.99, sequences=n, tokens=tokens, dp_size=64)


@pytest.mark.parametrize("sync", ["lockstep", "replica"])
@pytest.mark.slow
def test_locality_auto_plans_as_off_below_the_break_even_and_as_on_above(sync):
    dp, lengths = 64, _sft(4096)
    args = dict(dp_size=dp, max_tokens_per_rank=16384, cost=COST, sync=sync)
    on = get_scheduler("balanced", locality=True).schedule(lengths, **args)
    off = get_scheduler("balanced", locality=False).schedule(lengths, **args)
    assert on.fingerprint() != off.fingerprint()  # locality acts here: the test can tell them apart
    auto = get_scheduler("balanced")
    assert auto.locality == "auto"
    even = break_even_bytes_per_token(sequences=lengths.shape[0], tokens=int(lengths.sum()), dp_size=dp)
    assert 20 < even < 4096  # token ids below, a 1K-float row per token above
    assert auto.schedule(lengths, **args).fingerprint() == off.fingerprint()  # unknown payload: token ids
    for below in (0, 20, 0.99 * even):
        assert auto.schedule(lengths, **args, bytes_per_token=below).fingerprint() == off.fingerprint()
    for above in (1.01 * even, 4096):
        assert auto.schedule(lengths, **args, bytes_per_token=above).fingerprint() == on.fingerprint()
    # A bool is what it says whatever the payload.
    for payload in (0, 1e9):
        assert (
            get_scheduler("balanced", locality=True).schedule(lengths, **args, bytes_per_token=payload).fingerprint()
            == on.fingerprint()
        )
        assert (
            get_scheduler("balanced", locality=False).schedule(lengths, **args, bytes_per_token=payload).fingerprint()
            == off.fingerprint()
        )


def _swap_case(dp, rounds, n, seed, slack, ties):
    """A random placement of ``n`` sequences and the caps ``1 + slack`` times its own."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, n) * 64 if ties else rng.integers(1, 300, n)
    costs = CostModel(1.0, 0.01).cost(lengths)
    origin = np.sort(rng.integers(0, dp, n))
    round_of, replica_of = rng.integers(0, rounds, n), rng.integers(0, dp, n)
    load = np.zeros((rounds, dp))
    tok = np.zeros((rounds, dp), dtype=np.int64)
    np.add.at(load, (round_of, replica_of), costs)
    np.add.at(tok, (round_of, replica_of), lengths)
    capacity = int(tok.max()) + int(rng.integers(0, 200))
    round_cap = load.max(axis=1) * (1 + slack)
    replica_cap = float(load.sum(axis=0).max()) * (1 + slack)
    order = np.lexsort((np.arange(n), -lengths, origin))
    return lengths, costs, origin, round_of, replica_of, capacity, round_cap, replica_cap, order


@settings(max_examples=80, deadline=None)
@given(
    dp=st.integers(2, 5),
    rounds=st.integers(1, 4),
    n=st.integers(0, 40),
    seed=st.integers(0, 10_000),
    slack=st.sampled_from([0.0, 0.001, 0.05]),
    ties=st.booleans(),
    passes=st.integers(1, 3),
)
@pytest.mark.slow
def test_home_swaps_match_reference_and_keep_every_cap(dp, rounds, n, seed, slack, ties, passes):
    lengths, costs, origin, round_of, replica_of, capacity, round_cap, replica_cap, order = _swap_case(
        dp, rounds, n, seed, slack, ties
    )
    ref_round, ref_replica, ref_changes = home_swaps_reference(
        round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, passes
    )
    before = int(lengths[replica_of != origin].sum())
    changes = _kernels.home_swaps(
        round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, passes
    )
    assert (round_of.tolist(), replica_of.tolist(), changes) == (ref_round, ref_replica, ref_changes)
    load = np.zeros((rounds, dp))
    tok = np.zeros((rounds, dp), dtype=np.int64)
    np.add.at(load, (round_of, replica_of), costs)
    np.add.at(tok, (round_of, replica_of), lengths)
    assert tok.max(initial=0) <= capacity
    assert np.all(load.max(axis=1) <= round_cap * (1 + 1e-12))
    assert load.sum(axis=0).max(initial=0) <= replica_cap * (1 + 1e-12)
    after = int(lengths[replica_of != origin].sum())
    assert after <= before and (changes == 0) == (after == before)


@large
@pytest.mark.parametrize("sync", ["lockstep"])
def test_lockstep_locality_moves_at_most_half_of_the_tokens(sync):
    """Issue 12's workload at dp=64: lockstep plans keep more than half of the tokens home
    (the reference renamed moves ~93%) within 0.1% of its predicted step time."""
    dp = 64
    for seed in (1, 2, 3):
        lengths = lognormal_lengths(
            dp * 64, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=seed
        )
        args = dict(dp_size=dp, max_tokens_per_rank=16384, cost=COST)
        on = get_scheduler("balanced", locality=True).schedule(lengths, **args, sync=sync)
        off = get_scheduler("balanced", locality=False).schedule(lengths, **args, sync=sync)
        assert _wait(on, sync) <= _wait(off, sync) * (1 + 1e-3) * (1 + 1e-12)
        assert StepStats.from_schedule(on, COST).moved_fraction <= 0.5
        assert StepStats.from_schedule(off, COST).moved_fraction > 0.9


def test_lightest_reads_a_heap_in_order():
    rng = np.random.default_rng(5)
    total = rng.integers(0, 5, 40).astype(float)  # ties: lower index first
    heap = np.arange(40, dtype=np.int64)
    pos = np.arange(40, dtype=np.int64)
    for i in range(40):
        _kernels.replica_repair._total_sift(heap, pos, i + 1, i, total, 1.0)
    out = np.empty(9, dtype=np.int64)
    _kernels.replica_repair._lightest_into(heap, 40, total, out, np.empty(2 * 9 + 1, dtype=np.int64))
    assert out.tolist() == np.lexsort((np.arange(40), total))[:9].tolist()
    assert all(heap[pos[d]] == d for d in range(40))


@large
def test_replicas_keeps_whichever_layout_moves_less():
    """Heavy-tailed lengths: the per-replica layout moves over a third of the tokens, so the
    home swaps are tried too and the plan that moves less is kept."""
    dp, cap = 256, 32768
    lengths = pareto_lengths(dp * 32, min_seq_len=256, max_seq_len=cap, alpha=1.2, seed=1)
    costs = COST.cost(lengths)
    origin = default_origin(lengths.shape[0], dp)
    ref = plan_balanced(lengths, costs, dp_size=dp, capacity=cap, sync="replica", origin=origin)
    layout = locality.per_replica(_local(lengths, costs, origin, ref, dp=dp, cap=cap, sync="replica"))
    assert layout is not None
    layout_moved = int(lengths[layout[1] != origin].sum())
    assert layout_moved > lengths.sum() / 3
    sched = get_scheduler("balanced", locality=True)
    s = sched.schedule(lengths, dp_size=dp, max_tokens_per_rank=cap, cost=COST, sync="replica")
    assert StepStats.from_schedule(s, COST).moved_tokens < layout_moved
    assert _wait(s, "replica") <= step_objective(ref.load, "replica") * (1 + 1e-3) * (1 + 1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_home_swaps_match_reference_on_larger_homes(seed):
    """Hundreds of sequences per home and 64 rounds, so home_swaps walks its trees
    (locality_swaps.py; from HOME_TREE_MIN sequences) over several levels while keys change
    under them many times per turn."""
    dp, rounds, n = 3, 64, 900
    lengths, costs, origin, round_of, replica_of, capacity, round_cap, replica_cap, order = _swap_case(
        dp, rounds, n, seed, 0.001, False
    )
    ref_round, ref_replica, ref_changes = home_swaps_reference(
        round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, 2
    )
    changes = _kernels.home_swaps(
        round_of, replica_of, lengths, costs, origin, dp, rounds, capacity, round_cap, replica_cap, order, 2
    )
    assert changes > 20  # not vacuous
    assert (round_of.tolist(), replica_of.tolist(), changes) == (ref_round, ref_replica, ref_changes)
