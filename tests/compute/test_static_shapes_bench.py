"""benchmarks/static_shapes.py runs end to end at a toy size: with buckets dynamo compiles at
most one graph per bucket, without them one per token count (dynamic=False)."""

import pytest
from benchmark_module import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("static_shapes") as module:
        yield module


@pytest.mark.slow  # ~40 s of dynamo tracing on a loaded 2-core machine
def test_toy_run_compiles_at_most_one_graph_per_bucket(bench):
    modes = ("eager", "compile dynamic=False", "compile dynamic=False + buckets")
    results, facts = bench.run(
        steps=8, capacity=64, buckets=(32, 64), max_sequences=6, d_model=16, pattern="A", mean=12.0,
        backend="eager", modes=modes,
    )  # fmt: skip
    by_mode = {r.mode: r for r in results}
    assert list(by_mode) == list(modes) and facts["reference_diff"] < 1e-9
    assert by_mode["eager"].graphs == 0
    plain, bucketed = by_mode["compile dynamic=False"], by_mode["compile dynamic=False + buckets"]
    assert plain.distinct_shapes > 2  # not vacuous: the plain packs change shape
    assert plain.graphs == min(plain.distinct_shapes, 8)
    assert 1 <= bucketed.graphs <= bucketed.distinct_shapes <= 2
    assert "| compile dynamic=False + buckets |" in bench.table(results)
