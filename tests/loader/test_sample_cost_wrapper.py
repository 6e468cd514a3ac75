"""PackingConfig(model=): the vision encoder's cost of each sample in the wrapper's plan, on one
rank (tests/distributed/test_vision_cost_dist.py checks the balance on gloo dp=2)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from vlm_data import END, IMAGE, PATCH_DIM, START

from seqpack._logging import reset_warn_once
from seqpack.cost import CostModel, ModelSpec, VisionSpec
from seqpack.errors import SeqpackTypeError
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.loader.sample_cost import step_sample_cost, vision_flops_column
from seqpack.schedulers import predicted_step_time
from seqpack.thd import MRopeSpec
from seqpack.topology import Topology

VISION = VisionSpec(
    hidden_size=256,
    num_layers=8,
    num_attention_heads=4,
    ffn_hidden_size=1024,
    patch_size=2,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=64,
)
MODEL = ModelSpec(64, 2, 4, 128, vision=VISION)
COST = CostModel(1.0, 0.01, 2.0)
SPEC = MRopeSpec(model_type="qwen2_vl", image_token_id=IMAGE, video_token_id=121)


def _image(gen: torch.Generator, grid=(1, 8, 8)) -> dict:
    t, h, w = grid
    run = torch.cat([torch.tensor([START]), torch.full((t * h * w // 4,), IMAGE), torch.tensor([END])])
    return {
        "input_ids": torch.cat([torch.randint(2, 100, (3,), generator=gen), run]),
        "pixel_values": torch.randn(t * h * w, PATCH_DIM, generator=gen),
        "image_grid_thw": torch.tensor([grid]),
    }


def _text(gen: torch.Generator, n: int = 9) -> dict:
    return {"input_ids": torch.randint(2, 100, (n,), generator=gen)}


def _steps(samples: list[dict], **options) -> list:
    config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, pad_multiple=2, cost=COST, mrope=SPEC, **options)
    return list(wrap_data_iterator(samples, Topology.single(), config))


def test_a_model_that_is_not_a_model_spec_is_refused_by_name():
    with pytest.raises(SeqpackTypeError, match="model must be a ModelSpec"):
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, model="qwen2-vl")  # type: ignore[arg-type]


def test_each_sample_costs_its_encoders_flops_at_the_price_of_a_language_model_flop():
    gen = torch.Generator().manual_seed(0)
    samples = [_image(gen), _text(gen), _image(gen, (1, 4, 8)), _text(gen)]
    flops = vision_flops_column(samples, MODEL)
    assert flops.tolist() == [VISION.flops(torch.tensor([[1, 8, 8]])), 0, VISION.flops(torch.tensor([[1, 4, 8]])), 0]
    assert vision_flops_column(samples, ModelSpec(64, 2, 4, 128)).tolist() == [0, 0, 0, 0]  # no encoder
    (step,) = _steps(samples, model=MODEL)
    want = flops * COST.linear / MODEL.linear_flops
    assert step.schedule.sample_cost is not None and np.allclose(step.schedule.sample_cost, want, rtol=1e-12)
    assert step.stats.predicted_step_time == pytest.approx(predicted_step_time(step.schedule, COST), rel=1e-12)


def test_text_steps_plan_as_without_a_model():
    gen = torch.Generator().manual_seed(1)
    samples = [_text(gen, n) for n in (5, 9, 30, 12)]
    (plain,) = _steps(samples)
    (with_model,) = _steps(samples, model=MODEL)
    assert with_model.schedule.sample_cost is None
    assert with_model.schedule.fingerprint() == plain.schedule.fingerprint()


def test_images_without_a_vision_spec_plan_on_tokens_and_say_so_once(caplog):
    reset_warn_once()
    gen = torch.Generator().manual_seed(2)
    with caplog.at_level(logging.WARNING, logger="seqpack.loader.sample_cost"):
        steps = _steps([_image(gen), _text(gen)] * 4)
    assert len(steps) == 2 and all(step.schedule.sample_cost is None for step in steps)
    said = [r for r in caplog.records if "planned on their tokens alone" in r.getMessage()]
    assert len(said) == 1 and "PackingConfig(model=ModelSpec.from_hf(config))" in said[0].getMessage()
    assert step_sample_cost(np.zeros(2, np.int64), np.zeros(2, np.int64), COST, None) is None
