"""Online calibration under dynamic CP on gloo: the group cost (compute and CP ring) fitted
from the times every rank reports, the same on every rank, used by the next plans.

Every rank reports, for each of its microbatches, the time a known ``TRUTH`` group cost
gives its group's pack (a lone filler for an idle rank). Every CP rank's time travels on its
own (TimingLedger(copies=cp)), so under dp=4 x cp=1 and dp=2 x cp=2 alike the calibrator
observes every group once with its own time, and the fit recovers ``TRUTH``'s predictions
exactly (before, under dp=2 x cp=2 it saw each replica's slowest CP rank only: groups were
lost, and a wrong model picked the wrong group for a replica's time).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, LAYOUTS, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel, spans_nodes
from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import Request
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.thd import group_padded_lengths

PRIOR = CostModel(1.0, 1e-3, 0.0, ring_step=0.5, ring_token=2e-3, reference_size=1)
TRUTH = CostModel(2e-4, 3e-6, 4e-3, ring_step=2e-3, ring_token=1e-4, reference_size=1)


def _times(plan, me: int) -> list[float]:
    """This plane rank's microbatch times under ``TRUTH``."""
    out = []
    for g in plan.rank_group()[:, me].tolist():
        ids = plan.group_ids(g)
        c = int(plan.group_size[g]) if ids.size else 1
        padded = group_padded_lengths(plan.lengths[ids], c, plan.pad_multiple).astype(np.int64)
        if not ids.size:
            padded = np.array([plan.pad_multiple])
        spans = spans_nodes(int(plan.group_start[g]), c, TRUTH.ranks_per_node)
        row = np.array([[c, int(padded.sum()), int((padded * padded).sum()), int(spans)]])
        out.append(float(TRUTH.predict_group_sums(row, 1)[0]))
    return out


def _groups_of(step: dict) -> int:
    """Groups of a saved plan (every rank is in one group per round)."""
    return len(step["plan"]["group_size"])


def run_calibrated(name: str, prefetch: int, steps: int) -> dict:
    topo = mesh_topology(LAYOUTS[name])
    me = topo.dp_rank * topo.cp_size + topo.cp_rank
    it = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, steps=steps)), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY,
        dynamic_cp=True, cost=PRIOR, prefetch=prefetch, check_schedule=True,
        calibrate=CostCalibrator(PRIOR, min_points=8),
    )  # fmt: skip
    out: dict = {"steps": []}
    with it:
        for step in it:
            plan = step.schedule
            step.record_times(_times(plan, me))
            assert it.calibrator is not None
            out["steps"].append(
                {
                    "lengths": plan.original_lengths.tolist(),
                    "pad": plan.pad_multiple,
                    "plan": {k: v.tolist() for k, v in plan.to_arrays().items() if k != "origin"},
                    "calibrated": step.stats.calibrated,
                    "model": it.calibrator.model.group_coefficients(1).tolist(),
                }
            )
        assert it.calibrator is not None
        out["points"] = it.calibrator.state_dict()["points"]
    out["rank"] = dist.get_rank()
    return out


# dp=2 x cp=2 has half the replicas, so half the timings per step, and prefetch adds a step of lag.
@pytest.mark.parametrize(("name", "prefetch", "steps"), [("dp4", 0, 5), ("dp2cp2", 1, 8)])
def test_every_rank_fits_the_same_group_cost_and_plans_with_it(dist_pools, name, prefetch, steps):
    results = dist_pools.get(4).run(run_calibrated, name, prefetch, steps)
    first, steps_run = results[0], steps
    for r in results[1:]:
        assert r["points"] == first["points"]
        assert [s["model"] for s in r["steps"]] == [s["model"] for s in first["steps"]]
    steps = first["steps"]
    assert len(steps) == steps_run and not steps[0]["calibrated"] and steps[-1]["calibrated"]
    assert len(first["points"]) >= 8
    final = CostModel.from_group_coefficients(np.array(steps[-1]["model"]))
    points = np.array(first["points"])[:, :4].astype(np.int64)
    measured = np.array(first["points"])[:, 4]
    error = np.abs(final.predict_group_sums(points, 1) / measured - 1)
    assert error.max() < 1e-6  # every point is one group with its own time: the fit is exact
    assert (points[:, 0] > 1).any()  # groups were timed: the ring term is fitted with the rest
    # Every group of every observed round is one point, once (idle ranks: a lone filler each).
    observed = sorted({int(p[5]) for p in first["points"]})
    assert len(first["points"]) == sum(_groups_of(steps[k]) for k in observed)
    if prefetch:
        return
    # Without prefetch the model after step k-1 is the one step k was planned with.
    replanned = 0
    for before, step in zip(steps, steps[1:], strict=False):
        cost = CostModel.from_group_coefficients(np.array(before["model"]))
        request = Request.of(step["lengths"], dp_size=4, max_tokens_per_rank=CAPACITY, pad_multiple=step["pad"])
        plan = plan_dynamic_cp(dataclasses.replace(request, cost=cost))
        assert {k: v.tolist() for k, v in plan.to_arrays().items() if k != "origin"} == step["plan"]
        prior_plan = plan_dynamic_cp(dataclasses.replace(request, cost=PRIOR))
        replanned += prior_plan.fingerprint() != plan.fingerprint()
    assert replanned > 0  # the fitted cost changed some plans
