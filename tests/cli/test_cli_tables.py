"""Tables (rich layout, plain text out)."""

from __future__ import annotations

import io
import sys

from seqpack.cli.tables import format_table, render_table


def test_render_table_aligns_and_has_no_trailing_blanks():
    text = render_table(("name", "value"), [("a", "1.5"), ("longer", "123.25")])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "value"] and set(lines[1]) <= {"─", "-", " "}
    assert lines[2].startswith("a ") and lines[3].startswith("longer ")
    assert lines[2].endswith("1.5") and lines[3].endswith("123.25")
    assert len(lines[2]) == len(lines[3])  # numbers right-aligned in one column
    assert all(line == line.rstrip() for line in lines)


def test_ascii_terminal_gets_an_ascii_rule(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert "─" not in render_table(("a", "b"), [("x", "1")])


def test_format_table_one_row_per_scheduler():
    row = {"microbatches": 12.0, "min_microbatches": 11.0, "bound_ratio": 1.0012, "bound_ratio_max": 1.004,
           "round_imbalance": 1.01, "round_lower_bound": 1.0, "pad_fraction": 0.0123, "moved_fraction": 0.871,
           "rank_moved_bytes": 3 * 2**20, "flops_per_step": None, "seconds_mean": 0.00123,
           "peak_bytes": 200 * 2**20}  # fmt: skip
    text = format_table({"results": {"balanced": row, "dp_balanced": {**row, "flops_per_step": 1.5e15}}})
    lines = text.splitlines()
    assert lines[2].startswith("balanced ") and lines[3].startswith("dp_balanced ")
    assert "12.0 ( 11)" in lines[2] and "1.0012" in lines[2] and "1.23" in lines[2] and "1.500e+15" in lines[3]
    assert lines[2].split()[-3] == "-"  # no FLOPs without a model
    assert lines[2].split()[-4] == "3.00" and lines[2].split()[-1] == "200"  # MB per rank, peak MB


def test_demo_summary_separates_fitted_predictions_from_the_prior():
    from seqpack.cli.tables import _fitted_error

    base = {"predictions": [[0, 1, 1], [1, 1, 1], [2, 1, 1]]}
    assert _fitted_error(dict(base, predicted_by_fitted=3, prediction_error_fitted=0.1)) == ""
    assert "all on the prior" in _fitted_error(dict(base, predicted_by_fitted=0, prediction_error_fitted=None))
    assert _fitted_error(dict(base, predicted_by_fitted=2, prediction_error_fitted=0.05)) == (
        ", 5.0% over the 2 scheduled with a fitted model"
    )


def test_demo_prediction_error_is_not_a_verdict_when_ranks_share_cores():
    from seqpack.cli.tables import _online_cost_line

    r = {"mode": "balanced", "cost_model": (1e-6, 1e-9, 1e-3), "calibrated": True, "prediction_error_mean_abs": 1.12,
         "predictions": [[0, 1, 1]] * 4, "predicted_by_fitted": 4, "prediction_error_fitted": 1.12}  # fmt: skip
    shared = _online_cost_line(r, shared="4 ranks time-share 2 cores")
    assert "not a measure of the model here: 4 ranks time-share 2 cores" in shared
    assert shared.index("not a measure") < shared.index("112.0%")  # the caveat comes before the figure
    alone = _online_cost_line(r, shared=None)
    assert "not a measure" not in alone and "mean |error| 112.0% over 4 steps" in alone
    assert "no step's prediction checked yet" in _online_cost_line(dict(r, prediction_error_mean_abs=None), "busy")


def test_demo_time_sharing_counts_usable_cores_and_a_busy_machine(monkeypatch):
    from seqpack.cli import tables

    monkeypatch.setattr(tables.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(tables.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert tables.usable_cores() == 2  # taskset / a container's cpuset, not the machine's 64
    assert tables.time_shared(4, 2, None) == "4 ranks time-share 2 cores"
    assert tables.time_shared(2, 2, 2.1) is None  # the two ranks' own load
    busy = tables.time_shared(2, 2, 11.0)
    assert busy == "the machine is time-shared (1-minute load average 11.0 on 2 usable cores)"
    r = {"mode": "balanced", "cost_model": (1e-6, 1e-9, 1e-3), "calibrated": True, "prediction_error_mean_abs": 0.6,
         "predictions": [[0, 1, 1]] * 4, "predicted_by_fitted": 4, "prediction_error_fitted": 0.6}  # fmt: skip
    line = tables._online_cost_line(r, busy)
    assert "not a measure of the model here: the machine is time-shared (1-minute load average 11.0" in line
    assert line.index("not a measure") < line.index("60.0%")
