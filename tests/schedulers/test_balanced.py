import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_reference import brute_force_optimum

from seqpack.cost import CostModel, default_cost_model
from seqpack.mock_data import lognormal_lengths
from seqpack.schedulers import BalancedScheduler, available_schedulers, get_scheduler
from seqpack.schedulers.balanced import plan_balanced, round_position, round_targets
from seqpack.schedulers.objective import microbatch_costs
from seqpack.stats import StepStats

QUAD = CostModel(1.0, 0.01)


def test_registry_default_is_balanced():
    assert available_schedulers() == ["balanced", "dp_balanced", "empty"]
    assert isinstance(get_scheduler(), BalancedScheduler)
    assert get_scheduler("balanced", order="pipeline").order == "pipeline"
    with pytest.raises(ValueError, match="order must be one of"):
        get_scheduler("balanced", order="random")
    with pytest.raises(ValueError, match="microbatch_multiple must be a positive integer, got 0"):
        get_scheduler("balanced", microbatch_multiple=0)


def test_quadratic_cost_changes_the_choice():
    # Tokens split evenly as {600,400} | {300,300,200,200}; with attention's quadratic term
    # the 600-token sequence is expensive and should share its replica with little else.
    lengths = np.array([600, 400, 300, 300, 200, 200])
    sched = get_scheduler("balanced")
    s = sched.schedule(lengths, dp_size=2, max_tokens_per_rank=1200, cost=QUAD)
    s.validate()
    groups = sorted(sorted(lengths[ids].tolist()) for ids in s.assignment[0])
    assert groups == [[200, 300, 300, 400], [200, 600]]
    stats = StepStats.from_schedule(s, QUAD)
    assert sorted(stats.replica_cost.tolist()) == [4800.0, 5000.0]
    by_tokens = sched.schedule(lengths, dp_size=2, max_tokens_per_rank=1200, cost=CostModel.tokens())
    assert max(StepStats.from_schedule(by_tokens, QUAD).replica_cost) > 5000.0


def test_default_cost_is_the_default_model():
    sched = get_scheduler("balanced")
    assert sched.resolve_cost(None) == default_cost_model()
    assert sched.resolve_cost(QUAD) is QUAD
    assert get_scheduler("dp_balanced").resolve_cost(None) is None
    lengths = np.array([8000, 4000, 3000, 3000, 1000, 1000, 500, 500])
    a = sched.schedule(lengths, dp_size=2, max_tokens_per_rank=16000)
    b = sched.schedule(lengths, dp_size=2, max_tokens_per_rank=16000, cost=default_cost_model())
    assert a.fingerprint() == b.fingerprint()


def _lognormal(n, seed, low=128, high=8192, mean=2048):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(mean) - 0.605, 1.1, n)), low, high).astype(np.int64)


def test_balances_replicas_and_rounds_on_sft_lengths():
    lengths = _lognormal(2048, 0)
    s = get_scheduler("balanced").schedule(lengths, dp_size=16, max_tokens_per_rank=16384)
    s.validate()
    stats = StepStats.from_schedule(s, default_cost_model())
    assert stats.num_microbatches == stats.min_microbatches  # no extra microbatch
    assert stats.bound_ratio < 1.005 and stats.round_imbalance < 1.01
    dp = StepStats.from_schedule(
        get_scheduler("dp_balanced").schedule(lengths, dp_size=16, max_tokens_per_rank=16384), default_cost_model()
    )
    assert dp.bound_ratio > 1.05  # the baseline leaves balance to chance


def test_capacity_and_microbatch_limits():
    lengths = _lognormal(500, 1)
    cap = 8192
    s = get_scheduler("balanced", min_microbatches=9, microbatch_multiple=4).schedule(
        lengths, dp_size=8, max_tokens_per_rank=cap // 2, cp_size=2, pad_multiple=4
    )
    s.validate()
    assert s.num_microbatches >= 9 and s.num_microbatches % 4 == 0
    assert s.group_tokens().max() <= cap
    forced = get_scheduler("balanced", num_microbatches=40).schedule(lengths, dp_size=8, max_tokens_per_rank=cap)
    forced.validate()
    assert forced.num_microbatches == 40
    with pytest.raises(ValueError, match=r"num_microbatches=1 cannot hold 500 sequences .* token lower bound alone is"):
        get_scheduler("balanced", num_microbatches=1).schedule(lengths, dp_size=8, max_tokens_per_rank=cap)


def test_fallback_keeps_the_token_lower_bound_when_more_rounds_do_not_help():
    # Cost-first bins leave 5,4 | 5,3 and no room for the last 3; first-fit packs 5,5 | 4,3,3.
    lengths = np.array([5, 5, 4, 3, 3])
    plan = plan_balanced(lengths, lengths * 1.0, dp_size=1, capacity=10)
    assert plan.num_microbatches == 2 and plan.mode == 2
    s = get_scheduler("balanced").schedule(lengths, dp_size=1, max_tokens_per_rank=10, cost=CostModel.tokens())
    s.validate()
    assert s.num_microbatches == 2


def test_fallback_picks_the_cheaper_microbatch_count():
    # At M=2 (the token bound) only first-fit fits these; M=3 balances better and wins.
    lengths = np.array([3, 6, 3, 2, 8, 4, 8, 4])
    costs = lengths * (1.0 + 0.5 * lengths)
    at2 = plan_balanced(lengths, costs, dp_size=2, capacity=10, num_microbatches=2)
    at3 = plan_balanced(lengths, costs, dp_size=2, capacity=10, num_microbatches=3)
    assert at2.mode == 2 and at3.objective < at2.objective
    assert plan_balanced(lengths, costs, dp_size=2, capacity=10).num_microbatches == 3
    # A per-microbatch constant makes the third microbatch too expensive.
    assert plan_balanced(lengths, costs, dp_size=2, capacity=10, constant=10.0).num_microbatches == 2


def test_few_sequences_many_replicas():
    s = get_scheduler("balanced").schedule([5, 3, 9], dp_size=8, max_tokens_per_rank=16)
    s.validate()
    assert s.num_microbatches == 1
    assert sorted(ids.size for ids in s.assignment[0]) == [0] * 5 + [1] * 3
    empty = get_scheduler("balanced").schedule([], dp_size=4, max_tokens_per_rank=16)
    empty.validate()
    assert empty.num_microbatches == 0


def test_dominant_sequence_gets_its_replica_alone():
    # One sequence costs more than an average replica: the bound is that sequence.
    lengths = np.array([4000] + [100] * 40)
    s = get_scheduler("balanced").schedule(lengths, dp_size=4, max_tokens_per_rank=4000, cost=QUAD)
    stats = StepStats.from_schedule(s, QUAD)
    assert stats.lower_bound == QUAD.cost([4000])[0]
    assert stats.bound_ratio == 1.0


def test_pipeline_order_puts_light_microbatches_at_both_ends():
    lengths = _lognormal(600, 3)
    heavy = get_scheduler("balanced").schedule(lengths, dp_size=4, max_tokens_per_rank=8192)
    pipe = get_scheduler("balanced", order="pipeline").schedule(lengths, dp_size=4, max_tokens_per_rank=8192)
    pipe.validate()
    model = default_cost_model()
    peak_heavy = microbatch_costs(heavy, model).max(axis=1)
    peak_pipe = microbatch_costs(pipe, model).max(axis=1)
    assert np.all(np.diff(peak_heavy) <= 0)  # default: heaviest first
    assert sorted(peak_pipe.tolist()) == sorted(peak_heavy.tolist())  # same rounds, reordered
    top = int(np.argmax(peak_pipe))
    assert 0 < top < len(peak_pipe) - 1
    assert np.all(np.diff(peak_pipe[: top + 1]) >= 0) and np.all(np.diff(peak_pipe[top:]) <= 0)
    assert {peak_pipe[0], peak_pipe[-1]} == set(np.sort(peak_pipe)[:2])


def test_round_position_and_targets():
    load = np.array([[5.0], [1.0], [3.0], [2.0], [4.0]])
    assert round_position(load, "heavy_first").tolist() == [0, 4, 2, 3, 1]
    # pipeline: lightest (1) first, next (2) last, then 3 second, 4 second to last, 5 middle.
    assert round_position(load, "pipeline").tolist() == [2, 0, 1, 4, 3]
    # A sequence costlier than an average microbatch raises round 0's target for everyone.
    targets = round_targets(np.array([6.0, 1, 1, 1, 1, 1, 1, 1]), dp_size=2, num_rounds=2)
    assert targets.tolist() == [6.0, 0.5]
    assert round_targets(np.full(8, 1.0), dp_size=2, num_rounds=2).tolist() == [2.0, 2.0]


def test_deterministic_and_independent_of_earlier_calls():
    lengths = _lognormal(300, 5)
    sched = get_scheduler("balanced")
    first = sched.schedule(lengths, dp_size=6, max_tokens_per_rank=8192).fingerprint()
    sched.schedule(lengths[:50], dp_size=3, max_tokens_per_rank=16384)
    assert get_scheduler("balanced").schedule(lengths, dp_size=6, max_tokens_per_rank=8192).fingerprint() == first


def test_equal_lengths_are_perfectly_balanced():
    s = get_scheduler("balanced").schedule(np.full(256, 4096), dp_size=8, max_tokens_per_rank=32768)
    stats = StepStats.from_schedule(s, default_cost_model())
    assert stats.num_microbatches == 4 and stats.imbalance == 1.0 and stats.round_imbalance == 1.0


@settings(max_examples=25)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    dp=st.integers(1, 2),
    rounds=st.integers(1, 2),
    capacity=st.integers(12, 20),
)
@pytest.mark.slow
def test_against_brute_force_on_tiny_inputs(lengths, dp, rounds, capacity):
    """Lower bounds hold against the true optimum; balanced stays near it."""
    lengths = np.array(lengths, dtype=np.int64)
    if -(-int(lengths.sum()) // (dp * capacity)) > rounds:
        return
    costs = QUAD.cost(lengths)
    best_replica, best_rounds = brute_force_optimum(costs.tolist(), lengths.tolist(), dp, rounds, capacity)
    s = get_scheduler("balanced", num_microbatches=rounds).schedule(
        lengths, dp_size=dp, max_tokens_per_rank=capacity, cost=QUAD
    )
    s.validate()
    stats = StepStats.from_schedule(s, QUAD)
    got_replica = max(stats.replica_cost)
    got_rounds = stats.round_imbalance * sum(stats.replica_cost) / dp
    assert stats.lower_bound <= best_replica + 1e-9
    assert stats.round_lower_bound * sum(stats.replica_cost) / dp <= best_rounds + 1e-9
    assert got_replica >= best_replica - 1e-9 and got_rounds >= best_rounds - 1e-9
    # LPT-style guarantees on these sizes: within 4/3 of the optimum.
    assert got_replica <= 4 / 3 * best_replica + 1e-9
    assert got_rounds <= 4 / 3 * best_rounds + 1e-9


@pytest.mark.parametrize("seed", [0, 1])
def test_each_sync_balances_what_it_waits_for(seed):
    # A long tail up to a whole microbatch: replica and round balance conflict.
    from seqpack.mock_data import lognormal_lengths

    lengths = lognormal_lengths(512, min_seq_len=128, max_seq_len=32768, mean_seq_len=4096, seed=seed)
    model = default_cost_model()
    ratios = {}
    for sync in ("lockstep", "replica"):
        s = get_scheduler("balanced").schedule(lengths, dp_size=32, max_tokens_per_rank=32768, cost=model, sync=sync)
        s.validate()
        st = StepStats.from_schedule(s, model)
        ratios[sync] = (st.bound_ratio, st.round_imbalance / st.round_lower_bound)
    assert ratios["lockstep"][1] < 1.01 and ratios["replica"][0] < 1.002  # each wins its own goal
    assert ratios["lockstep"][0] > 1.05 and ratios["replica"][1] > ratios["lockstep"][1]  # ... at a price
    with pytest.raises(ValueError, match="unknown option"):
        get_scheduler("balanced", objective="rounds")  # the sync says what to balance


def test_equal_lengths_stay_on_their_rank():
    from seqpack.schedulers.request import default_origin

    for n, dp in ((256, 8), (96, 8), (4096, 256)):
        s = get_scheduler("balanced").schedule(np.full(n, 4096), dp_size=dp, max_tokens_per_rank=16384)
        replica, _, _ = s.placement()
        assert np.array_equal(replica, default_origin(n, dp))
    # A custom origin is honoured too.
    origin = np.arange(64) % 4
    s = get_scheduler("balanced").schedule(np.full(64, 100), dp_size=4, max_tokens_per_rank=800, origin=origin)
    assert np.array_equal(s.placement()[0], origin)


def test_relabeling_replicas_moves_fewer_tokens_and_changes_no_figure():
    from seqpack.schedulers.balanced import relabel_replicas
    from seqpack.schedulers.request import default_origin

    lengths = _lognormal(640, 9)
    origin = default_origin(640, 16)
    plan = plan_balanced(lengths, default_cost_model().cost(lengths), dp_size=16, capacity=16384, origin=origin)
    renamed = relabel_replicas(plan.replica_of, origin, lengths, 16)
    stay_before = lengths[plan.replica_of == origin].sum()
    stay_after = lengths[renamed == origin].sum()
    assert stay_after > stay_before
    # A renaming: replicas map one to one, so every replica keeps its exact set of sequences.
    pairs = set(zip(plan.replica_of.tolist(), renamed.tolist(), strict=True))
    assert len(pairs) == 16 and len({a for a, _ in pairs}) == len({b for _, b in pairs}) == 16


def test_balanced_accepts_a_constant_only_cost_model():
    """CostModel(0, 0, c): every microbatch costs the same, so the fewest microbatches win."""
    lengths = lognormal_lengths(200, min_seq_len=16, max_seq_len=4096, mean_seq_len=800, seed=3)
    schedule = get_scheduler("balanced").schedule(
        lengths, dp_size=4, max_tokens_per_rank=8192, cost=CostModel(0, 0, 0.02)
    )
    schedule.validate(lengths)
    lower = -(-int(np.sum(lengths)) // (4 * 8192))
    assert schedule.num_microbatches == lower
