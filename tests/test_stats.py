import dataclasses

import numpy as np
import pytest

from seqpack.cost import CostModel
from seqpack.schedulers import Schedule, get_scheduler
from seqpack.schedulers.objective import microbatch_costs, round_lower_bound
from seqpack.stats import StepStats, moved_tokens

QUAD = CostModel(1.0, 0.5, constant=2.0)


def _schedule(assignment, lengths, dp, cap=100, pad_multiple=1, cp=1):
    lengths = np.array(lengths, dtype=np.int64)
    return Schedule.from_assignment(
        [[np.array(ids, dtype=np.int64) for ids in row] for row in assignment],
        lengths=lengths,
        original_lengths=lengths.copy(),
        dp_size=dp,
        cp_size=cp,
        max_tokens_per_rank=cap,
        pad_multiple=pad_multiple,
    )


def test_hand_computed_step():
    # Round 0: replica 0 holds lengths 4,2; replica 1 holds 6. Round 1: 2 | empty.
    s = _schedule([[[0, 1], [2]], [[3], []]], [4, 2, 6, 2], dp=2, pad_multiple=4)
    s.validate()
    stats = StepStats.from_schedule(s, QUAD, flops=123.0, empty_samples=3)
    # Padded: 4, 4, 8, 4. cost(p) = p + p^2/2 -> 12, 12, 40, 12; constant 2 per microbatch.
    costs = microbatch_costs(s, QUAD)
    assert costs.tolist() == [[26.0, 42.0], [14.0, 2.0]]
    assert stats.replica_cost.tolist() == [40.0, 44.0]
    assert stats.imbalance == pytest.approx(44 / 42)
    assert stats.round_imbalance == pytest.approx((42 + 14) / (34 + 8))
    assert stats.lower_bound == 42.0  # max(84/2, 40 + 2)
    assert stats.bound_ratio == pytest.approx(44 / 42)
    assert stats.real_tokens == stats.seqlen_sum == 14
    assert stats.seqlen_sq_sum == 16 + 4 + 36 + 4
    assert stats.padded_tokens == 20 + 4  # the empty microbatch's filler counts pad_multiple
    assert stats.pad_fraction == pytest.approx(1 - 14 / 24)
    assert stats.min_microbatches == 1 and stats.num_microbatches == 2
    assert stats.num_sequences == 4 and stats.empty_samples == 3 and stats.flops == 123.0
    # Without a cost model: padded tokens.
    assert StepStats.from_schedule(s).replica_cost.tolist() == [12.0, 8.0]
    assert set(stats.as_dict()) >= {"replica_cost", "round_lower_bound", "bound_ratio"}
    # One round waits for 42, the other for 14; one replica's total under "replica".
    assert stats.predicted_step_time == 56.0 and stats.cost_model == QUAD
    assert StepStats.from_schedule(s, QUAD, sync="replica").predicted_step_time == 44.0
    assert StepStats.from_schedule(s).predicted_step_time is None


def test_replica_cost_is_one_array_and_stats_compare_by_value():
    # One float64 total per replica in one array: no Python float per replica (dp can be millions).
    s = _schedule([[[0, 1], [2]], [[3], []]], [4, 2, 6, 2], dp=2, pad_multiple=4)
    stats = StepStats.from_schedule(s, QUAD)
    assert isinstance(stats.replica_cost, np.ndarray) and stats.replica_cost.dtype == np.float64
    assert stats == StepStats.from_schedule(s, QUAD) and stats != StepStats.from_schedule(s)
    assert stats != dataclasses.replace(stats, replica_cost=stats.replica_cost[::-1])


def test_a_dynamic_plan_needs_a_cost():
    from seqpack.schedulers import Request
    from seqpack.schedulers.dynamic_cp import plan_dynamic_cp

    plan = plan_dynamic_cp(Request.of(np.array([50, 10]), dp_size=1, cp_size=2, max_tokens_per_rank=64, cost=QUAD))
    with pytest.raises(TypeError, match="cost must be a seqpack.CostModel for a dynamic-CP schedule"):
        StepStats.from_schedule(plan)


def test_microbatch_costs_against_a_loop():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 500, 300)
    s = get_scheduler("balanced").schedule(lengths, dp_size=5, max_tokens_per_rank=2048, pad_multiple=8)
    got = microbatch_costs(s, QUAD)
    for m, row in enumerate(s.assignment):
        for d, ids in enumerate(row):
            padded = -(-lengths[ids] // 8) * 8
            assert got[m, d] == pytest.approx(QUAD.constant + np.sum(padded + 0.5 * padded.astype(float) ** 2))


def test_square_sum_is_exact_beyond_int64():
    lengths = np.array([3_000_000_000, 3_000_000_000, 5])
    s = _schedule([[[0, 1, 2]]], lengths, dp=1, cap=10**10)
    assert StepStats.from_schedule(s).seqlen_sq_sum == 2 * 3_000_000_000**2 + 25


def test_round_lower_bound():
    # One 100-token sequence and many 10-token ones, 2 replicas of capacity 100: a full
    # microbatch of short ones costs 10 * (10 + 50) = 600 < cost(100) = 5100.
    padded = np.array([100] + [10] * 38)
    per_seq = QUAD.cost(padded)
    total = float(per_seq.sum())
    bound = round_lower_bound(padded, per_seq, dp_size=2, capacity=100, total_cost=total)
    knapsack = 5100 + 10 * 60  # the longest 200 tokens: the 100 and ten 10s
    assert bound == pytest.approx((total / 2 + 5100 - knapsack / 2) / (total / 2))
    # Equal lengths: no sequence outweighs a microbatch.
    flat = np.full(40, 10)
    assert round_lower_bound(flat, QUAD.cost(flat), 2, 100, float(QUAD.cost(flat).sum())) == 1.0
    assert round_lower_bound(np.zeros(0, np.int64), np.zeros(0), 2, 100, 0.0) == 1.0
    s = get_scheduler("balanced").schedule(padded, dp_size=2, max_tokens_per_rank=100, cost=QUAD)
    stats = StepStats.from_schedule(s, QUAD)
    assert stats.round_imbalance >= stats.round_lower_bound > 1.0


def test_moved_tokens_count_what_leaves_its_rank():
    # Ids 0, 1 sit on rank 0 and ids 2, 3 on rank 1 (contiguous blocks). Id 1 runs on replica 1
    # and id 2 on replica 0: 2 + 6 tokens cross; each rank sends and receives one sequence.
    s = _schedule([[[0, 2], [1, 3]]], [4, 2, 6, 2], dp=2)
    assert s.origin.tolist() == [0, 0, 1, 1]
    stats = StepStats.from_schedule(s, bytes_per_token=10)
    assert (stats.moved_sequences, stats.moved_tokens) == (2, 8)
    assert stats.moved_fraction == pytest.approx(8 / 14)
    assert stats.max_rank_moved_tokens == 6 and stats.max_rank_moved_bytes == 60.0 and stats.moved_bytes == 80.0
    # Another origin: every sequence already sits where it runs.
    home = dataclasses.replace(s, origin=np.array([0, 1, 0, 1]))
    assert StepStats.from_schedule(home).moved_tokens == 0
    back = Schedule.from_arrays(home.to_arrays())
    assert back.origin.tolist() == [0, 1, 0, 1] and back.fingerprint() == s.fingerprint()


@pytest.mark.parametrize("plan", [None, "plan", np.zeros(3, np.int64)], ids=["None", "str", "array"])
def test_moved_tokens_and_from_schedule_refuse_what_is_not_a_schedule(plan):
    got = type(plan).__name__
    with pytest.raises(TypeError, match=rf"^plan must be a seqpack.Schedule .*, got {got}$"):
        moved_tokens(plan)
    with pytest.raises(TypeError, match=rf"^schedule must be a seqpack.Schedule .*, got {got}$"):
        StepStats.from_schedule(plan)


def test_moved_tokens_under_static_cp_are_the_shards_each_plane_rank_sends():
    # dp=2 x cp=2, padded to multiples of 4: id 1 (6 -> 8 tokens) and id 2 (5 -> 8) change
    # replica. Each CP rank of the reader sends its shard (4 tokens) to the same CP rank of
    # the other replica, so the busiest plane rank moves 4 tokens, not a whole sequence.
    s = _schedule([[[0, 2], [1, 3]]], [4, 6, 5, 2], dp=2, pad_multiple=4, cp=2)
    stats = StepStats.from_schedule(s)
    assert (stats.moved_sequences, stats.moved_tokens) == (2, 16)  # padded shards, as the wire carries them
    assert stats.max_rank_moved_tokens == 4
    per_id, sent, received = moved_tokens(s)
    assert per_id.tolist() == [0, 8, 8, 0] and sent.tolist() == received.tolist() == [4, 4, 4, 4]
    with pytest.raises(ValueError, match=r"origin of sample 3 is DP rank 2, outside 0\.\.1"):
        dataclasses.replace(s, origin=np.array([0, 1, 0, 2])).validate()


def test_a_prediction_given_is_kept_not_made_again():
    from unittest import mock

    from seqpack.schedulers import predicted_step_time

    plan = get_scheduler("balanced").schedule([5, 3, 8, 2, 7, 1], dp_size=2, max_tokens_per_rank=10)
    cost = CostModel(linear=1.0, quadratic=0.5)
    made = StepStats.from_schedule(plan, cost).predicted_step_time
    assert made == predicted_step_time(plan, cost)
    with mock.patch("seqpack.stats.predicted_step_time", wraps=predicted_step_time) as predict:
        assert StepStats.from_schedule(plan, cost, predicted=2.5).predicted_step_time == 2.5
        assert StepStats.from_schedule(plan, None, predicted=2.5).predicted_step_time == 2.5
        assert predict.call_count == 0
