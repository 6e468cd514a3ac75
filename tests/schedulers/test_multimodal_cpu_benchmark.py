"""benchmarks/multimodal_cpu.py without its processes: its samples are what Qwen2-VL's
processor gives (one placeholder per merged patch between the vision markers, a pixel row per
patch), its mix is skewed as stated, and its table pairs each step with the token-only plan's."""

import argparse

import numpy as np
import pytest
from benchmark_module import benchmark_module


@pytest.fixture(scope="module")
def cpu():
    with benchmark_module("multimodal_cpu") as module:
        yield module


def test_samples_follow_the_processors_contract_and_the_stated_mix(cpu):
    rng = np.random.default_rng(0)
    samples = [cpu.sample(rng) for _ in range(2000)]
    sides = []
    for s in samples:
        ids = s["input_ids"]
        assert s["labels"].shape == ids.shape and s["mm_token_type_ids"].tolist() == (ids == cpu.IMAGE).long().tolist()
        if "image_grid_thw" not in s:
            sides.append(0)
            continue
        t, h, w = s["image_grid_thw"][0].tolist()
        assert int((ids == cpu.IMAGE).sum()) == t * h * w // cpu.MERGE**2
        assert tuple(s["pixel_values"].shape) == (t * h * w, cpu.PATCH_DIM)
        assert (s["labels"][ids == cpu.IMAGE] == cpu.IGNORE).all()
        sides.append(h)
    shares = {side: sides.count(side) / len(sides) for side in (0, 8, 32)}
    assert shares == pytest.approx({0: 0.45, 8: 0.35, 32: 0.20}, abs=0.03)


def test_the_table_pairs_each_step_with_the_token_only_plans(cpu):
    args = argparse.Namespace(steps=3, warmup=1, samples_per_rank=8, max_tokens_per_rank=1024, seed=0)
    walls = {"tokens": [9.0, 1.0, 2.0], "summed": [9.0, 0.5, 2.0], "rebalanced": [9.0, 1.0, 1.0]}
    walls["tokens+rebal"] = walls["tokens"]
    rows = [
        [(s, mode, w[s] * (1.0 if rank else 0.5), 10 * (rank + 1), 100) for mode, w in walls.items() for s in range(3)]
        for rank in range(2)
    ]
    text = cpu.summarize(rows, {"rebalanced": (0, 0, 6)}, args, ((1.0, 1.0, 1.0), (2.0, 2.0, 2.0)))
    lines = {line.split()[0]: line.split() for line in text.splitlines() if not line.startswith("#")}
    assert lines["summed"][5] == "0.75x" and lines["rebalanced"][5] == "0.75x" and lines["tokens"][5] == "1.00x"
    assert lines["tokens"][6] == f"{20 / 15:.2f}" and "0 images moved in 0 of 6 microbatch rounds" in text
