"""Closed-loop inputs (issue 24, item 7): what CostModel.fit, the calibrator and
Step.record_times accept as seconds, and a step's times reported twice."""

import math
import re
import warnings

import numpy as np
import pytest
from wrapper_data import items

from seqpack.calibrate import CostCalibrator, TimingLedger, encode_seconds, microbatch_sums
from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import SeqpackTypeError, StepFailed
from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import get_scheduler
from seqpack.topology import Topology

TRUTH = CostModel(2e-4, 3e-7, 0.01)


def _microbatches(seed=0, count=24):
    rng = np.random.default_rng(seed)
    return [rng.integers(16, 2048, rng.integers(1, 10)).tolist() for _ in range(count)]


def _times(mbs, model=TRUTH):
    return [model.microbatch_cost(mb) for mb in mbs]


# -- CostModel.fit ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["0.5", b"0.5", True, np.bool_(False), None, 1 + 2j])
def test_fit_refuses_seconds_that_are_no_real_numbers_and_names_them(bad):
    mbs = _microbatches()[:4]
    seconds = [0.1, 0.2, bad, 0.4]
    with pytest.raises(SeqpackTypeError, match=r"seconds\[2\]") as info:
        CostModel.fit(mbs, seconds)
    assert repr(bad)[:6] in str(info.value)


def test_fit_refuses_an_array_of_strings_or_bools():
    mbs = _microbatches()[:3]
    with pytest.raises(SeqpackTypeError, match=r"seconds\[0\]='1'"):
        CostModel.fit(mbs, np.array(["1", "2", "3"]))
    with pytest.raises(SeqpackTypeError, match=r"seconds\[0\]=True"):
        CostModel.fit(mbs, np.array([True, False, True]))


@pytest.mark.parametrize("exponent", [-600, -520, 520, 600, 1000])
def test_fit_is_scale_invariant_far_beyond_the_square_root_of_float64(exponent):
    """Times around 1e-180 s or 1e180 s (their squares are past float64) fit exactly the
    model of the same times in seconds, scaled: bit for bit for a power-of-two scale."""
    mbs = _microbatches(1)
    y = np.array(_times(mbs)) * np.random.default_rng(2).uniform(0.9, 1.1, len(mbs))
    scale = math.ldexp(1.0, exponent)
    for robust in (False, True):
        base = CostModel.fit(mbs, y, robust=robust)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no numpy overflow or underflow warnings
            scaled = CostModel.fit(mbs, y * scale, robust=robust)
        for name in ("linear", "quadratic", "constant"):
            want = math.ldexp(getattr(base, name), exponent)
            got = getattr(scaled, name)
            if want == 0 or abs(want) >= 2.0**-1022:  # not subnormal: exact
                assert got == want, (name, robust)
            else:
                assert got == pytest.approx(want, rel=1e-6, abs=2.0**-1074 * 16)


def test_fit_names_the_times_when_they_span_too_far():
    mbs = _microbatches()[:4]
    with pytest.raises(ValueError, match=r"seconds\[1\]=1e-200 .* seconds\[3\]=1e\+200"):
        CostModel.fit(mbs, [1.0, 1e-200, 2.0, 1e200])


# -- calibrator and ledger ------------------------------------------------------------------


def test_calibrator_refuses_string_and_bool_times():
    cal = CostCalibrator(TRUTH, min_points=3)
    with pytest.raises(SeqpackTypeError, match="'0.1'"):
        cal.observe([[10], [20]], ["0.1", "0.2"])
    with pytest.raises(SeqpackTypeError, match="True"):
        cal.observe([[10], [20]], [True, 0.2])
    assert cal.num_points == 0


def test_calibrator_skips_times_no_clock_measures_and_fits_on_the_rest():
    mbs = _microbatches(3, 40)
    cal = CostCalibrator(TRUTH, min_points=8, warmup_steps=0, keep_prior_shape=False)
    times = _times(mbs)
    times[3], times[7] = 1e200, 1e-200
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = cal.observe(mbs, times, step=5)
        model = cal.model
    assert kept == 38 and cal.skipped == 2
    assert model.linear == pytest.approx(TRUTH.linear, rel=1e-6)


def _ledger():
    schedule = get_scheduler("balanced").schedule(
        np.random.default_rng(0).integers(16, 256, 24), dp_size=2, max_tokens_per_rank=512, pad_multiple=8
    )
    ledger = TimingLedger(CostCalibrator(TRUTH, min_points=3, warmup_steps=0), dp_size=2, dp_rank=0)
    ledger.add_step(0, microbatch_sums(schedule), None)
    return ledger, schedule.num_microbatches


@pytest.mark.parametrize("bad", ["0.1", True, np.True_, None])
def test_ledger_record_refuses_strings_and_bools_naming_the_value(bad):
    ledger, m = _ledger()
    seconds = [0.1] * m
    seconds[-1] = bad
    named = rf"record_times of step 0 on DP rank 0\), got seconds\[{m - 1}\]={re.escape(repr(bad))} "
    with pytest.raises(SeqpackTypeError, match=named):
        ledger.record(0, seconds, m)
    assert re.search(named, ledger.take_error())  # the next step fails on every rank
    assert ledger.pending() == [0] and not np.any(ledger.outgoing() == encode_seconds([1.0])[0])


def test_ledger_record_twice_for_one_step_is_refused_and_keeps_the_first():
    ledger, m = _ledger()
    ledger.record(0, [0.1] * m, m)
    first = ledger.outgoing().copy()
    with pytest.raises(ValueError, match="record_times was called twice for step 0"):
        ledger.record(0, [0.2] * m, m)
    assert np.array_equal(ledger.outgoing(), first)
    assert "twice" in ledger.take_error()


# -- through the wrapper ----------------------------------------------------------------------


def _wrap():
    return wrap_data_iterator(
        items(3, 0, 200),
        Topology.single(),
        samples_per_rank=12,
        max_tokens_per_rank=64,
        pad_multiple=4,
        calibrate=CostCalibrator(default_cost_model(), min_points=8),
        prefetch=0,
    )


def test_step_record_times_refuses_strings_and_the_next_step_fails():
    it = _wrap()
    step = next(it)
    with pytest.raises(SeqpackTypeError, match="'0.1'"):
        step.record_times(["0.1"] * step.num_microbatches)
    with pytest.raises(StepFailed, match=r"record_times of step 0 on DP rank 0\), got seconds\[0\]='0.1'"):
        next(it)


def test_step_record_times_twice_is_refused():
    it = _wrap()
    step = next(it)
    step.record_times([0.1] * step.num_microbatches)
    with pytest.raises(ValueError, match="twice for step 0"):
        step.record_times([0.1] * step.num_microbatches)
    with pytest.raises(StepFailed, match="twice for step 0"):
        next(it)
