"""benchmarks/static_shapes_plans.py runs end to end at toy sizes (--quick), so that it cannot
rot: every workload of benchmarks/schedulers.py under both syncs, every bucket choice, with
its step time against the unbucketed plans'."""

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~5 s: 6 toy workloads x 2 syncs x 5 bucket choices, by_cost's re-plans included


@pytest.fixture(scope="module")
def plans_benchmark():
    with benchmark_module("static_shapes_plans") as module:
        yield module


def test_quick_run_reports_every_choice_on_every_workload(plans_benchmark, capsys):
    every = plans_benchmark.run(steps=1, model="llama3-8b", quick=True)
    plans_benchmark.report(every)
    out = capsys.readouterr().out
    assert "x unbucketed" in out and "planned in" in out
    rows = [r for r in every if r["config"] != "(seconds)"]
    configs = ["unbucketed", "by cost, 4", "by cost, 8", "in-sample, 8", "multiples c/8", "capacity"]
    workloads = {r["workload"] for r in rows}
    assert {"sft-lognormal", "rl-bimodal", "equal", "pretrain-pareto"} <= workloads
    for workload in workloads:
        for sync in ("lockstep", "replica"):
            mine = {r["config"]: r for r in rows if r["workload"] == workload and r["sync"] == sync}
            assert list(mine) == configs
            assert mine["unbucketed"]["ratio"] == 1.0
            # Buckets add padding (a bucketed plan may balance a little differently).
            for config in configs[1:]:
                assert mine[config]["ratio"] >= 0.99 and mine[config]["pad"] >= mine["unbucketed"]["pad"] - 1e-3


def test_quick_ablation_reports_every_part_against_the_whole_search(plans_benchmark, capsys):
    # --ablate: static_shapes_by_cost's search re-run with one part off at a time; the whole
    # search's replica must pick the product's ladder (ablate asserts it on every row).
    rows = plans_benchmark.ablate(steps=1, model="llama3-8b", quick=True, seeds=[100], sample_steps=1)
    plans_benchmark.ablation_report(rows)
    out = capsys.readouterr().out
    variants = ["full", *(f"-{part}" for part in plans_benchmark.PARTS)]
    assert all(v in out for v in variants) and "buys at most" in out
    cells = {(r["workload"], r["sync"], r["buckets"]) for r in rows}
    assert len(rows) == len(cells) * len(variants) and {b for _, _, b in cells} == {4, 8}
    assert all(r["time"] > 0 and r["seconds"] >= 0 for r in rows)
