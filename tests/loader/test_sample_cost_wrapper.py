"""PackingConfig(model=): the vision encoder's cost of each sample in the wrapper's plan, on one
rank (tests/distributed/test_vision_cost_dist.py checks the balance on gloo dp=2)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from vlm_data import COST, COST_MODEL, COST_VISION, QWEN2_SPEC, image_sample

from seqpack._logging import reset_warn_once
from seqpack.cost import ModelSpec
from seqpack.errors import SeqpackTypeError
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.loader.sample_cost import step_sample_cost, vision_flops_column
from seqpack.schedulers import predicted_step_time
from seqpack.topology import Topology


def _image(gen: torch.Generator, grid=(1, 8, 8)) -> dict:
    return image_sample(gen, grid, torch.randint(2, 100, (3,), generator=gen))


def _text(gen: torch.Generator, n: int = 9) -> dict:
    return {"input_ids": torch.randint(2, 100, (n,), generator=gen)}


def _steps(samples: list[dict], **options) -> list:
    config = PackingConfig(
        samples_per_rank=4, max_tokens_per_rank=64, pad_multiple=2, cost=COST, mrope=QWEN2_SPEC, **options
    )
    return list(wrap_data_iterator(samples, Topology.single(), config))


def test_a_model_that_is_not_a_model_spec_is_refused_by_name():
    with pytest.raises(SeqpackTypeError, match="model must be a ModelSpec"):
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, model="qwen2-vl")  # type: ignore[arg-type]


def test_each_sample_costs_its_encoders_flops_at_the_price_of_a_language_model_flop():
    gen = torch.Generator().manual_seed(0)
    samples = [_image(gen), _text(gen), _image(gen, (1, 4, 8)), _text(gen)]
    flops = vision_flops_column(samples, COST_MODEL)
    assert flops.tolist() == [
        COST_VISION.flops(torch.tensor([[1, 8, 8]])),
        0,
        COST_VISION.flops(torch.tensor([[1, 4, 8]])),
        0,
    ]
    assert vision_flops_column(samples, ModelSpec(64, 2, 4, 128)).tolist() == [0, 0, 0, 0]  # no encoder
    (step,) = _steps(samples, model=COST_MODEL)
    want = flops * COST.linear / COST_MODEL.linear_flops
    assert step.schedule.sample_cost is not None and np.allclose(step.schedule.sample_cost, want, rtol=1e-12)
    assert step.stats.predicted_step_time == pytest.approx(predicted_step_time(step.schedule, COST), rel=1e-12)


def test_text_steps_plan_as_without_a_model():
    gen = torch.Generator().manual_seed(1)
    samples = [_text(gen, n) for n in (5, 9, 30, 12)]
    (plain,) = _steps(samples)
    (with_model,) = _steps(samples, model=COST_MODEL)
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
