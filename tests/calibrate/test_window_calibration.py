"""A sliding-window cost model through calibration and scheduling: the calibrator fits the
windowed term, its state and the ledger's carry SW, and the schedulers balance the windowed
per-sequence costs."""

import numpy as np
import pytest

from seqpack.calibrate import CostCalibrator, TimingLedger, encode_seconds, microbatch_sums
from seqpack.cost import CostModel, model_preset, window_feature
from seqpack.errors import ResumeError
from seqpack.schedulers import get_scheduler, predicted_step_time
from seqpack.stats import StepStats

WINDOW = 128
TRUTH = CostModel(3e-7, 1e-11, 0.004, windowed=4e-10, window=WINDOW)  # seconds


def _microbatches(rng, count):
    return [rng.integers(16, 4096, rng.integers(1, 6)).tolist() for _ in range(count)]


def test_calibrator_with_a_windowed_prior_fits_the_windowed_term():
    prior = model_preset("gpt-oss-20b").cost_model()
    assert prior.window == WINDOW
    cal = CostCalibrator(prior, min_points=16, warmup_steps=0, keep_prior_shape=False)
    assert cal.terms == ("constant", "linear", "quadratic", "windowed")
    rng = np.random.default_rng(0)
    for step in range(6):
        mbs = _microbatches(rng, 8)
        cal.observe(mbs, [TRUTH.microbatch_cost(mb) for mb in mbs], step=step)
    model = cal.model
    assert cal.fitted and model.window == WINDOW
    for name in ("linear", "quadratic", "constant", "windowed"):
        assert getattr(model, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6), name


def test_windowed_prior_shape_is_kept_when_the_clock_follows_it():
    prior = model_preset("gemma3-27b").cost_model()
    clock = CostModel(prior.linear * 1e-16, prior.quadratic * 1e-16, windowed=prior.windowed * 1e-16, window=1024)
    cal = CostCalibrator(prior, min_points=16, warmup_steps=0)
    rng = np.random.default_rng(1)
    for step in range(6):
        mbs = _microbatches(rng, 8)
        cal.observe(mbs, np.array([clock.microbatch_cost(mb) for mb in mbs]) * rng.uniform(0.97, 1.03, 8), step=step)
    model = cal.model
    assert cal.shape == "prior" and model.window == 1024
    assert model.windowed / model.linear == pytest.approx(prior.windowed / prior.linear, rel=1e-12)


def test_windowed_state_round_trips_and_another_window_is_refused():
    rng = np.random.default_rng(2)
    mbs = _microbatches(rng, 40)
    times = [TRUTH.microbatch_cost(mb) for mb in mbs]
    cal = CostCalibrator(TRUTH, min_points=8, warmup_steps=0)
    cal.observe(mbs, times, step=3)
    state = cal.state_dict()
    assert state["window"] == WINDOW and len(state["points"][0]) == 5
    again = CostCalibrator(TRUTH, min_points=8, warmup_steps=0)
    again.load_state_dict(state)
    assert again.model == cal.model and again.num_points == 40
    plain = CostCalibrator(CostModel(1.0, 0.0), min_points=8)
    with pytest.raises(ResumeError, match="for window=128; this calibrator keeps .* for window=None"):
        plain.load_state_dict(state)
    points = [[100, 10000, 0.5, 2], [50, 2500, 0.25, 2]]
    unwindowed = {"version": 2, "sums": ["seqlen_sum", "seqlen_sq_sum"], "window": None, "points": points}
    unwindowed.update(skipped=1, observed=2, last_step=2)
    plain.load_state_dict(unwindowed)
    assert plain.num_points == 2 and plain.state_dict() == unwindowed
    with pytest.raises(ResumeError, match="for window=None; this calibrator keeps .* for window=128"):
        again.load_state_dict(unwindowed)


def _schedule(seed, dp=2):
    lengths = np.random.default_rng(seed).integers(16, 1024, 24)
    return get_scheduler("balanced").schedule(lengths, dp_size=dp, max_tokens_per_rank=2048, pad_multiple=8)


def test_microbatch_sums_with_a_window_are_exact():
    schedule = _schedule(0)
    sums = microbatch_sums(schedule, WINDOW)
    assert sums.shape == (schedule.num_microbatches, 2, 3)
    assert np.array_equal(sums[..., :2], microbatch_sums(schedule))
    padded = -(-schedule.lengths // 8) * 8
    seen_beyond = False
    for m, row in enumerate(schedule.assignment):
        for d, ids in enumerate(row):
            lengths = padded[ids].tolist() or [8]  # an empty cell runs a filler of pad_multiple tokens
            assert sums[m, d, 2] == sum(window_feature(s, WINDOW) for s in lengths)
            seen_beyond |= any(s > WINDOW + 1 for s in lengths)
    assert seen_beyond


def test_ledger_carries_the_window_sums_and_predicts_with_them():
    cal = CostCalibrator(TRUTH, min_points=3, warmup_steps=0, prior_in_seconds=True)
    ledger = TimingLedger(cal, dp_size=2, dp_rank=0)
    schedule = _schedule(1)
    with pytest.raises(ValueError, match=r"shape \[M, 2, 3\] \(CostCalibrator.schedule_sums\(schedule\): .*window_sum"):
        ledger.add_step(0, microbatch_sums(schedule), TRUTH)
    ledger.add_schedule(0, schedule, TRUTH)
    sums = microbatch_sums(schedule, WINDOW)
    true = TRUTH.predict_sums(sums)  # [M, dp] seconds
    (got,) = ledger.incoming(1, np.stack([encode_seconds(true[:, d] * 1.25) for d in range(2)]))
    assert got.error == pytest.approx(1 / 1.25 - 1)
    assert cal.num_points == 2 * schedule.num_microbatches
    fresh = TimingLedger(CostCalibrator(TRUTH, min_points=3, warmup_steps=0), dp_size=2, dp_rank=0)
    ledger.add_schedule(2, _schedule(2), TRUTH)
    fresh.load_state_dict(ledger.state_dict())
    assert fresh.pending() == [2] and fresh.state_dict() == ledger.state_dict()


def test_schedulers_balance_the_windowed_costs():
    """The schedulers take per-sequence costs from CostModel.cost, so a windowed model needs
    no kernel change: a plan made for it beats, under it, a plan made for full attention."""
    spec = model_preset("gpt-oss-20b")
    windowed = spec.cost_model()
    full = CostModel(windowed.linear, windowed.quadratic + windowed.windowed)
    lengths = np.random.default_rng(3).lognormal(7.5, 1.2, 512).clip(32, 32768).astype(np.int64)
    plans = {}
    for name, model in (("windowed", windowed), ("full", full)):
        plans[name] = get_scheduler("balanced").schedule(
            lengths, dp_size=8, max_tokens_per_rank=65536, cost=model, sync="replica"
        )
        plans[name].validate(lengths)
    stats = StepStats.from_schedule(plans["windowed"], windowed)
    per_replica = [
        sum(windowed.microbatch_cost(lengths[ids]) for ids in (row[d] for row in plans["windowed"].assignment))
        for d in range(8)
    ]
    assert stats.replica_cost == pytest.approx(per_replica, rel=1e-12)
    under = {name: predicted_step_time(plan, windowed, sync="replica") for name, plan in plans.items()}
    assert under["windowed"] < under["full"]
