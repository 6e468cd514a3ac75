"""A per-sample cost beside the tokens' (Scheduler.schedule(sample_cost=)): what balanced
balances, and what every plan's step time, round and replica costs and StepStats include."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.schedulers import Request, get_scheduler, predicted_step_time
from seqpack.schedulers.objective import microbatch_costs
from seqpack.schedulers.step_time import rank_times
from seqpack.stats import StepStats

COST = CostModel(1.0, 0.001, 5.0)


def _by_hand(plan, cost, sample_cost):
    """``sum_m max_d`` of each microbatch's tokens' cost, constant and samples' costs."""
    total = 0.0
    for row in plan.assignment:
        total += max(cost.microbatch_cost(plan.lengths[ids]) + float(sample_cost[ids].sum()) for ids in row)
    return total


@pytest.mark.parametrize(
    ("sample_cost", "error", "match"),
    [
        ([1.0], ConfigError, r"one cost per sample \(2\), got shape \(1,\)"),
        ([[1.0, 2.0]], ConfigError, "one cost per sample"),
        ([1.0, -2.0], ConfigError, "sample_cost of sample 1 is -2.0"),
        ([float("nan"), 0.0], ConfigError, "sample_cost of sample 0 is nan"),
        ([1.0, "x"], SeqpackTypeError, "sample_cost must hold real numbers"),
    ],
)
def test_a_bad_sample_cost_is_refused_by_name(sample_cost, error, match):
    with pytest.raises(error, match=match):
        Request.of([3, 4], dp_size=2, max_tokens_per_rank=8, sample_cost=sample_cost)
    with pytest.raises(error, match=match):
        get_scheduler("balanced").schedule([3, 4], dp_size=2, max_tokens_per_rank=8, sample_cost=sample_cost)


def test_subset_keeps_each_samples_cost():
    request = Request.of([3, 4, 5], dp_size=1, max_tokens_per_rank=8, sample_cost=[1.0, 2.0, 3.0])
    assert request.sample_cost is not None and request.sample_cost.dtype == np.float64
    assert request.subset(np.array([2, 0])).sample_cost.tolist() == [3.0, 1.0]


@pytest.mark.parametrize("name", ["balanced", "dp_balanced", "empty"])
def test_zeros_plan_as_none(name):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, 64)
    limits = dict(dp_size=4, max_tokens_per_rank=512, cost=COST)
    plain = get_scheduler(name).schedule(lengths, **limits)
    zeros = get_scheduler(name).schedule(lengths, **limits, sample_cost=np.zeros(64))
    assert plain.sample_cost is None and zeros.sample_cost is not None
    assert zeros.fingerprint() == plain.fingerprint()


def test_balanced_balances_the_sum():
    """Equal lengths: tokens alone keep samples home (two encoder-heavy ones on rank 0); the
    summed cost puts one on each rank."""
    lengths = [100] * 4
    heavy = np.array([400.0, 400.0, 0.0, 0.0])
    limits = dict(dp_size=2, max_tokens_per_rank=200, cost=COST)
    tokens_only = get_scheduler("balanced").schedule(lengths, **limits)
    summed = get_scheduler("balanced").schedule(lengths, **limits, sample_cost=heavy)
    replica = summed.replica_of()
    assert replica[0] != replica[1]
    tokens_only = dataclasses.replace(tokens_only, sample_cost=heavy)  # reported with the samples' costs
    assert tokens_only.replica_of()[0] == tokens_only.replica_of()[1]  # not vacuous
    one = COST.microbatch_cost([100, 100])
    assert predicted_step_time(summed, COST) == pytest.approx(one + 400.0)
    assert predicted_step_time(tokens_only, COST) == pytest.approx(one + 800.0)


@pytest.mark.parametrize("name", ["balanced", "dp_balanced", "empty"])
@pytest.mark.parametrize("sync", ["lockstep", "replica"])
def test_what_is_planned_is_what_is_reported(name, sync):
    """Every scheduler's plan carries the sample cost, and its step time, rank times,
    microbatch costs and StepStats add it to each sample's microbatch."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 300, 48)
    sample_cost = np.where(rng.random(48) < 0.3, rng.uniform(50.0, 2000.0, 48), 0.0)
    plan = get_scheduler(name).schedule(
        lengths, dp_size=4, max_tokens_per_rank=512, cost=COST, sync=sync, sample_cost=sample_cost
    )
    assert plan.sample_cost is not None and plan.sample_cost.tolist() == sample_cost.tolist()
    costs = microbatch_costs(plan, COST)
    for m, row in enumerate(plan.assignment):
        for d, ids in enumerate(row):
            want = COST.microbatch_cost(plan.lengths[ids]) + float(sample_cost[ids].sum())
            assert costs[m, d] == pytest.approx(want)
            assert rank_times(plan, COST)[m, d] == pytest.approx(want)
    want = costs.max(axis=1).sum() if sync == "lockstep" else costs.sum(axis=0).max()
    assert predicted_step_time(plan, COST, sync=sync) == pytest.approx(want)
    if sync == "lockstep":
        assert predicted_step_time(plan, COST) == pytest.approx(_by_hand(plan, COST, sample_cost))
    stats = StepStats.from_schedule(plan, COST, sync=sync)
    assert stats.predicted_step_time == pytest.approx(want)
    assert stats.replica_cost.tolist() == pytest.approx(costs.sum(axis=0).tolist())
    heaviest = float((COST.cost(plan.lengths) + sample_cost).max()) + COST.constant
    assert stats.lower_bound >= heaviest - 1e-9
    assert stats.round_lower_bound >= 1.0


def test_the_round_bound_holds_for_a_short_sample_with_a_heavy_image():
    """One short sample carries most of the step's cost: the bound is at least its round."""
    lengths = [8] + [200] * 15
    sample_cost = np.zeros(16)
    sample_cost[0] = 5000.0
    plan = get_scheduler("balanced").schedule(
        lengths, dp_size=2, max_tokens_per_rank=400, cost=COST, sample_cost=sample_cost
    )
    stats = StepStats.from_schedule(plan, COST)
    assert stats.round_imbalance >= stats.round_lower_bound - 1e-12
    costs = microbatch_costs(plan, COST)
    total, rounds = float(costs.sum()), costs.shape[0]
    # The heavy sample's round waits for it, the others for their mean at least.
    assert stats.round_lower_bound * total / 2 >= 5000.0 + COST.cost([8])[0] - 1e-9
    assert rounds >= 1


def test_drops_keep_the_plan_of_sample_costs_by_id():
    sample_cost = np.array([0.0, 100.0, 0.0, 7.0])
    plan = get_scheduler("balanced").schedule(
        [10, 900, 20, 30], dp_size=2, max_tokens_per_rank=64, cost=COST, on_oversize="drop", sample_cost=sample_cost
    )
    assert plan.dropped.tolist() == [1] and plan.sample_cost.tolist() == sample_cost.tolist()
    costs = microbatch_costs(plan, COST)
    assert float(costs.sum()) == pytest.approx(COST.cost([10, 20, 30]).sum() + 7.0 + COST.constant * costs.size)


def test_dynamic_cp_refuses_a_sample_cost_by_name():
    scheduler = get_scheduler("dynamic_cp")
    limits = dict(dp_size=2, cp_size=2, max_tokens_per_rank=64)
    with pytest.raises(ConfigError, match=r"'dynamic_cp' does not plan a sample_cost \(sample 1's is 3.0\)"):
        scheduler.schedule([10, 20, 30], **limits, sample_cost=[0.0, 3.0, 0.0])
    zeros = scheduler.schedule([10, 20, 30], **limits, sample_cost=np.zeros(3))
    assert zeros.fingerprint() == scheduler.schedule([10, 20, 30], **limits).fingerprint()


def test_minibatches_and_groups_carry_each_samples_cost():
    from seqpack.schedulers.minibatches import schedule_minibatches
    from seqpack.schedulers.sample_groups import schedule_groups

    rng = np.random.default_rng(2)
    sample_cost = rng.uniform(0.0, 500.0, 16)
    request = Request.of(
        rng.integers(1, 100, 16), dp_size=2, max_tokens_per_rank=256, cost=COST, sample_cost=sample_cost
    )
    joined, _ = schedule_minibatches(get_scheduler("balanced"), request, minibatches=2)
    grouped = schedule_groups(get_scheduler("balanced"), request, np.arange(16) // 2, np.ones(16, bool))
    for plan in (joined, grouped):
        assert plan.sample_cost is not None and plan.sample_cost.tolist() == sample_cost.tolist()
        assert predicted_step_time(plan, COST) == pytest.approx(_by_hand(plan, COST, sample_cost))
