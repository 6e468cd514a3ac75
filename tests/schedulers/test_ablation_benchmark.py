"""benchmarks/ablation.py runs end to end at toy sizes (--quick), so that it cannot rot: every
stage of balanced taken out on every kind of workload, the summary and the locality tables."""

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~10 s: 16 variants of the planner on 25 toy workloads


@pytest.fixture(scope="module")
def ablation():
    with benchmark_module("ablation") as module:
        yield module


def test_quick_run_reports_every_stage_on_every_workload(ablation, tmp_path, capsys):
    out = tmp_path / "ablation.txt"
    data = ablation.main(["--quick", "--out", str(out)])
    text = out.read_text()
    assert text.strip() in capsys.readouterr().out  # printed as written
    assert "# machine:" in text and "## summary" in text and "## locality: plan CPU" in text
    assert set(data["verdicts"]) == {f"-{s}" for s in ablation.ABLATIONS} | {
        "-locality",
        "-locality-origin_order",
        "-locality-relabel",
    }
    kinds = {c.split(" (")[0] for c in data["cases"]}
    assert {"sft-lognormal", "pretrain-pareto", "heavy-tail", "verl x20", "4,096 into 64"} <= kinds
    for case in data["results"]:
        for name, measured in case.items():
            assert len(measured.pred) == len(measured.cpu) > 0, name
    # Not vacuous: the toy sizes still show what the stages buy.
    assert data["verdicts"]["-exact_search"]["fewer"] == ["verl x20"]  # verl batches need it
    assert data["verdicts"]["-round_targets"]["best"] > 0.005
    assert data["verdicts"]["-locality"]["home"] > 0.2
    assert len(data["auto_over_off"]) == 1 and "locality='auto' on token-id samples" in text
