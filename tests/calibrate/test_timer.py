"""MicrobatchTimer on CPU (perf_counter); the CUDA path (events, query) runs on GPU machines."""

import time
import types

import pytest
import torch

import seqpack.calibrate.timer as timer_module
from seqpack.calibrate import MicrobatchTimer


class FakeStep:
    def __init__(self, num_microbatches):
        self.num_microbatches = num_microbatches
        self.times = None

    def record_times(self, seconds):
        self.times = list(seconds)


def test_cpu_timer_reports_each_step_when_its_last_microbatch_ends():
    timer = MicrobatchTimer("cpu")
    step = FakeStep(3)
    for m in range(3):
        with timer.microbatch(step, m):
            time.sleep(0.002 * (m + 1))
        assert (step.times is None) == (m < 2)
    # A sleep never undershoots; on a loaded machine it may overshoot any amount.
    assert len(step.times) == 3 and all(t >= 0.002 * (m + 1) for m, t in enumerate(step.times))
    assert timer.recorded == 1


def test_cpu_timer_gives_each_microbatch_its_own_time(monkeypatch):
    """With a clock the test controls: microbatch m takes m + 1 seconds, in order."""
    ticks = iter([0.0, 1.0, 10.0, 12.0, 20.0, 23.0])
    monkeypatch.setattr(timer_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    timer = MicrobatchTimer("cpu")
    step = FakeStep(3)
    for m in range(3):
        with timer.microbatch(step, m):
            pass
    assert step.times == [1.0, 2.0, 3.0] and timer.recorded == 1


def test_a_step_missing_microbatches_is_reported_with_nan_once_others_pile_up():
    timer = MicrobatchTimer("cpu", max_pending=1)
    first, second = FakeStep(2), FakeStep(1)
    with timer.microbatch(first, 0):
        pass
    assert first.times is None
    with timer.microbatch(second, 0):
        pass
    assert second.times is not None and len(first.times) == 2 and first.times[1] != first.times[1]  # NaN


def test_flush_reports_what_is_pending():
    timer = MicrobatchTimer("cpu", max_pending=8)
    step = FakeStep(2)
    with timer.microbatch(step, 0):
        pass
    assert timer.flush() == 1 and len(step.times) == 2


def test_timer_checks_its_arguments():
    timer = MicrobatchTimer("cpu")
    with pytest.raises(ValueError, match="index 2 is out of range"):
        with timer.microbatch(FakeStep(2), 2):
            pass
    with pytest.raises(TypeError, match="record_times"):
        with timer.microbatch(object(), 0):
            pass
    with pytest.raises(ValueError, match="device must be"):
        MicrobatchTimer("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            MicrobatchTimer("cuda")
        assert MicrobatchTimer().device == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_reads_events_without_blocking():
    timer = MicrobatchTimer("cuda")
    steps = [FakeStep(2) for _ in range(3)]
    x = torch.randn(2048, 2048, device="cuda")
    for step in steps:
        for m in range(2):
            with timer.microbatch(step, m):
                x = x @ x
                x = x / x.norm()
    timer.flush()
    assert all(s.times is not None and all(t > 0 for t in s.times) for s in steps)
