"""CostCalibrator and TimingLedger (issue 10, item 3): pure logic, one process."""

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.calibrate import (
    ABSENT,
    INVALID,
    MISSING,
    CostCalibrator,
    TimingLedger,
    decode_seconds,
    encode_seconds,
    microbatch_sums,
)
from seqpack.cost import CostModel, default_cost_model
from seqpack.schedulers import get_scheduler
from seqpack.schedulers.objective import step_objective

TRUTH = CostModel(7.32e-7, 7.84e-11, 0.020)


def _microbatches(rng, count):
    return [rng.integers(64, 4096, rng.integers(1, 8)).tolist() for _ in range(count)]


def _times(model, mbs):
    return [model.microbatch_cost(mb) for mb in mbs]


def test_prior_until_min_points_then_the_fit():
    prior = default_cost_model()
    cal = CostCalibrator(prior, min_points=10, warmup_steps=0)
    rng = np.random.default_rng(0)
    mbs = _microbatches(rng, 9)
    assert cal.observe(mbs, _times(TRUTH, mbs), step=0) == 9
    assert cal.model is prior and not cal.fitted
    mbs = _microbatches(rng, 5)
    cal.observe(mbs, _times(TRUTH, mbs), step=1)
    assert cal.fitted and cal.num_points == 14 and cal.last_step == 1
    for name in ("linear", "quadratic", "constant"):
        assert getattr(cal.model, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6)


def test_warm_up_steps_are_left_out():
    cal = CostCalibrator(TRUTH, min_points=3, warmup_steps=2)
    assert cal.observe([[10], [20]], [3.0, 3.0], step=0) == 0
    assert cal.observe([[10], [20]], [3.0, 3.0], step=1) == 0
    assert cal.observe([[10], [20]], [0.1, 0.2], step=2) == 2
    assert cal.observe([[10]], [0.1]) == 1  # no step: nothing to tell warm-up by
    assert cal.num_points == 3 and cal.last_step == 2 and cal.skipped == 0


def test_prior_shape_is_kept_unless_the_timings_contradict_it():
    """A clock shaped like the prior (FLOPs on a compute-bound GPU): the model is the prior
    rescaled, so schedules stay the prior's; a launch-bound clock: 3 coefficients."""
    rng = np.random.default_rng(6)
    flops = default_cost_model()
    scaled = CostModel(flops.linear * 1e-15, flops.quadratic * 1e-15)
    for clock, shape in ((scaled, "prior"), (TRUTH, "fitted")):
        cal = CostCalibrator(flops, min_points=16)
        for step in range(1, 8):
            mbs = _microbatches(rng, 8)
            cal.observe(mbs, np.array(_times(clock, mbs)) * rng.uniform(0.95, 1.05, 8), step=step)
        model = cal.model
        assert cal.shape == shape
        if shape == "prior":
            assert model.quadratic / model.linear == pytest.approx(flops.quadratic / flops.linear, rel=1e-12)
            assert model.linear == pytest.approx(scaled.linear, rel=0.02)
        else:
            assert model.constant == pytest.approx(TRUTH.constant, rel=0.1)
    assert not CostCalibrator(flops, keep_prior_shape=False).keep_prior_shape


def test_bad_timings_are_skipped_and_counted():
    cal = CostCalibrator(TRUTH, min_points=3)
    kept = cal.observe([[10], [20], [30], [40], [50]], [0.1, float("nan"), float("inf"), 0.0, -1.0])
    assert kept == 1 and cal.skipped == 4 and cal.num_points == 1 and cal.observed == 1


def test_observe_checks_its_arguments():
    cal = CostCalibrator(TRUTH)
    with pytest.raises(ValueError, match=r"2 microbatches \(microbatch_lengths\) but 1 timings \(seconds\)"):
        cal.observe([[1], [2]], [0.1])
    with pytest.raises(ValueError, match="negative length"):
        cal.observe([[-1]], [0.1])
    with pytest.raises(ValueError, match="step must be"):
        cal.observe([[1]], [0.1], step=-1)
    with pytest.raises(TypeError, match="prior must be a seqpack.CostModel"):
        CostCalibrator(None)
    with pytest.raises(ValueError, match="min_points=50 is larger than window=10"):
        CostCalibrator(TRUTH, window=10, min_points=50)


def test_deterministic_and_resumable_bit_for_bit():
    rng = np.random.default_rng(1)
    mbs = _microbatches(rng, 200)
    noisy = [t * f for t, f in zip(_times(TRUTH, mbs), rng.uniform(0.95, 1.05, 200), strict=True)]
    a, b = CostCalibrator(default_cost_model(), window=128), CostCalibrator(default_cost_model(), window=128)
    for cal in (a, b):
        for k in range(0, 200, 10):
            cal.observe(mbs[k : k + 10], noisy[k : k + 10], step=k // 10 + 1)
    assert a.model == b.model  # exact float equality
    c = CostCalibrator(default_cost_model(), window=128)
    c.load_state_dict(a.state_dict())
    assert c.model == a.model and c.num_points == 128 and c.last_step == 20 and c.observed == 200
    with pytest.raises(ValueError, match="version 7 is not 2"):
        c.load_state_dict({"version": 7})


def test_window_follows_a_changing_clock():
    cal = CostCalibrator(TRUTH, window=64, min_points=16)
    rng = np.random.default_rng(2)
    slower = CostModel(2 * TRUTH.linear, 2 * TRUTH.quadratic, 2 * TRUTH.constant)
    for step in range(20):
        mbs = _microbatches(rng, 8)
        cal.observe(mbs, _times(TRUTH if step < 10 else slower, mbs), step=step)
    assert cal.model.constant == pytest.approx(slower.constant, rel=1e-6)


def test_robust_calibration_ignores_a_compile_step():
    rng = np.random.default_rng(3)
    cal = CostCalibrator(default_cost_model(), min_points=16)
    for step in range(12):
        mbs = _microbatches(rng, 8)
        times = np.array(_times(TRUTH, mbs)) * rng.uniform(0.95, 1.05, 8)
        if step == 0:
            times *= 3.0  # the first step compiles
        cal.observe(mbs, times, step=step)
    check = _microbatches(rng, 50)
    pred = np.array([cal.model.microbatch_cost(mb) for mb in check])
    assert np.max(np.abs(pred / np.array(_times(TRUTH, check)) - 1)) < 0.04


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(1e-9, 1e4), min_size=1, max_size=4), min_size=1, max_size=4))
@pytest.mark.slow
def test_max_of_encoded_words_is_the_largest_time(rows):
    """The wire encoding orders like the times: an int64 MAX over ranks picks the slowest;
    a rank that has not recorded yet (MISSING) holds the microbatch back; a rank that keeps
    no times (ABSENT) never counts."""
    width = max(len(r) for r in rows)
    table = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        table[i, : len(r)] = r
    words = np.stack([np.where(np.isnan(row), MISSING, encode_seconds(np.nan_to_num(row, nan=1.0))) for row in table])
    combined = words.max(axis=0)
    got = decode_seconds(combined)
    any_missing = np.isnan(table).any(axis=0)
    assert np.array_equal(combined == MISSING, any_missing)
    assert np.array_equal(got[~any_missing], table.max(axis=0)[~any_missing])
    assert np.isnan(got[any_missing]).all()
    absent = np.full((1, width), ABSENT, dtype=np.int64)
    assert np.array_equal(np.vstack([words, absent]).max(axis=0), combined)
    assert np.all(decode_seconds(encode_seconds([0.0, -1.0, np.inf, np.nan])) != decode_seconds(encode_seconds([1.0])))
    assert encode_seconds([0.0, -1.0, np.inf, np.nan]).tolist() == [INVALID] * 4


def test_step_objective_of_times_lockstep_and_replica():
    times = np.array([[1.0, 3.0], [2.0, 1.0]])  # [M, dp]: the ledger's measured and predicted step times
    assert step_objective(times, "lockstep") == 5.0
    assert step_objective(times, "replica") == 4.0


def _schedule(seed, dp=2):
    lengths = np.random.default_rng(seed).integers(16, 256, 24)
    return get_scheduler("balanced").schedule(lengths, dp_size=dp, max_tokens_per_rank=512, pad_multiple=8)


@pytest.mark.slow
def test_microbatch_sums_are_exact():
    schedule = _schedule(0)
    sums = microbatch_sums(schedule)
    padded = -(-schedule.lengths // 8) * 8
    for m, row in enumerate(schedule.assignment):
        for d, ids in enumerate(row):
            assert sums[m, d].tolist() == [int(padded[ids].sum()), int((padded[ids] ** 2).sum())]


def _ledger(window=2, prior=TRUTH, min_points=3):
    calibrator = CostCalibrator(prior, min_points=min_points, warmup_steps=0)
    return TimingLedger(calibrator, dp_size=2, dp_rank=0, window=window)


def test_ledger_observes_a_step_once_every_replica_timed_it():
    ledger = _ledger()
    s0 = _schedule(0)
    ledger.add_step(0, microbatch_sums(s0), None)
    m = s0.num_microbatches
    ledger.record(0, [0.1 * (k + 1) for k in range(m)], m)
    mine = ledger.outgoing()
    assert mine.shape == (m,) and np.all(mine >= 0)
    # The other replica has not recorded yet: nothing is observed, the step waits.
    assert ledger.incoming(1, np.stack([mine, np.full(m, MISSING)])) == []
    assert ledger.pending() == [0]
    other = encode_seconds([0.2] * m)
    (got,) = ledger.incoming(2, np.stack([mine, other]))
    assert got.step == 0 and got.measured == pytest.approx(sum(max(0.1 * (k + 1), 0.2) for k in range(m)))
    assert got.predicted is None  # the step was scheduled with an unfitted model
    assert ledger.calibrator.num_points == 2 * m and ledger.pending() == []


def test_ledger_gives_up_waiting_after_its_window(caplog):
    ledger = _ledger(window=2)
    s0 = _schedule(1)
    m = s0.num_microbatches
    ledger.add_step(0, microbatch_sums(s0), TRUTH)
    half = np.stack([encode_seconds([0.5] * m), np.full(m, MISSING)])
    assert ledger.incoming(1, half) == []
    with caplog.at_level(logging.WARNING, logger="seqpack.calibrate"):
        (got,) = ledger.incoming(2, half)  # step 0 is now 2 steps old: take what is there
    assert got.measured is None and ledger.calibrator.num_points == m
    # Too late: step 0 has left the ledger.
    ledger.record(0, [0.1] * m, m)
    assert ledger.late == 1


@pytest.mark.slow
def test_ledger_reports_the_prediction_error_of_the_model_in_use():
    ledger = _ledger()
    s0 = _schedule(2)
    sums = microbatch_sums(s0)
    ledger.add_step(0, sums, TRUTH)
    true = TRUTH.predict_sums(sums)  # [M, dp] seconds
    measured = true * 1.10  # the clock runs 10% slower than the model says
    (got,) = ledger.incoming(1, np.stack([encode_seconds(measured[:, d]) for d in range(2)]))
    assert got.error == pytest.approx(1 / 1.10 - 1)
    assert ledger.last is got


def test_ledger_wrong_count_raises_and_is_kept_for_the_next_gather():
    ledger = _ledger()
    ledger.add_step(0, microbatch_sums(_schedule(0)), None)
    with pytest.raises(ValueError, match="record_times got 1 times for step 0"):
        ledger.record(0, [0.1], 3)
    assert "record_times got 1 times" in ledger.take_error()
    assert ledger.take_error() is None


def test_ledger_state_roundtrip_keeps_pending_steps():
    ledger = _ledger(min_points=100)
    s0, s1 = _schedule(0), _schedule(1)
    ledger.add_step(0, microbatch_sums(s0), None)
    ledger.add_step(1, microbatch_sums(s1), TRUTH)
    ledger.record(1, [0.3] * s1.num_microbatches, s1.num_microbatches)
    fresh = _ledger(min_points=100)
    fresh.load_state_dict(ledger.state_dict())
    assert fresh.pending() == [0, 1]
    assert np.array_equal(fresh.outgoing(), ledger.outgoing())
    table = np.stack([ledger.outgoing(), ledger.outgoing()])
    a, b = ledger.incoming(3, table), fresh.incoming(3, table)
    assert [(x.step, x.measured, x.predicted) for x in a] == [(x.step, x.measured, x.predicted) for x in b]
    assert not math.isnan(a[-1].predicted)


def test_a_snapshot_taken_ahead_is_completed_with_times_recorded_later():
    """Prefetch: the state of the step handed over was snapshotted when it was produced; the
    training loop's times of it arrive later and must still be saved."""
    ledger = _ledger(min_points=100)
    s0 = _schedule(0)
    m = s0.num_microbatches
    ledger.add_step(0, microbatch_sums(s0), None)
    snap = ledger.snapshot()
    ledger.add_step(1, microbatch_sums(_schedule(1)), None)  # produced ahead
    ledger.record(0, [0.25] * m, m)
    state = ledger.state_dict(snap)
    assert [item["step"] for item in state["pending"]] == [0]
    assert state["pending"][0]["local"] == [0.25] * m
    fresh = _ledger(min_points=100)
    fresh.load_state_dict(state)
    assert fresh.pending() == [0] and np.array_equal(fresh.outgoing(), encode_seconds([0.25] * m))
