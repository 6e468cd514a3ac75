"""calibrate=True with a vision model on gloo dp=2 (issue 41 item 3): every rank fits the
vision encoder's FLOPs beside the tokens from the same gathered times, bit for bit, and plans
the next steps' sample_cost at the fitted price (the schedule fingerprint, which covers the
model and its encoder price, is compared every step)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from vision_calibration_data import PRICE, SECONDS, K, priced_at, run, samples
from wrapper_data import mesh_topology


def _run() -> dict:
    topology = mesh_topology((("dp", 2),))
    seen, calibrator = run(topology, samples(dist.get_rank(), 6 * 16), 16)
    assert calibrator is not None
    return dict(
        first=priced_at(seen[0][1], PRICE),
        last=seen[-1][0] and priced_at(seen[-1][1], calibrator.encoder_price),
        price=calibrator.encoder_price,
        names=calibrator.sum_names,
        points=calibrator.state_dict()["points"],
    )


def test_dp2_fits_the_encoder_alike_on_every_rank(dist_pools):
    results = dist_pools.get(2).run(_run)
    first, second = results
    assert first["points"] == second["points"] and first["price"] == second["price"]  # bit for bit
    assert first["names"][-1] == "vision_flops_sum" and any(p[2] > 0 for p in first["points"])
    assert first["price"] / (SECONDS * PRICE) == pytest.approx(K, rel=1e-6)
    assert all(r["first"] and r["last"] for r in results)
