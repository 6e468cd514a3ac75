"""Ranks with different calibration settings (issue 24): calibrate=True on one rank and False
on another, different windows, priors or min_points, a CostCalibrator on one rank and True on
the other. The wrapper agrees its arguments before the first step (the agreement vector of
seqpack.loader.iterator): every rank raises the same ConfigError naming ``calibrate`` and each
rank's value; no rank hangs or schedules with another model than its peers. Ranks that agree
(the same calibrator built separately on each rank) run."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from wrapper_data import items, mesh_topology

from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel, default_cost_model
from seqpack.loader import wrap_data_iterator

SEED = 11


def _setting(case: str, rank: int):
    prior = default_cost_model()
    return {
        "on_off": (True, False),
        "window": (CostCalibrator(prior, window=64, min_points=8), CostCalibrator(prior, window=128, min_points=8)),
        "min_points": (CostCalibrator(prior, min_points=8), CostCalibrator(prior, min_points=9)),
        "prior": (CostCalibrator(prior), CostCalibrator(CostModel(1e-4, 1e-7, 0.01))),
        "true_vs_calibrator": (True, CostCalibrator(prior)),
        "robust": (CostCalibrator(prior, robust=True), CostCalibrator(prior, robust=False)),
        "same": (CostCalibrator(prior, min_points=8), CostCalibrator(prior, min_points=8)),
    }[case][rank]


def run_mixed(case: str):
    topo = mesh_topology((("dp", 2),))
    rank = dist.get_rank()
    try:
        it = wrap_data_iterator(
            items(SEED, topo.dp_rank, 36),
            topo,
            samples_per_rank=6,
            max_tokens_per_rank=96,
            calibrate=_setting(case, rank),
        )
        steps = []
        for step in it:
            step.record_times([0.01 * (1 + len(b.sample_ids)) for b in step.microbatches])
            steps.append(step.schedule_fingerprint)
    except Exception as exc:  # noqa: BLE001 - the type is part of the answer
        return type(exc).__name__, str(exc)
    return "ok", steps


@pytest.mark.parametrize("case", ["on_off", "window", "min_points", "prior", "true_vs_calibrator", "robust"])
def test_ranks_with_different_calibration_settings_all_raise_one_error_naming_both(dist_pools, case):
    results = dist_pools.get(2).run(run_mixed, case)
    assert results[0] == results[1], results
    kind, message = results[0]
    assert kind == "ConfigError", results
    assert "calibrate: " in message and " on dp rank 0, " in message and " on dp rank 1" in message, message
    zero = repr(_setting(case, 0)) if case != "on_off" else "True"
    one = repr(_setting(case, 1)) if case != "on_off" else "False"
    assert f"calibrate: {zero} on dp rank 0, {one} on dp rank 1" in message or (
        # long values are shortened in the message, never dropped: both ranks' values show
        zero[:40] in message and one[:40] in message
    ), message


def test_ranks_with_equal_calibrators_built_separately_run(dist_pools):
    results = dist_pools.get(2).run(run_mixed, "same")
    assert [r[0] for r in results] == ["ok", "ok"], results
    assert results[0][1] == results[1][1] and len(results[0][1]) >= 3
