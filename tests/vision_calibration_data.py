"""Vision samples and a synthetic clock for the encoder calibration tests (issue 41 item 3):
tests/loader/test_encoder_calibration.py (one rank) and
tests/distributed/test_encoder_calibration_dist.py (gloo dp=2)."""

from __future__ import annotations

import numpy as np
import torch
from vlm_data import COST, COST_MODEL, COST_VISION, QWEN2_SPEC, image_sample

from seqpack.calibrate import CostCalibrator
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.topology import Topology

PRICE = COST.linear / COST_MODEL.linear_flops  # the prior's price of an encoder FLOP
SECONDS = 1e-4  # seconds per unit of COST
K = 6.0  # the encoder is 6 times dearer per FLOP than the prior says


def samples(seed: int, count: int) -> list[dict]:
    """Text of 6-40 tokens, every other sample with one image of 4 x 4 to 8 x 8 patches."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        text = torch.randint(2, 100, (int(torch.randint(6, 41, (1,), generator=gen)),), generator=gen)
        if i % 2:
            out.append({"input_ids": text})
            continue
        h, w = (int(v) * 2 for v in torch.randint(2, 5, (2,), generator=gen))
        out.append(image_sample(gen, (1, h, w), text[:3], text[3:]))
    return out


def clock(step) -> list[float]:
    """Each microbatch's seconds: COST's language model at SECONDS a unit, its encoder K
    times the prior's price (an empty filler microbatch: its padding alone)."""
    out = []
    for batch in step.microbatches:
        padded = (batch.cu_seqlens_padded[1:] - batch.cu_seqlens_padded[:-1]).tolist()
        real = padded if batch.sample_ids[0] >= 0 else [int(batch.cu_seqlens_padded[-1])]
        flops = COST_VISION.flops(batch.image_grid_thw, batch.video_grid_thw)  # no grids: 0
        out.append(SECONDS * (COST.microbatch_cost(real) + K * PRICE * flops))
    return out


ALLOWED = np.array(sorted({COST_VISION.flops(torch.tensor([[1, h, w]])) for h in (4, 6, 8) for w in (4, 6, 8)}))


def priced_at(sample_cost: np.ndarray, price: float) -> bool:
    """Every image sample's cost is one of the possible images' FLOPs at ``price``."""
    flops = sample_cost[sample_cost > 0] / price
    return bool(flops.size) and all(np.isclose(ALLOWED, f, rtol=1e-9, atol=0).any() for f in flops)


def run(topology: Topology, data: list[dict], steps: int) -> tuple[list, CostCalibrator | None]:
    """``steps`` calibrated steps of ``data`` on ``topology``, timed by :func:`clock`: each
    step's (calibrated, sample_cost), and the calibrator at the end."""
    config = PackingConfig(
        samples_per_rank=6,
        max_tokens_per_rank=96,
        pad_multiple=2,
        cost=COST,
        mrope=QWEN2_SPEC,
        model=COST_MODEL,
        calibrate=True,
        check_schedule=True,  # ranks compare the schedule, the model and its encoder price every step
    )
    it = wrap_data_iterator(data, topology, config)
    seen = []
    for step in it:
        step.record_times(clock(step))
        seen.append((step.stats.calibrated, step.schedule.sample_cost))
        if len(seen) == steps:
            break
    return seen, it.calibrator
