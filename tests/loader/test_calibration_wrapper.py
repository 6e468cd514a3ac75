"""wrap_data_iterator(..., calibrate=True) on one rank: lag, stats, errors, resume.
Multi-rank agreement on the model is in tests/distributed/test_calibration_dist.py."""

import io

import pytest
import torch
from wrapper_data import items

from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import StepFailed
from seqpack.loader import wrap_data_iterator
from seqpack.loader.resume import StateKey
from seqpack.topology import Topology

TRUTH = CostModel(1e-4, 1e-7, 0.01)  # seconds: a clock the scheduler is not told


def _wrap(count=400, **kwargs):
    kwargs.setdefault("samples_per_rank", 12)
    kwargs.setdefault("max_tokens_per_rank", 64)
    kwargs.setdefault("pad_multiple", 4)
    kwargs.setdefault("calibrate", CostCalibrator(default_cost_model(), min_points=8))
    kwargs.setdefault("prefetch", 0)  # these tests read the calibrator live; prefetch has its own below
    return wrap_data_iterator(items(3, 0, count), Topology.single(), **kwargs)


def _true_times(step, clock=TRUTH):
    out = []
    for batch in step.microbatches:
        padded = (batch.cu_seqlens_padded[1:] - batch.cu_seqlens_padded[:-1]).tolist()
        out.append(clock.microbatch_cost(padded if batch.sample_ids[0] >= 0 else []))
    return out


@pytest.mark.slow
def test_the_schedule_of_step_n_plus_1_uses_times_through_step_n_minus_1():
    it = _wrap()
    seen = []
    for step in it:
        cal = it.calibrator
        # When step n is handed out, the calibrator holds steps 0..n-1 (step n-1's times came
        # with step n's gather); step n itself was scheduled with steps 0..n-2.
        seen.append((step.step, cal.last_step, step.stats.measured_step))
        step.record_times(_true_times(step))
    assert seen[0] == (0, None, None) and seen[1] == (1, 0, 0)
    assert all(last == n - 1 and measured == n - 1 for n, last, measured in seen[1:])
    assert len(seen) > 10
    # The last step's times travel with the gather that finds the end of data.
    assert it.calibrator.last_step == seen[-1][0] and it.last_measurement.step == seen[-1][0]


@pytest.mark.slow
def test_stats_report_the_model_in_use_and_its_prediction_error():
    it = _wrap()
    steps = []
    for step in it:
        step.record_times(_true_times(step))
        steps.append(step)
    first, late = steps[0].stats, steps[-1].stats
    assert first.cost_model == default_cost_model() and not first.calibrated and first.prediction_error is None
    assert late.calibrated
    for name in ("linear", "quadratic", "constant"):
        assert getattr(late.cost_model, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6)
    assert abs(late.prediction_error) < 1e-9  # noise-free clock: the fitted model is exact
    assert late.predicted_step_time == pytest.approx(sum(_true_times(steps[-1])), rel=1e-9)  # one replica
    # Not vacuous: a fitted model mispredicted a slower clock by the amount it is slower.
    it = _wrap(count=120)
    for k, step in enumerate(it):
        slow = CostModel(2 * TRUTH.linear, 2 * TRUTH.quadratic, 2 * TRUTH.constant)
        step.record_times(_true_times(step, TRUTH if k < 6 else slow))
        if k == 7:
            assert step.stats.prediction_error == pytest.approx(-0.5)


@pytest.mark.slow
def test_each_step_is_scheduled_with_the_model_in_use():
    """The schedule a step carries is the scheduler's plan under ``stats.cost_model`` (the
    calibrator's model at that step), which is the fitted model once fitted. (On one rank
    ``balanced`` takes the single-rank packer's fewest packs, the best plan under every cost:
    the plans themselves need not differ.)"""
    quadratic = CostModel(1e-9, 1e-5, 0.05)  # attention-bound: a long sequence is costly
    it = _wrap(scheduler="balanced", sync="lockstep", max_tokens_per_rank=96)
    fitted_steps = 0
    for step in it:
        replan = it.scheduler.schedule(
            step.schedule.original_lengths,
            dp_size=1,
            max_tokens_per_rank=96,
            pad_multiple=4,
            cost=step.stats.cost_model,
            sync="lockstep",
        )
        assert replan.fingerprint() == step.schedule_fingerprint
        fitted_steps += step.stats.calibrated and step.stats.cost_model != default_cost_model()
        step.record_times(_true_times(step, quadratic))
    assert it.calibrator.fitted and fitted_steps > 0


def test_record_times_errors():
    it = _wrap(calibrate=False)
    step = next(it)
    with pytest.raises(ValueError, match="pass calibrate=True"):
        step.record_times([0.1] * step.num_microbatches)
    it = _wrap(calibrate=True)
    step = next(it)
    with pytest.raises(ValueError, match=f"record_times got 1 times for step 0 .* ran {step.num_microbatches}"):
        step.record_times([0.1] + [0.1] * (step.num_microbatches == 1))
    with pytest.raises(StepFailed, match="record_times got 1 times for step 0"):
        next(it)


@pytest.mark.slow
def test_bad_times_are_skipped_not_fatal():
    it = _wrap()
    for step in it:
        times = _true_times(step)
        times[0] = float("nan") if step.step % 2 else -1.0
        step.record_times(times)
    assert it.calibrator.skipped > 5 and it.calibrator.fitted


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.slow
def test_resume_restores_the_calibrator_and_pending_times():
    def run(it, steps, stop=None):
        out = []
        for step in it:
            step.record_times(_true_times(step, CostModel(1e-9, 0.0, 1.0)))
            out.append((step.step, step.schedule_fingerprint, step.stats.cost_model))
            if stop is not None and len(out) == stop:
                return out, _roundtrip(it.state_dict())
        return out, None

    kwargs = dict(scheduler="balanced", sync="lockstep")
    full, _ = run(_wrap(**kwargs), None)
    head, state = run(_wrap(**kwargs), None, stop=7)
    assert state[StateKey.CALIBRATION]["pending"]  # step 6's times wait in the state
    fresh = _wrap(**kwargs)
    fresh.load_state_dict(state)
    tail, _ = run(fresh, None)
    assert head + tail == full
    assert len({model for _, _, model in full}) > 2  # not vacuous: the model changed along the run


@pytest.mark.slow
def test_under_prefetch_the_lag_grows_by_k_and_runs_are_reproducible_and_resume_exactly():
    # With prefetch k the gather of step s carries the times of steps <= s - 1 - k, whatever
    # the threads' timing: two runs schedule identically, and a resumed run continues exactly.
    def run(it, stop=None):
        out = []
        for step in it:
            step.record_times(_true_times(step, CostModel(1e-9, 0.0, 1.0)))
            out.append((step.step, step.schedule_fingerprint, step.stats.cost_model, step.stats.measured_step))
            if stop is not None and len(out) == stop:
                state = _roundtrip(it.state_dict())
                it.close()
                return out, state
        return out, None

    kwargs = dict(scheduler="balanced", sync="lockstep", prefetch=1)
    full, _ = run(_wrap(**kwargs))
    again, _ = run(_wrap(**kwargs))
    assert full == again
    # Step n is scheduled with times through step n - 3 (measured_step: the last step every
    # rank holds when step n was prepared is n - 2).
    assert all(measured is None or measured == n - 2 for n, _, _, measured in full)
    assert any(measured == n - 2 for n, _, _, measured in full)
    head, state = run(_wrap(**kwargs), stop=7)
    fresh = _wrap(**kwargs)
    fresh.load_state_dict(state)
    tail, _ = run(fresh)
    assert head + tail == full
    assert len({model for _, _, model, _ in full}) > 2  # not vacuous: the model changed along the run
