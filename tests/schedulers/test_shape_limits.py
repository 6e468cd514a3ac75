"""Static shapes on the scheduler side (seqpack.schedulers.shape_limits): ``max_sequences``
and the largest token bucket as hard limits of every scheduler's plans, bucket padding
priced in the predicted step time and StepStats (against slow references computed from the
plan's microbatches), and buckets chosen by cost (static_shapes_by_cost)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest

from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ScheduleError, SeqpackTypeError
from seqpack.schedulers import get_scheduler, predicted_step_time, static_shapes_by_cost
from seqpack.schedulers.balanced import plan_balanced
from seqpack.schedulers.bucket_ladder import ladder_for
from seqpack.schedulers.minibatches import schedule_minibatches
from seqpack.schedulers.objective import step_objective
from seqpack.schedulers.request import Request
from seqpack.schedulers.sample_groups import schedule_groups
from seqpack.schedulers.shape_limits import BucketPrice, fit_sequence_limit, trim_to_buckets
from seqpack.stats import StepStats
from seqpack.thd import StaticShapes, padded_lengths

COST = CostModel(linear=1.0, quadratic=0.01, constant=5.0)
SHAPES = StaticShapes(token_buckets=(64, 128, 256), max_sequences=4)  # 3 real sequences a pack


def short_lengths(n: int = 200, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60, size=n)


def slow_limits_held(plan, shapes: StaticShapes) -> None:
    """Every microbatch, read from the assignment: at most max_real_sequences ids and the
    largest bucket's padded tokens; every id once in assigned, deferred or dropped."""
    largest = shapes.buckets(min(plan.capacity, 2**31 - 1))[-1]
    seen: list[int] = []
    for row in plan.assignment:
        for ids in row:
            assert len(ids) <= shapes.max_real_sequences
            assert sum(-(-int(plan.lengths[i]) // plan.pad_multiple) * plan.pad_multiple for i in ids) <= largest
            seen.extend(int(i) for i in ids)
    seen.extend(int(i) for i in plan.deferred)
    seen.extend(int(i) for i in plan.dropped)
    assert sorted(seen) == list(range(plan.lengths.shape[0]))


@pytest.mark.parametrize("name", ["balanced", "dp_balanced", "empty"])
@pytest.mark.parametrize("sync", [None, "lockstep", "replica"])
def test_every_grid_scheduler_keeps_max_sequences_and_the_largest_bucket(name, sync):
    lengths = short_lengths()
    options = {} if sync is None else {"sync": sync}
    free = get_scheduler(name).schedule(lengths, dp_size=4, max_tokens_per_rank=256, cost=COST, **options)
    assert free.group_counts.max() > SHAPES.max_real_sequences  # the limit binds
    with pytest.raises(ScheduleError, match="max_real_sequences"):
        free.validate(lengths, static_shapes=SHAPES)
    plan = get_scheduler(name).schedule(
        lengths, dp_size=4, max_tokens_per_rank=256, cost=COST, static_shapes=SHAPES, **options
    )
    plan.validate(lengths, dp_size=4, max_tokens_per_rank=256, static_shapes=SHAPES)
    slow_limits_held(plan, SHAPES)


def test_balanced_starts_its_count_at_n_over_dp_times_the_slots():
    lengths = short_lengths(100)
    plan = get_scheduler("balanced").schedule(lengths, dp_size=2, max_tokens_per_rank=4096, static_shapes=SHAPES)
    assert plan.num_microbatches == -(-100 // (2 * 3))  # 17: tokens alone need 1
    slow_limits_held(plan, SHAPES)


def test_largest_bucket_below_the_capacity_is_the_token_limit():
    lengths = short_lengths()
    shapes = StaticShapes(token_buckets=(32, 96), max_sequences=64, tail_padding="extend_last")
    for name in ("balanced", "dp_balanced", "empty"):
        plan = get_scheduler(name).schedule(lengths, dp_size=3, max_tokens_per_rank=512, static_shapes=shapes)
        assert plan.group_tokens().max() <= 96 and plan.max_tokens_per_rank == 512
        slow_limits_held(plan, shapes)
    with pytest.raises(ScheduleError, match="96"):  # a sequence longer than the largest bucket
        get_scheduler("balanced").schedule([100, 5], dp_size=1, max_tokens_per_rank=512, static_shapes=shapes)


def test_empty_moves_no_sample_under_static_shapes():
    lengths = short_lengths()
    plan = get_scheduler("empty").schedule(lengths, dp_size=4, max_tokens_per_rank=256, static_shapes=SHAPES)
    slow_limits_held(plan, SHAPES)
    assert np.array_equal(plan.replica_of(), plan.origin)


def test_forced_count_too_small_for_the_slots_is_refused_by_name_with_the_count_that_holds():
    kwargs = {"dp_size": 2, "max_tokens_per_rank": 4096, "static_shapes": SHAPES}
    with pytest.raises(ScheduleError, match=r"num_microbatches=2 .* take (\d+) microbatches") as refused:
        get_scheduler("balanced", num_microbatches=2).schedule(np.full(40, 4), **kwargs)
    needed = int(re.search(r"raise num_microbatches to (\d+)", str(refused.value)).group(1))
    assert needed > 2
    plan = get_scheduler("balanced", num_microbatches=needed).schedule(np.full(40, 4), **kwargs)
    assert plan.num_microbatches == needed
    slow_limits_held(plan, SHAPES)


def test_dynamic_cp_refuses_static_shapes():
    scheduler = get_scheduler("dynamic_cp")
    with pytest.raises(ConfigError, match="static_shapes is not supported by scheduler 'dynamic_cp'"):
        scheduler.schedule(short_lengths(), dp_size=2, cp_size=2, max_tokens_per_rank=256, static_shapes=SHAPES)


def test_a_wrong_type_is_refused_by_name():
    with pytest.raises(SeqpackTypeError, match="static_shapes"):
        get_scheduler("balanced").schedule([1, 2], dp_size=1, max_tokens_per_rank=8, static_shapes=(8, 16))


@pytest.mark.parametrize("together", [False, True])
def test_groups_stay_on_one_replica_within_the_limits(together):
    lengths = short_lengths(120, seed=4)
    groups = np.arange(120) // 6  # groups of 6 sequences: more than 3 a microbatch
    plan = schedule_groups(
        get_scheduler("balanced"),
        Request.of(lengths, dp_size=3, max_tokens_per_rank=256, static_shapes=SHAPES),
        groups,
        np.ones(120, bool),
        together=together,
    )
    plan.validate(lengths, static_shapes=SHAPES)
    slow_limits_held(plan, SHAPES)
    replica = plan.replica_of()
    for g in np.unique(groups):
        assert np.unique(replica[groups == g]).size == 1


def test_groups_repair_weighs_the_sample_cost_as_every_static_plan():
    """``together`` packs replica 0's microbatches [1] (50 tokens and an image costing 100),
    [0] (70 tokens) and [4, 7, 8] (three sequences, two slots). The repair moves 7 (20 tokens)
    to the least loaded of the two with a slot: [0], as GridScheduler's repair weighs it;
    weighed by tokens alone, [1] (its round then the step's slowest: 576)."""
    lengths = np.array([70, 50, 90, 20, 20, 80, 80, 20, 40])
    groups = np.array([2, 2, 8, 8, 6, 1, 1, 6, 5])
    shapes = StaticShapes(token_buckets=(50, 100), max_sequences=2, tail_padding="extend_last")
    image = np.where(np.arange(9) == 1, 100.0, 0.0)
    request = Request.of(
        lengths, dp_size=2, max_tokens_per_rank=100, cost=COST, static_shapes=shapes, sample_cost=image
    )
    plan = schedule_groups(get_scheduler("balanced"), request, groups, np.ones(9, bool), together=True)
    slow_limits_held(plan, shapes)
    assert predicted_step_time(plan, COST, static_shapes=shapes) == pytest.approx(528.0)


@pytest.mark.parametrize("together", [False, True])
def test_groups_keep_a_forced_count_under_static_shapes(together):
    """``together`` packs 14 microbatches of its own here: it once gave 14 for a forced 16
    and for a forced 13 alike (the repair adding rounds past the count)."""
    lengths = short_lengths(120, seed=4)  # 40 sequences a replica: 14 microbatches of 3
    request = Request.of(lengths, dp_size=3, max_tokens_per_rank=256, cost=COST, static_shapes=SHAPES)
    groups, grouped = np.arange(120) // 6, np.ones(120, bool)
    for forced in (14, 16):
        plan = schedule_groups(
            get_scheduler("balanced", num_microbatches=forced), request, groups, grouped, together=together
        )
        assert plan.num_microbatches == forced
        slow_limits_held(plan, SHAPES)
    with pytest.raises(ScheduleError, match="num_microbatches=13"):
        schedule_groups(get_scheduler("balanced", num_microbatches=13), request, groups, grouped, together=together)


def test_minibatches_pass_static_shapes_to_every_part():
    lengths = short_lengths(160, seed=5)
    plan, starts = schedule_minibatches(
        get_scheduler("balanced"),
        Request.of(lengths, dp_size=4, max_tokens_per_rank=256, static_shapes=SHAPES),
        minibatches=2,
    )
    slow_limits_held(plan, SHAPES)
    assert len(starts) == 3


def test_the_repair_returns_a_plan_within_the_limit_unchanged():
    rounds = [[np.array([0, 1]), np.array([2])], [np.array([3]), np.array([], dtype=np.int64)]]
    padded = np.array([4, 4, 4, 4])
    fixed = fit_sequence_limit(rounds, padded, padded.astype(float), limit=2, capacity=8)
    assert [[a.tolist() for a in row] for row in fixed] == [[[0, 1], [2]], [[3], []]]
    # Over the limit: the shortest id moves to the same round's other microbatch.
    rounds = [[np.array([0, 1, 2]), np.array([3])]]
    padded = np.array([5, 2, 4, 1])
    fixed = fit_sequence_limit(rounds, padded, padded.astype(float), limit=2, capacity=8)
    assert [[a.tolist() for a in row] for row in fixed] == [[[0, 2], [1, 3]]]


def slow_step_time(plan, cost: CostModel, shapes: StaticShapes, sync: str) -> float:
    """From the assignment: each microbatch's constant + sum(cost) + linear * bucket padding
    (an empty one: its pad_multiple filler's bucket)."""
    buckets = shapes.buckets(plan.capacity)
    times = np.zeros((plan.num_microbatches, plan.dp_size))
    for m, row in enumerate(plan.assignment):
        for d, ids in enumerate(row):
            padded = [-(-int(plan.lengths[i]) // plan.pad_multiple) * plan.pad_multiple for i in ids]
            tokens = sum(padded) if ids.size else plan.pad_multiple
            bucket = next(b for b in buckets if b >= tokens)
            compute = sum(cost.linear * p + cost.quadratic * p * p for p in padded)
            times[m, d] = cost.constant + compute + cost.linear * (bucket - tokens)
    return float(times.max(axis=1).sum() if sync == "lockstep" else times.sum(axis=0).max())


@pytest.mark.parametrize("sync", ["lockstep", "replica"])
@pytest.mark.parametrize("name", ["balanced", "dp_balanced", "empty"])
def test_predicted_step_time_and_stats_price_bucket_padding_as_the_slow_reference(sync, name):
    lengths = short_lengths(150, seed=7)
    plan = get_scheduler(name).schedule(
        lengths, dp_size=4, max_tokens_per_rank=128, pad_multiple=4, cost=COST, static_shapes=SHAPES
    )
    want = slow_step_time(plan, COST, SHAPES, sync)
    assert predicted_step_time(plan, COST, sync=sync, static_shapes=SHAPES) == pytest.approx(want, rel=1e-12)
    assert predicted_step_time(plan, COST, sync=sync) < want  # without buckets: less
    stats = StepStats.from_schedule(plan, COST, sync=sync, static_shapes=SHAPES)
    assert stats.predicted_step_time == pytest.approx(want, rel=1e-12)
    buckets = SHAPES.buckets(plan.capacity)
    slow_tokens = 0
    for row in plan.assignment:
        for ids in row:
            tokens = int(padded_lengths(plan.lengths[ids], 4).sum()) if ids.size else 4
            slow_tokens += next(b for b in buckets if b >= tokens) - tokens
    assert stats.bucket_tokens == slow_tokens > 0
    assert stats.bucket_fraction == pytest.approx(slow_tokens / (stats.padded_tokens + slow_tokens))
    assert max(stats.replica_cost) == pytest.approx(slow_step_time(plan, COST, SHAPES, "replica"))
    plain = StepStats.from_schedule(plan, COST, sync=sync)
    assert plain.bucket_tokens == 0 and plain.bucket_fraction == 0.0 and plain.padded_tokens == stats.padded_tokens


def test_cp_ring_tokens_of_the_bucket_are_priced_too():
    lengths = short_lengths(80, seed=8)
    family = dataclasses.replace(COST, ring_step=2.0, ring_token=0.5, reference_size=2)
    plan = get_scheduler("balanced").schedule(
        lengths, dp_size=2, cp_size=2, max_tokens_per_rank=64, pad_multiple=4, cost=family, static_shapes=SHAPES
    )
    static = family.at(2)  # linear includes the ring's per-token term
    want = slow_step_time(plan, static, SHAPES, "lockstep")
    assert predicted_step_time(plan, family, static_shapes=SHAPES) == pytest.approx(want, rel=1e-12)


def test_stats_refuse_a_plan_larger_than_the_buckets():
    plan = get_scheduler("balanced").schedule(short_lengths(), dp_size=2, max_tokens_per_rank=512)
    with pytest.raises(ScheduleError, match="largest token bucket 256"):
        StepStats.from_schedule(plan, COST, static_shapes=SHAPES)


def test_balanced_compares_counts_with_the_bucket_padding_priced():
    rng = np.random.default_rng(9)
    padded = rng.integers(1, 200, size=300)
    costs = COST.cost(padded)
    price = BucketPrice(np.array([64, 128, 256, 512]), COST.linear)
    for sync in ("lockstep", "replica"):
        plan = plan_balanced(padded, costs, dp_size=4, capacity=512, constant=5.0, sync=sync, price=price)
        priced = plan.load + price.extra(plan.tokens) + 5.0
        assert plan.objective == pytest.approx(step_objective(priced, sync))


def brute_ladder(tokens: np.ndarray, buckets: int, unit: int, top: int) -> int:
    cands = range(unit, top, unit)
    best = None
    for r in range(buckets):
        for chosen in itertools.combinations(cands, r):
            ladder = np.array([*chosen, top])
            pad = int(sum(ladder[np.searchsorted(ladder, t)] - t for t in tokens))
            best = pad if best is None else min(best, pad)
    assert best is not None
    return best


def test_ladder_for_is_the_least_padding_of_a_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(150):
        unit, buckets = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        top = unit * int(rng.integers(1, 12))
        tokens = rng.integers(1, top + 1, size=int(rng.integers(1, 9)))
        ladder = ladder_for(tokens, buckets=buckets, unit=unit, top=top)
        assert len(ladder) <= buckets and ladder[-1] == top and all(b % unit == 0 for b in ladder)
        arr = np.array(ladder)
        assert int(sum(arr[np.searchsorted(arr, t)] - t for t in tokens)) == brute_ladder(tokens, buckets, unit, top)


def test_by_cost_picks_buckets_no_slower_than_one_bucket():
    rng = np.random.default_rng(2)
    steps = [rng.integers(16, 900, size=96) for _ in range(2)]
    limits = dict(max_tokens_per_rank=1000, dp_size=4, pad_multiple=8)
    shapes = static_shapes_by_cost(steps, buckets=4, max_sequences=6, cost=COST, **limits)
    assert isinstance(shapes.token_buckets, tuple) and 1 <= len(shapes.token_buckets) <= 4
    assert shapes.token_buckets[-1] == 1000 and all(b % 8 == 0 for b in shapes.token_buckets)
    assert shapes.max_sequences == 6

    def mean_time(s: StaticShapes) -> float:
        scheduler = get_scheduler("balanced")
        plans = [scheduler.schedule(x, cost=COST, sync="lockstep", static_shapes=s, **limits) for x in steps]
        return float(np.mean([predicted_step_time(p, COST, static_shapes=s) for p in plans]))

    one = StaticShapes(token_buckets=(1000,), max_sequences=6)
    assert mean_time(shapes) <= mean_time(one)
    assert len(shapes.token_buckets) > 1  # buckets pay here: packs are not all full


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": []}, "steps must be a non-empty list"),
        ({"buckets": 0}, "buckets"),
        ({"max_tokens_per_rank": 4, "pad_multiple": 8}, "holds no multiple of pad_multiple=8"),
    ],
)
def test_by_cost_refuses_by_name(kwargs, match):
    base = dict(steps=[[5, 6, 7]], buckets=2, max_sequences=4, max_tokens_per_rank=64, dp_size=1)
    with pytest.raises(ConfigError, match=match):
        static_shapes_by_cost(**{**base, **kwargs})


def test_a_capacity_past_int32_keeps_the_buckets():
    # "capacity" resolves to at most the largest int32 token count (a pack's); a ladder is as given.
    for shapes, largest in ((SHAPES, 256), (StaticShapes(max_sequences=4), 2**31 - 1)):
        plan = get_scheduler("balanced").schedule(
            short_lengths(), dp_size=2, max_tokens_per_rank=2**31, static_shapes=shapes
        )
        slow_limits_held(plan, shapes)
        assert predicted_step_time(plan, COST, static_shapes=shapes) > 0
        assert plan.group_tokens().max() <= largest


def test_trim_under_replica_sync_moves_within_a_replica_too():
    price = BucketPrice(np.array([64, 128]), 1.0)
    padded = np.array([60, 10, 20, 64, 64])  # replica 0: 70 then 20 tokens; replica 1: 64 and 64, full
    rounds = [[np.array([0, 1]), np.array([3])], [np.array([2]), np.array([4])]]
    out = trim_to_buckets(
        rounds, padded, padded * 1.0, price=price, limit=4, capacity=128, constant=0.0, sync="replica"
    )
    assert [[a.tolist() for a in row] for row in out] == [[[0], [3]], [[1, 2], [4]]]  # 60 and 30: both in 64
    # Under lockstep the other round is not a target (round 0's other microbatch is full).
    out = trim_to_buckets(
        rounds, padded, padded * 1.0, price=price, limit=4, capacity=128, constant=0.0, sync="lockstep"
    )
    assert [[a.tolist() for a in row] for row in out] == [[[0, 1], [3]], [[2], [4]]]


def test_trim_brings_a_microbatch_below_its_bucket_edge():
    price = BucketPrice(np.array([64, 128]), 1.0)
    padded = np.array([40, 20, 10, 20])  # replica 0: 70 tokens (bucket 128), replica 1: 20 (bucket 64)
    rounds = [[np.array([0, 1, 2]), np.array([3])]]
    for sync in ("lockstep", "replica"):
        out = trim_to_buckets(rounds, padded, padded * 1.0, price=price, limit=4, capacity=128, constant=0.0, sync=sync)
        assert [[a.tolist() for a in row] for row in out] == [[[0, 1], [2, 3]]]  # 60 | 30: both in 64
    # Without a free slot in the target, nothing moves.
    out = trim_to_buckets(
        rounds, padded, padded * 1.0, price=price, limit=1, capacity=128, constant=0.0, sync="lockstep"
    )
    assert out[0][1].tolist() == [3] and out[0][0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("sync", ["lockstep", "replica"])
def test_trim_never_lengthens_the_step_and_keeps_every_id(sync):
    rng = np.random.default_rng(11)
    price = BucketPrice(np.array([32, 48, 64, 96, 128]), 1.0)
    for _ in range(40):
        dp, m = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        padded = rng.integers(1, 40, size=60)
        weight = padded + 0.01 * padded**2
        order = rng.permutation(60)
        rounds, start = [], 0
        for _r in range(m):
            row = []
            for _d in range(dp):
                ids, used = [], 0
                while start < 60 and used + padded[order[start]] <= 128 and len(ids) < 6:
                    used += padded[order[start]]
                    ids.append(int(order[start]))
                    start += 1
                row.append(np.sort(np.array(ids, dtype=np.int64)))
            rounds.append(row)

        def objective(grid, padded=padded, weight=weight):
            tokens = np.array([[int(padded[ids].sum()) for ids in row] for row in grid])
            load = np.array([[float(weight[ids].sum()) for ids in row] for row in grid]) + 2.0
            return step_objective(load + price.extra(tokens), sync)

        out = trim_to_buckets(rounds, padded, weight, price=price, limit=6, capacity=128, constant=2.0, sync=sync)
        assert objective(out) <= objective(rounds) + 1e-9
        before = sorted(int(i) for row in rounds for ids in row for i in ids)
        assert sorted(int(i) for row in out for ids in row for i in ids) == before
        # A move stays within its round, or (replica sync alone) within its replica.
        where_in = {int(i): (r, c) for r, row in enumerate(rounds) for c, ids in enumerate(row) for i in ids}
        where_out = {int(i): (r, c) for r, row in enumerate(out) for c, ids in enumerate(row) for i in ids}
        for i, (r, c) in where_in.items():
            r2, c2 = where_out[i]
            assert r2 == r or (sync == "replica" and c2 == c)
        assert all(len(ids) <= 6 and int(padded[ids].sum()) <= 128 for row in out for ids in row)


def test_pricing_the_buckets_chooses_the_count(monkeypatch):
    # sft-long-tail of benchmarks/schedulers.py, step 1, one bucket (the capacity): without the
    # price `balanced` plans 3 microbatches whose third round pads to the capacity.
    from seqpack.cost import model_preset
    from seqpack.mock_data import generate_lengths
    from seqpack.schedulers.balanced import scheduler as balanced_module

    lengths = generate_lengths(
        "lognormal", 4096, min_seq_len=128, max_seq_len=32768, mean_seq_len=4096, sigma=1.1, seed=1
    )
    cost = model_preset("llama3-8b").cost_model()
    shapes = StaticShapes(max_sequences=200)
    limits = dict(dp_size=256, cp_size=2, max_tokens_per_rank=16384, pad_multiple=4, cost=cost, sync="replica")
    priced = get_scheduler("balanced").schedule(lengths, static_shapes=shapes, **limits)

    class Unpriced(BucketPrice):
        @classmethod
        def of(cls, *args):
            return None

    monkeypatch.setattr(balanced_module, "BucketPrice", Unpriced)  # the count search alone
    unpriced = get_scheduler("balanced").schedule(lengths, static_shapes=shapes, **limits)
    assert (priced.num_microbatches, unpriced.num_microbatches) == (2, 3)
    ratio = predicted_step_time(priced, cost, sync="replica", static_shapes=shapes) / predicted_step_time(
        unpriced, cost, sync="replica", static_shapes=shapes
    )
    assert ratio < 0.75  # 0.729


def test_schedule_groups_under_dynamic_cp_refuses_static_shapes():
    scheduler = get_scheduler("dynamic_cp")
    lengths = short_lengths(20)
    with pytest.raises(ConfigError, match="static_shapes is not supported by schedule_groups under dynamic CP"):
        schedule_groups(
            scheduler,
            Request.of(lengths, dp_size=2, cp_size=2, max_tokens_per_rank=256, static_shapes=SHAPES),
            np.zeros(20),
            np.ones(20, bool),
        )


def test_stats_without_a_cost_count_bucket_tokens_in_the_replica_totals():
    lengths = short_lengths(90, seed=12)
    plan = get_scheduler("dp_balanced").schedule(lengths, dp_size=3, max_tokens_per_rank=128, static_shapes=SHAPES)
    stats = StepStats.from_schedule(plan, static_shapes=SHAPES)
    buckets = SHAPES.buckets(plan.capacity)
    per_replica = [0] * 3
    for row in plan.assignment:
        for d, ids in enumerate(row):
            tokens = int(plan.lengths[ids].sum()) if ids.size else 1  # an empty one: its 1-token filler
            # The pack's tokens (a filler costs nothing without a model) plus the bucket's padding.
            per_replica[d] += next(b for b in buckets if b >= tokens) - (0 if ids.size else 1)
    assert stats.replica_cost.tolist() == [float(v) for v in per_replica]
    empty = int(np.count_nonzero(plan.group_counts == 0))
    assert stats.predicted_step_time is None
    assert stats.bucket_tokens == sum(per_replica) + empty - stats.padded_tokens
