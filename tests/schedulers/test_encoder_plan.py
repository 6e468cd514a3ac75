"""seqpack.schedulers.encoder_plan: which rank encodes each image of a round.

Invariants (hypothesis): every image is encoded exactly once, on a rank of the round; the
plan's makespan is never above the home plan's nor plain LPT's, and within LPT's bound
``4/3 - 1/(3R)`` of the optimum (brute force on small rounds); nothing moves when the home
plan is balanced; a moved plan gains more than the near-tie share. Pricing: a plan pays where
its saved encoder seconds exceed its exchange seconds, and route_bytes counts each moved
image's pixels, embeddings and gradients once on each side.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.errors import ConfigError
from seqpack.schedulers.encoder_plan import NEAR_TIE, plan_encoders, rebalance_pays, round_gain, route_bytes


def _makespan(costs, ranks, num_ranks) -> float:
    return float(np.bincount(ranks, weights=costs, minlength=num_ranks).max(initial=0.0))


def _optimum(costs: np.ndarray, num_ranks: int) -> float:
    return min(
        _makespan(costs, np.array(ranks, dtype=np.int64), num_ranks)
        for ranks in itertools.product(range(num_ranks), repeat=costs.size)
    )


def _plain_lpt(costs: np.ndarray, num_ranks: int) -> float:
    load = np.zeros(num_ranks)
    for c in sorted(costs.tolist(), reverse=True):
        load[int(np.argmin(load))] += c
    return float(load.max(initial=0.0))


rounds = st.integers(1, 4).flatmap(
    lambda r: st.tuples(
        st.just(r),
        st.lists(st.tuples(st.integers(0, 50), st.integers(0, r - 1)), max_size=7),
    )
)


@settings(max_examples=200, deadline=None)
@given(rounds)
def test_every_image_is_encoded_once_within_lpts_bound_and_never_worse_than_home(case):
    num_ranks, images = case
    costs = np.array([float(c) for c, _ in images])
    home = np.array([h for _, h in images], dtype=np.int64)
    for near_tie in (0.0, NEAR_TIE):
        plan = plan_encoders(costs, home, num_ranks, near_tie=near_tie)
        assert plan.encoder.shape == home.shape and plan.encoder.dtype == np.int64
        assert ((plan.encoder >= 0) & (plan.encoder < num_ranks)).all()  # each image once, on a rank
        np.testing.assert_allclose(plan.load.sum(), costs.sum())
        makespan = _makespan(costs, plan.encoder, num_ranks)
        assert makespan == plan.load.max(initial=0.0)
        assert makespan <= _makespan(costs, home, num_ranks)
        assert makespan >= plan.lower_bound - 1e-9
        if plan.moved.any():  # moved only for a gain
            assert makespan < _makespan(costs, home, num_ranks) * (1 - near_tie)
        if near_tie == 0.0:
            assert makespan <= _plain_lpt(costs, num_ranks) + 1e-9
            if costs.size <= 6:
                assert makespan <= (4 / 3 - 1 / (3 * num_ranks)) * _optimum(costs, num_ranks) + 1e-9
        assert np.array_equal(plan.encoder, plan_encoders(costs, home, num_ranks, near_tie=near_tie).encoder)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 30), min_size=1, max_size=4))
def test_nothing_moves_when_the_home_plan_is_balanced(num_ranks, per_rank):
    # Every rank holds the same images: the home plan is already the best.
    costs = np.array([float(c) for _ in range(num_ranks) for c in per_rank])
    home = np.repeat(np.arange(num_ranks), len(per_rank))
    plan = plan_encoders(costs, home, num_ranks)
    assert not plan.moved.any() and plan.gain == 0.0


def test_a_busy_rank_sheds_images_and_near_ties_stay_home():
    plan = plan_encoders([8.0, 6.0, 4.0, 1.0], [0, 0, 0, 1], 2)
    assert plan.moved.any() and plan.load.max() == 10.0 and plan.home_load.max() == 18.0
    assert plan.gain == 8.0 and plan.lower_bound == 9.5
    assert plan.moved.tolist() == [True, False, False, False]  # one move (8) rather than three (6, 4, 1)
    # 101 vs 99: moving the 1.0 gains 1/101, under the near-tie share of 1%.
    costs, home = [98.0, 2.0, 1.0, 99.0], [0, 0, 0, 1]
    assert not plan_encoders(costs, home, 2).moved.any()
    assert plan_encoders(costs, home, 2, near_tie=0.0).moved.tolist() == [False, False, True, False]


def test_no_images_and_bad_inputs():
    empty = plan_encoders([], [], 3)
    assert empty.encoder.size == 0 and empty.gain == 0.0 and empty.lower_bound == 0.0
    with pytest.raises(ConfigError, match="home ranks must lie in"):
        plan_encoders([1.0], [2], 2)
    with pytest.raises(ConfigError, match="finite and non-negative"):
        plan_encoders([-1.0], [0], 2)
    with pytest.raises(ConfigError, match="num_ranks must be at least 1"):
        plan_encoders([1.0], [0], 0)
    with pytest.raises(ConfigError, match="1-D of one length"):
        plan_encoders([1.0, 2.0], [0], 2)


def test_route_bytes_and_the_price():
    plan = plan_encoders([8.0, 6.0, 4.0, 1.0], [0, 0, 0, 1], 2)
    moved = np.flatnonzero(plan.moved)
    assert moved.tolist() == [0]  # the 8.0 image: rank 0 sheds it to rank 1
    pixels, embeds = np.array([100, 0, 0, 0]), np.array([10, 0, 0, 0])
    # Rank 0 sends 100 pixels + 10 gradient bytes, receives 10; rank 1 the reverse.
    assert route_bytes(plan, pixels, embeds, 2).tolist() == [110.0, 110.0]
    # The gain is 8 cost units: at 1 s a unit it beats 110 bytes at 100 B/s, not at 10 B/s.
    assert rebalance_pays(plan, pixels, embeds, seconds_per_cost=1.0, bytes_per_second=100.0)
    assert not rebalance_pays(plan, pixels, embeds, seconds_per_cost=1.0, bytes_per_second=10.0)
    home = plan_encoders([1.0], [0], 2)
    assert not rebalance_pays(home, [5], [5], seconds_per_cost=1e9)  # nothing moves: nothing to pay for


def test_the_round_gain_counts_the_barrier_before_the_language_model():
    plan = plan_encoders([8.0, 6.0, 4.0, 1.0], [0, 0, 0, 1], 2)  # loads [18, 1] -> [10, 9]
    assert round_gain(plan) == plan.gain == 8.0
    # Rank 1's language model busy for 17: home max(18 + 0, 1 + 17) = 18, routed 10 + 17 = 27.
    assert round_gain(plan, [0.0, 17.0]) == -9.0
    assert not rebalance_pays(plan, [1, 0, 0, 0], [1, 0, 0, 0], seconds_per_cost=1e9, other_load=[0.0, 17.0])
    # Even language-model work: the encoder's gain is the round's.
    assert round_gain(plan, [5.0, 5.0]) == 8.0
    with pytest.raises(ConfigError, match="one per rank"):
        round_gain(plan, [1.0])
