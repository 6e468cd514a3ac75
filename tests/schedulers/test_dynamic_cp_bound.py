"""step_time_lower_bound: never above the brute-force optimum of tiny steps nor above any plan
the planner makes, and its round bound really tightens the spread/alone bound."""

import numpy as np
import pytest
from benchmark_module import load
from dynamic_cp_reference import brute_force_lockstep, longest_held, plan_dcp
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.errors import ConfigError
from seqpack.options import Sync
from seqpack.schedulers import predicted_step_time
from seqpack.schedulers.dynamic_cp import allowed_group_sizes

_bound = load("dynamic_cp_bound")  # the benchmarks' yardstick: benchmarks/dynamic_cp_bound.py
_Model = _bound._Model
_spread_alone = _bound._spread_alone
_tall_bound = _bound._tall_bound
step_time_lower_bound = _bound.step_time_lower_bound

COSTS = st.sampled_from(
    [
        CostModel(1.0, 0.0, 10.0, reference_size=1),
        CostModel(
            1.0, 0.05, 5.0, ring_step=2.0, ring_token=0.2, ring_token_inter=1.0, ranks_per_node=2, reference_size=1
        ),
        CostModel(0.1, 0.01, 0.0, ring_step=0.5, ring_token=0.05, ranks_per_node=4, reference_size=1),
        CostModel(0.0, 0.0, 1.0, ring_token=0.5, ring_token_inter=0.1, ranks_per_node=1, reference_size=1),
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    ranks=st.sampled_from([1, 2, 4]),
    capacity=st.integers(16, 40),
    cost=COSTS,
)
@pytest.mark.slow
def test_never_above_the_brute_force_optimum(lengths, ranks, capacity, cost):
    sizes = allowed_group_sizes(ranks, "pow2").tolist()
    if max(lengths) > longest_held(capacity, sizes):
        return
    best = brute_force_lockstep(lengths, ranks, capacity, 1, cost, sizes)
    bound = step_time_lower_bound(np.array(lengths), num_ranks=ranks, max_tokens_per_rank=capacity, cost=cost)
    assert bound <= best * (1 + 1e-9) + 1e-12


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=60),
    ranks=st.sampled_from([2, 4, 8]),
    capacity=st.integers(40, 128),
    pad=st.sampled_from([1, 8]),
    cost=COSTS,
    sync=st.sampled_from(["lockstep", "replica"]),
    sizes=st.sampled_from(["pow2", "any"]),
)
@pytest.mark.slow
def test_never_above_a_plan(lengths, ranks, capacity, pad, cost, sync, sizes):
    plan = plan_dcp(lengths, dp_size=ranks, max_tokens_per_rank=capacity, pad_multiple=pad, cost=cost,
                    sync=sync, group_sizes=sizes, on_oversize="drop")  # fmt: skip
    kept = plan.lengths[plan.lengths > 0]
    bound = step_time_lower_bound(kept, num_ranks=ranks, max_tokens_per_rank=capacity, pad_multiple=pad,
                                  cost=cost, sync=sync)  # fmt: skip
    assert bound <= predicted_step_time(plan, cost, sync=sync) * (1 + 1e-9) + 1e-12


def test_the_round_of_a_long_sequence_tightens_the_bound_to_the_optimum():
    """[30, 10, 10] on 2 ranks of 16: 30 takes both ranks for a round, the 10s need a round
    of their own. Spread and alone miss that; the round bound finds the optimum."""
    cost = CostModel(0.01, 0.001, 1.0, ring_step=0.5, ring_token=0.05, reference_size=1)
    lengths = np.array([30, 10, 10])
    best = brute_force_lockstep(lengths.tolist(), 2, 16, 1, cost, [1, 2])
    old = _spread_alone(_Model(lengths, 2, 16, 1, cost), Sync.LOCKSTEP)
    bound = step_time_lower_bound(lengths, num_ranks=2, max_tokens_per_rank=16, cost=cost)
    assert old < 0.9 * best
    assert bound == pytest.approx(best, rel=1e-6)
    assert bound <= best * (1 + 1e-12)


def test_replica_spread_counts_only_microbatches_that_run():
    """Replica sync: [10, 6, 5] on 2 ranks of 10, a launch-bound cost. One rank runs 10, the
    other 6 then 5: step 2k. Charging k for ceil(21 / 20) = 2 rounds *and* the average work
    would claim more than that."""
    cost = CostModel(0.0, 0.0, 1.0, reference_size=1)
    plan = plan_dcp([10, 6, 5], dp_size=2, max_tokens_per_rank=10, cost=cost, sync="replica")
    bound = step_time_lower_bound(np.array([10, 6, 5]), num_ranks=2, max_tokens_per_rank=10, cost=cost,
                                  sync="replica")  # fmt: skip
    assert bound <= predicted_step_time(plan, cost, sync="replica") + 1e-12
    assert bound == pytest.approx(2.0)


def test_empty_step_and_oversize():
    cost = CostModel(1.0, 0.0, 0.0, reference_size=1)
    assert step_time_lower_bound(np.zeros(0, dtype=np.int64), num_ranks=2, max_tokens_per_rank=8, cost=cost) == 0.0
    with pytest.raises(ConfigError, match="sample 1 has 17 tokens"):
        step_time_lower_bound(np.array([3, 17]), num_ranks=2, max_tokens_per_rank=8, cost=cost)


def test_rounds_that_share_the_longest_sequences_tighten_it_further():
    """[30, 30, 4] on 2 ranks of 16: each 30 fills both ranks, so two rounds at its height.
    One long sequence at a time cannot see that; the two together can."""
    cost = CostModel(0.01, 0.001, 1.0, ring_step=0.5, ring_token=0.05, reference_size=1)
    lengths = np.array([30, 30, 4])
    best = brute_force_lockstep(lengths.tolist(), 2, 16, 1, cost, [1, 2])
    model = _Model(lengths, 2, 16, 1, cost)
    alone = max(_tall_bound(model, np.array([0])), _tall_bound(model, np.array([1])))
    bound = step_time_lower_bound(lengths, num_ranks=2, max_tokens_per_rank=16, cost=cost)
    assert alone < 0.95 * best
    assert 0.99 * best < bound <= best * (1 + 1e-12)  # the 4 pays its whole round; the bound, its share
