"""benchmarks/multimodal.py at toy size: its resize is transformers', its bound holds, the
plan balancing the summed cost beats the token-only plan reported with the encoder's work, and
encoder rebalancing as "auto" runs it is never slower than the plan it routes (forced routing
can be: the route's barrier)."""

import numpy as np
import pytest
from benchmark_module import benchmark_module


@pytest.fixture(scope="module")
def multimodal():
    with benchmark_module("multimodal") as module:
        yield module


def test_resize_is_the_processors(multimodal):
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    rng = np.random.default_rng(0)
    for _ in range(200):
        h, w = (int(v) for v in rng.integers(40, 4000, 2))
        for limit in (multimodal.MAX_PIXELS, 28 * 28 * 1280):
            assert multimodal.smart_resize(h, w, limit) == pil.smart_resize(h, w, max_pixels=limit)


@pytest.mark.parametrize("mix", ["si", "ov", "docs"])
def test_summed_balancing_is_near_the_bound(multimodal, mix):
    figures = multimodal.measure("qwen2-vl-7b", mix, 8, 16, 16384, seed=0)
    assert 1.0 <= figures["summed"] <= figures["tokens"] + 1e-9
    assert figures["summed"] < 1.05 and 0.0 < figures["encoder_share"] < 1.0
    assert figures["enc_tokens"] >= 1.0 and figures["enc_summed"] >= 1.0
    # "auto" routes a round only where it gains: never above the plan it rebalances.
    assert 1.0 <= figures["rebal"] <= figures["summed"] + 1e-9
    assert 1.0 <= figures["tok_rebal"] <= figures["tokens"] + 1e-9
    assert figures["forced"] >= 1.0 and 0.0 <= figures["routed"] <= 1.0 and figures["enc_rebal"] >= 1.0


def test_every_sample_fits_a_microbatch(multimodal):
    step = multimodal.draw("ov", 2000, seed=1)
    assert step.lengths.max() <= 16384 and step.grids.shape[1] == 3
    assert np.bincount(step.owner, minlength=2000).max() <= 6
