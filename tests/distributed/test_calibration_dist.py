"""Online calibration on gloo process groups (issue 10, item 3).

Every rank reports different microbatch times (the clock runs slower on higher ranks). The
times travel with the next step's length gather (DP) and the copies' status agreement (CP;
under data_owner="all" also TP and PP; the pipeline's agreement between first and last
stage), so every rank that keeps a calibrator must end with the same observations, bit for
bit: for each microbatch of each replica, the slowest copy's time. The schedule
fingerprint check (which under calibration covers the model) runs every step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist
from wrapper_data import items, mesh_topology

from seqpack.calibrate import CostCalibrator, microbatch_sums
from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import ConfigError
from seqpack.loader import wrap_data_iterator

SEED = 5
TRUTH = CostModel(1e-4, 1e-7, 0.01)
LAYOUTS = {
    "dp2cp2": ((("dp", 2), ("cp", 2)), "tp0"),
    "dp2tp2-tp0": ((("dp", 2), ("tp", 2)), "tp0"),
    "tp2dp2-all": ((("tp", 2), ("dp", 2)), "all"),
    "dp2pp2": ((("pp", 2), ("dp", 2)), "tp0"),
    "pp3": ((("pp", 3),), "tp0"),
}


def _times(step, slowdown):
    out = []
    for batch in step.microbatches:
        padded = (batch.cu_seqlens_padded[1:] - batch.cu_seqlens_padded[:-1]).tolist()
        out.append(TRUTH.microbatch_cost(padded if batch.sample_ids[0] >= 0 else []) * slowdown)
    return out


def run_calibrated(layout, owner, cfg):
    topo = mesh_topology(layout)
    rank = dist.get_rank()
    reads = owner == "all" or (topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage))
    data = items(SEED, topo.dp_rank, cfg.get("items", 60)) if reads else None
    it = wrap_data_iterator(
        data,
        topo,
        samples_per_rank=6,
        max_tokens_per_rank=96 // topo.cp_size,
        scheduler="balanced",
        data_owner=owner,
        check_schedule=True,
        sync="lockstep",
        calibrate=CostCalibrator(default_cost_model(), min_points=8),
    )
    out = {"rank": rank, "dp_rank": topo.dp_rank, "reads": reads, "steps": [], "error": None, "local_error": None}
    try:
        for step in it:
            times = _times(step, 1.0 + 0.03 * rank)
            if cfg.get("bad_count") == (rank, step.step):
                try:
                    step.record_times(times[:-1] if len(times) > 1 else times * 2)
                except ConfigError as exc:
                    out["local_error"] = str(exc)
            else:
                step.record_times(times)
            model = step.stats.cost_model
            out["steps"].append(
                {
                    "step": step.step,
                    "times": times,
                    "sums": microbatch_sums(step.schedule).tolist(),
                    "model": None if it.calibrator is None else (model.linear, model.quadratic, model.constant),
                    "fitted": step.stats.calibrated,
                    "fp": step.schedule_fingerprint,
                }
            )
    except ValueError as exc:
        out["error"] = str(exc)
    out["points"] = None if it.calibrator is None else it.calibrator.state_dict()["points"]
    return out


def _expected_points(results):
    """For every step the calibrator has taken, every (microbatch, replica): the slowest
    reading copy's time, in the order the ledger observes them (microbatch, then replica)."""
    readers = [r for r in results if r["reads"]]
    steps = readers[0]["steps"]
    points = []
    for k, step in enumerate(steps):  # the last step's times travel with the gather that finds the end
        if step["step"] < 1:  # the warm-up step (CostCalibrator(warmup_steps=1)) is left out
            continue
        sums = np.array(step["sums"])
        m_count, dp = sums.shape[:2]
        for m in range(m_count):
            for d in range(dp):
                t = max(r["steps"][k]["times"][m] for r in readers if r["dp_rank"] == d)
                points.append([int(sums[m, d, 0]), int(sums[m, d, 1]), t, step["step"]])
    return points


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_fits_the_same_model_from_the_slowest_copies(dist_pools, name):
    layout, owner = LAYOUTS[name]
    world = int(np.prod([size for _, size in layout]))
    results = dist_pools.get(world).run(run_calibrated, layout, owner, {})
    assert all(r["error"] is None for r in results), [r["error"] for r in results]
    keepers = [r for r in results if r["points"] is not None]
    assert len(keepers) >= 2
    for r in keepers[1:]:
        assert r["points"] == keepers[0]["points"]
        assert [s["model"] for s in r["steps"]] == [s["model"] for s in keepers[0]["steps"]]
    expected = _expected_points(results)
    window = keepers[0]["points"]
    # Under prefetch (default 1) the last step's times may be recorded after the gather that
    # found the end of data: the calibrator then ends one step earlier. Compare through the
    # last step it observed, and bound that lag.
    last = max(p[3] for p in window)
    assert last >= max(s["step"] for s in keepers[0]["steps"]) - 1
    expected = [p for p in expected if p[3] <= last]
    assert window == expected[-len(window) :]
    # Not vacuous: the model was fitted mid-run and then scheduled steps (every rank agreed
    # on schedule and model every step, or the run would have failed).
    fitted = [s["fitted"] for s in keepers[0]["steps"]]
    assert not fitted[0] and fitted[-1]
    assert len({tuple(s["model"]) for s in keepers[0]["steps"]}) > 2
    slowest = max(r["rank"] for r in results if r["reads"])
    assert any(p[2] == pytest.approx(TRUTH.predict_sums(np.array(p[:2])) * (1 + 0.03 * slowest)) for p in window)


def test_a_wrong_number_of_times_fails_the_next_step_everywhere(dist_pools):
    layout, owner = LAYOUTS["dp2cp2"]
    results = dist_pools.get(4).run(run_calibrated, layout, owner, {"bad_count": (1, 2)})
    bad = next(r for r in results if r["rank"] == 1)
    assert "record_times got" in bad["local_error"]
    messages = {r["error"] for r in results}
    assert len(messages) == 1 and "record_times got" in messages.pop()
    # The error travels with the next gather the producer makes after the bad call: step 3,
    # or step 4 when the prefetch thread (depth 1) had already gathered step 3. Either way
    # the same step failed on every rank.
    delivered = {len(r["steps"]) for r in results}
    assert len(delivered) == 1 and delivered.pop() in (3, 4), delivered
