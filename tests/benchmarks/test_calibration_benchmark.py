"""benchmarks/calibration.py runs at toy size (4 steps per clock, its summary from step 2, the
FLOPs clocks only), so that it cannot rot: a section per clock with a row per step, a fitted
model, and a verdict per target."""

import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~1 s


def test_toy_run_reports_every_clock_and_its_targets(monkeypatch, capsys, tmp_path):
    with benchmark_module("calibration") as module:
        monkeypatch.setattr(module, "FROM_STEP", 2)
        missing = str(tmp_path / "no_h100_clock.json")  # the H100 clocks are left out, as in CI
        monkeypatch.setattr(sys, "argv", ["calibration.py", "--steps", "4", "--skip-cpu", "--clock-data", missing])
        module.main()
    out = capsys.readouterr().out
    assert f"# {missing} not found" in out
    clocks = re.findall(r"^== clock (.+) ==$", out, flags=re.MULTILINE)
    assert clocks == ["flops (= the FLOPs model)", "gpt-oss-20b flops (windowed)", "gpt-oss-20b + constant (windowed)"]
    for section in out.split("== clock ")[1:]:
        steps = re.findall(r"^\s+(\d+)\s+(True|False)\s", section, flags=re.MULTILINE)
        assert [int(s) for s, _ in steps] == [0, 1, 2, 3]
        mean = re.search(r"steps 2-3: calibrated / oracle mean ([\d.]+)", section)
        assert mean is not None and 0.99 < float(mean.group(1)) < 1.1
    verdicts = re.findall(r"^  (PASS|FAIL)  (.+): calibrated within 3%", out, flags=re.MULTILINE)
    assert [name for _, name in verdicts] == clocks


def test_too_few_steps_for_the_summary_is_refused(monkeypatch, capsys):
    with benchmark_module("calibration") as module:
        monkeypatch.setattr(sys, "argv", ["calibration.py", "--steps", str(module.FROM_STEP)])
        with pytest.raises(SystemExit):
            module.main()
    assert f"--steps {module.FROM_STEP}: the summary is over steps" in capsys.readouterr().err
