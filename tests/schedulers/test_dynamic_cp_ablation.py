"""benchmarks/dynamic_cp_ablation.py cannot rot: its composition of the planner's search with
every sub-stage on plans what ``plan_dynamic_cp`` plans, each variant puts the planner back,
and its small-step report names every variant."""

import numpy as np
import pytest
from benchmark_module import BENCHMARKS, benchmark_module

from seqpack.cost import CostModel
from seqpack.schedulers import Request
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp, planner

pytestmark = pytest.mark.slow  # ~10 s: every variant on a few dozen small steps


@pytest.fixture(scope="module")
def ablation():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))  # it imports its workloads from benchmarks/dynamic_cp.py
        with benchmark_module("dynamic_cp_ablation") as module:
            yield module


def _steps(n):
    rng = np.random.default_rng(3)
    cost = CostModel(1.0, 0.05, 5.0, ring_step=2.0, ring_token=0.2, ring_token_inter=1.0, ranks_per_node=2,
                     reference_size=1)  # fmt: skip
    for case in range(n):
        ranks, capacity = int(rng.choice([2, 4, 8, 16])), int(rng.choice([64, 512]))
        lengths = np.clip(
            rng.lognormal(np.log(capacity) - 1.0, 1.2, int(rng.integers(1, 80))), 1, capacity * ranks // 2
        )
        sync, sizes = ("lockstep", "replica")[case % 2], ("pow2", "any")[(case // 2) % 2]
        request = Request.of(lengths.astype(np.int64), dp_size=ranks, max_tokens_per_rank=capacity, pad_multiple=2,
                             cost=cost, sync=sync)  # fmt: skip
        yield request, sync, sizes


def test_the_composition_with_every_sub_stage_on_is_the_planner(ablation):
    search = planner._search
    for request, _, sizes in _steps(24):
        product = plan_dynamic_cp(request, group_sizes=sizes)
        with ablation.variant("copy"):
            assert planner._search is not search
            assert plan_dynamic_cp(request, group_sizes=sizes).fingerprint() == product.fingerprint()
        assert planner._search is search


def test_every_variant_plans_and_puts_the_planner_back(ablation):
    search = planner._search
    for name in ablation.SWITCHES:
        for request, sync, sizes in _steps(4):
            if ablation.applies(f"-{name}", sync, sizes):
                with ablation.variant(f"-{name}"):
                    plan = plan_dynamic_cp(request, group_sizes=sizes)
                plan.validate(request.lengths)
        assert planner._search is search


def test_small_steps_report_every_variant(ablation):
    out = []
    names = ["full", "copy", *(f"-{s}" for s in ablation.SWITCHES)]
    gains = ablation.small_steps(names, 12, out)
    assert set(gains) == set(names) - {"full"} and gains["copy"] == 0.0
    assert all(any(line.startswith(name) for line in out) for name in gains)
