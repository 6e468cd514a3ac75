"""The vision encoder's cost through the wrapper on gloo dp=2 (PackingConfig(model=) with a
VisionSpec): each sample's encoder FLOPs are computed where it is read, gathered, and balanced
with its tokens; what is planned is what is reported.

Rank 0 reads two samples with an image, rank 1 two text samples of the same lengths: balancing
tokens alone leaves both images on rank 0; balancing the sum puts one on each rank.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.distributed as dist
from vlm_data import COST, COST_MODEL, COST_VISION, QWEN2_SPEC, image_sample
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import predicted_step_time

DP2 = (("dp", 2),)
GRID = (1, 8, 8)  # 16 placeholders
ENCODER = COST_VISION.flops(torch.tensor([GRID])) * COST.linear / COST_MODEL.linear_flops  # in COST's units


def _sample(gen: torch.Generator, image: bool) -> dict:
    text = torch.randint(2, 100, (4,), generator=gen)
    if not image:
        return {"input_ids": torch.randint(2, 100, (4 + 18 + 4,), generator=gen)}
    return image_sample(gen, GRID, text, text)


def _run(with_model: bool) -> dict:
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    samples = [_sample(gen, image=rank == 0) for _ in range(2)]
    options = {"model": COST_MODEL} if with_model else {}
    steps = list(
        wrap_data_iterator(
            samples,
            mesh_topology(DP2),
            samples_per_rank=2,
            max_tokens_per_rank=64,
            pad_multiple=2,
            cost=COST,
            mrope=QWEN2_SPEC,
            **options,
        )
    )
    (step,) = steps
    plan = step.schedule
    encoder = np.array([ENCODER, ENCODER, 0.0, 0.0])
    return dict(
        replica=plan.replica_of()[:2].tolist(),  # the two samples with an image: global ids 0, 1
        sample_cost=None if plan.sample_cost is None else plan.sample_cost.tolist(),
        reported=step.stats.predicted_step_time,
        recomputed=predicted_step_time(plan, COST),
        with_encoder=predicted_step_time(dataclasses.replace(plan, sample_cost=encoder), COST),
    )


def test_dp2_balances_the_encoders_work_and_reports_it(dist_pools):
    pool = dist_pools.get(2)
    tokens = pool.run(_run, False)
    summed = pool.run(_run, True)
    for result in tokens:  # tokens alone: both images stay on the rank that read them
        assert result["sample_cost"] is None and result["replica"] == [0, 0]
        assert result["reported"] == pytest.approx(result["recomputed"], rel=1e-12)
    for result in summed:  # summed: one image on each rank, the encoder's cost in the report
        assert sorted(result["replica"]) == [0, 1]
        assert np.allclose(result["sample_cost"], [ENCODER, ENCODER, 0.0, 0.0], rtol=1e-12)
        assert result["reported"] == pytest.approx(result["recomputed"], rel=1e-12)
        assert result["reported"] == pytest.approx(result["with_encoder"], rel=1e-12)
    # With the encoder's work, the token-only plan waits for both images on one rank: one
    # encoder's cost more than the summed plan.
    assert tokens[0]["with_encoder"] - summed[0]["reported"] == pytest.approx(ENCODER, rel=1e-9)
