"""plan_dynamic_cp: invariants on random steps, against static CP and a brute-force optimum,
determinism, and its errors."""

import numpy as np
import pytest
from dynamic_cp_reference import (
    brute_force_lockstep,
    check_plan_reference,
    longest_held,
    padded,
    plan_dcp,
    static_reference,
    step_time_reference,
)
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError
from seqpack.schedulers import get_scheduler, predicted_step_time
from seqpack.schedulers.dynamic_cp import allowed_group_sizes
from seqpack.thd import StaticShapes

COSTS = st.sampled_from(
    [
        CostModel(1.0, 0.0, 10.0, reference_size=1),  # launch-bound-ish, no ring cost
        CostModel(
            1.0, 0.05, 5.0, ring_step=2.0, ring_token=0.2, ring_token_inter=1.0, ranks_per_node=2, reference_size=1
        ),
        CostModel(0.1, 0.01, 0.0, ring_step=0.5, ring_token=0.05, ranks_per_node=4, reference_size=1),
    ]
)


@given(
    lengths=st.lists(st.integers(1, 300), max_size=40),
    dp=st.integers(1, 4),
    cp=st.sampled_from([1, 2, 4]),
    capacity=st.integers(40, 128),
    pad=st.sampled_from([1, 2, 8]),
    cost=COSTS,
    sync=st.sampled_from(["lockstep", "replica"]),
    sizes=st.sampled_from(["pow2", "any"]),
)
@pytest.mark.slow
def test_plan_invariants_and_objective(lengths, dp, cp, capacity, pad, cost, sync, sizes):
    ranks = dp * cp
    plan = plan_dcp(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=capacity, pad_multiple=pad,
                    cost=cost, sync=sync, group_sizes=sizes, on_oversize="drop")  # fmt: skip
    plan.validate(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=capacity, pad_multiple=pad)
    check_plan_reference(plan, lengths, ranks, capacity, pad, aligned=sizes == "pow2")
    predicted = predicted_step_time(plan, cost, sync=sync)
    assert predicted == pytest.approx(step_time_reference(plan, cost, sync), rel=1e-9, abs=1e-9)
    kept = [s for i, s in enumerate(lengths) if i not in set(plan.dropped.tolist())]
    if kept:  # never worse than static CP sized for the longest sequence
        allowed = allowed_group_sizes(ranks, sizes).tolist()
        static = static_reference(kept, ranks, capacity, pad, cost, allowed)
        assert predicted <= step_time_reference(static, cost, sync) * (1 + 1e-9) + 1e-12
    again = plan_dcp(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=capacity, pad_multiple=pad,
                     cost=cost, sync=sync, group_sizes=sizes, on_oversize="drop")  # fmt: skip
    assert again.fingerprint() == plan.fingerprint()


@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    ranks=st.sampled_from([1, 2, 4]),
    capacity=st.integers(16, 40),
    cost=COSTS,
)
@pytest.mark.slow
def test_never_better_than_the_brute_force_optimum(lengths, ranks, capacity, cost):
    sizes = allowed_group_sizes(ranks, "pow2").tolist()
    if max(lengths) > longest_held(capacity, sizes):
        return
    plan = plan_dcp(lengths, dp_size=ranks, max_tokens_per_rank=capacity, cost=cost)
    best = brute_force_lockstep(lengths, ranks, capacity, 1, cost, sizes)
    predicted = predicted_step_time(plan, cost)
    assert predicted >= best * (1 - 1e-9)
    assert predicted <= 2.0 * best  # a heuristic, but never far off on tiny steps


@pytest.mark.slow
def test_brute_force_gap_is_small_on_average():
    """Over many tiny steps the planner is within a few percent of the optimum on average
    (and the brute force really found better plans than the planner now and then)."""
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(150):
        ranks = int(rng.choice([2, 4]))
        lengths = rng.integers(1, 60, size=int(rng.integers(2, 5))).tolist()
        ring = {"ring_step": 2.0, "ring_token": 0.2, "ring_token_inter": 1.0, "ranks_per_node": 2}
        cost = CostModel(1.0, 0.05, 5.0, **ring, reference_size=1)  # type: ignore[arg-type]
        plan = plan_dcp(lengths, dp_size=ranks, max_tokens_per_rank=32, cost=cost)
        best = brute_force_lockstep(lengths, ranks, 32, 1, cost, allowed_group_sizes(ranks, "pow2").tolist())
        ratios.append(predicted_step_time(plan, cost) / best)
    assert np.mean(ratios) < 1.05
    assert max(ratios) > 1.0 + 1e-9  # not vacuous: the optimum is sometimes strictly better


def test_long_sequence_spreads_and_short_ones_stay_alone():
    cost = CostModel(1.0, 0.001, 1.0, ring_step=2.0, ring_token=0.5, ranks_per_node=8, reference_size=1)
    lengths = [900] + [50] * 30  # 900 needs 8 ranks of 128
    plan = plan_dcp(lengths, dp_size=8, max_tokens_per_rank=128, cost=cost)
    sizes = plan.per_id(plan.group_size)
    assert sizes[0] == 8
    assert (sizes[1:] == 1).sum() > 20  # most short ones pay no ring


def test_a_lone_sequence_widens_onto_idle_ranks():
    """Quadratic cost, no ring cost: a sequence needing 4 ranks runs on all 8 (widened)."""
    cost = CostModel(0.0, 1.0, 0.0, reference_size=1)
    plan = plan_dcp([60], dp_size=8, max_tokens_per_rank=16, cost=cost)
    assert plan.group_size.tolist() == [8] and plan.group_ids(0).tolist() == [0]


def test_a_short_sequence_takes_a_group_when_that_shortens_the_step():
    cost = CostModel(0.0, 1.0, 0.0, ring_step=1.0, reference_size=1)  # attention dominates; the ring is cheap
    plan = plan_dcp([100], dp_size=4, max_tokens_per_rank=128, cost=cost)
    assert plan.group_size.tolist() == [4]
    assert predicted_step_time(plan, cost) < cost.cost([100])[0]


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60),
    ranks=st.sampled_from([2, 4, 6, 8, 12, 16]),
    capacity=st.integers(40, 128),
    pad=st.sampled_from([1, 2, 8]),
    cost=COSTS,
    sizes=st.sampled_from(["pow2", "any"]),
)
@pytest.mark.slow
def test_replica_plan_never_slower_than_balanced_static_cp(lengths, ranks, capacity, pad, cost, sizes):
    """Under replica sync, never slower than ``balanced`` (replica-first) static CP on the
    smallest power of 2 dividing the ranks that holds the longest sequence (R itself
    otherwise), priced as static plans are (``CostModel.at``): benchmarks/dynamic_cp.py's
    baseline, stronger than the planner's own static-CP fill."""
    multiple = 2 * ranks * pad
    lengths = [min(s, ranks * capacity // multiple * multiple) for s in lengths]  # all R ranks hold each
    longest = max(lengths)
    plan = plan_dcp(lengths, dp_size=ranks, max_tokens_per_rank=capacity, pad_multiple=pad, cost=cost,
                    sync="replica", group_sizes=sizes)  # fmt: skip
    pow2 = [*(2**k for k in range(5)), ranks]
    holds = [c for c in pow2 if ranks % c == 0 and padded(longest, c, pad) <= c * capacity]
    c = holds[0]
    static = get_scheduler("balanced").schedule(lengths, dp_size=ranks // c, cp_size=c, max_tokens_per_rank=capacity,
                                                pad_multiple=pad if c == 1 else 2 * c * pad, cost=cost.at(c),
                                                sync="replica")  # fmt: skip
    expected = predicted_step_time(static, cost.at(c), sync="replica")
    assert predicted_step_time(plan, cost, sync="replica") <= expected * (1 + 1e-9) + 1e-12


def test_replica_plans_never_wait():
    """Under replica sync the groups sit on laminar aligned blocks: the step time equals the
    busiest rank's total, nobody waits for a group to assemble."""
    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(10, 120, 200), [900, 700, 500, 400, 300]])
    cost = CostModel(1.0, 0.01, 2.0, ring_step=1.0, ring_token=0.1, ranks_per_node=4, reference_size=1)
    plan = plan_dcp(lengths, dp_size=16, max_tokens_per_rank=128, cost=cost, sync="replica")
    from seqpack.schedulers.step_time import group_times

    times = np.where(plan.group_counts > 0, group_times(plan, cost), cost.constant)
    per_rank = np.zeros(16)
    for g in range(plan.num_groups):
        per_rank[plan.group_start[g] : plan.group_start[g] + plan.group_size[g]] += times[g]
    assert predicted_step_time(plan, cost, sync="replica") == pytest.approx(per_rank.max())
    assert plan.group_size.max() > 1


def test_empty_step():
    plan = plan_dcp([], dp_size=2, cp_size=2, max_tokens_per_rank=8, cost=CostModel(1.0, 0.0))
    plan.validate([])
    assert plan.num_microbatches == 0 and predicted_step_time(plan, CostModel(1.0, 0.0, reference_size=1)) == 0.0


def test_oversize_error_names_the_sample_and_the_limits():
    with pytest.raises(ScheduleError) as err:
        plan_dcp([10, 1000, 3000], dp_size=2, max_tokens_per_rank=100, pad_multiple=8, cost=CostModel(1, 0))
    message = str(err.value)
    assert "sample 1 has 1000 tokens" in message
    assert "2 x max_tokens_per_rank=100 = 200" in message and "2 sample(s)" in message
    assert "on_oversize" in message


def test_oversize_truncate_and_drop_are_counted():
    cost = CostModel(1.0, 0.0)
    cut = plan_dcp([10, 1000], dp_size=2, max_tokens_per_rank=100, pad_multiple=8, cost=cost,
                   on_oversize="truncate")  # fmt: skip
    cut.validate([10, 1000])
    assert cut.truncated.tolist() == [1] and cut.lengths[1] == 192  # 2 x 100 tokens, multiples of 2*2*8
    gone = plan_dcp([10, 1000], dp_size=2, max_tokens_per_rank=100, cost=cost, on_oversize="drop")
    gone.validate([10, 1000])
    assert gone.dropped.tolist() == [1] and gone.assigned.tolist() == [0]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"dp_size": 0}, ConfigError, "dp_size"),
        ({"cost": "flops"}, SeqpackTypeError, "must be a seqpack.CostModel"),
        ({"cost": None}, SeqpackTypeError, "cost must be a seqpack.CostModel, got None"),
        ({"static_shapes": StaticShapes(token_buckets=(64,), max_sequences=4)}, ConfigError, "static_shapes is not"),
        ({"sample_cost": [0.0, 2.0]}, ConfigError, r"sample 1's is 2.0"),
        ({"sync": "async"}, ConfigError, "sync"),
        ({"group_sizes": "odd"}, ConfigError, "group_sizes"),
        ({"on_oversize": "ignore"}, ConfigError, "on_oversize"),
        ({"max_tokens_per_rank": 4, "pad_multiple": 8}, ConfigError, "nothing fits"),
        ({"lengths": [[1, 2]]}, SampleError, "1-D"),
        ({"lengths": [3, 0]}, SampleError, "sample 1 has length 0"),
        ({"lengths": [1.5]}, SeqpackTypeError, "integers"),
    ],
)
def test_bad_arguments(kwargs, error, text):
    args = {"lengths": [5, 6], "dp_size": 2, "max_tokens_per_rank": 16, "cost": CostModel(1.0, 0.0)} | kwargs
    lengths = args.pop("lengths")
    with pytest.raises(error, match=text):
        plan_dcp(lengths, **args)
