"""A CostModel on CP groups: its features, its static-CP model, TE's ring figures, fitting,
and the predicted step time of a plan against a loop-by-loop reference."""

import numpy as np
import pytest
from dynamic_cp_reference import pack_time, plan_dcp, step_time_reference
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cost import FEATURES, CostModel, group_features, spans_nodes
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.schedulers import predicted_step_time

COST = CostModel(7e-7, 8e-11, 0.02, ring_step=2.4e-4, ring_token=5.5e-8, ring_token_inter=4.9e-7, reference_size=1)


@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=20),
    data=st.data(),
)
@pytest.mark.slow
def test_time_is_features_times_coefficients(sizes, data):
    packs = [data.draw(st.lists(st.integers(1, 40000), min_size=1, max_size=6)) for _ in sizes]
    s = np.array([sum(p) for p in packs], dtype=np.float64)
    ss = np.array([sum(x * x for x in p) for p in packs], dtype=np.float64)
    spans = np.array([c > 8 for c in sizes])
    times = group_features(np.array(sizes), s, ss, spans) @ COST.group_coefficients(1)
    coef = COST.group_coefficients(1)
    expected = [pack_time(c, a, b, sp, coef) for c, a, b, sp in zip(sizes, s, ss, spans, strict=True)]
    assert times == pytest.approx(expected, rel=1e-12)
    for c, pack, t in zip(sizes, packs, times, strict=True):  # the static-CP CostModel agrees
        assert COST.at(c).microbatch_cost(pack) == pytest.approx(t, rel=1e-12)


def test_features_are_named_and_fit_back():
    """A least-squares fit of the features recovers the coefficients: a calibrator can fit
    the ring like the rest."""
    rng = np.random.default_rng(0)
    n = 300
    sizes = rng.choice([1, 2, 4, 8, 16, 32], n)
    s = rng.integers(1000, 16384, n) * sizes
    ss = s.astype(np.float64) ** 2 / rng.integers(1, 8, n)
    spans = spans_nodes(0, sizes, 8)
    x = group_features(sizes, s, ss, spans)
    assert x.shape == (n, len(FEATURES)) == (n, 6)
    sums = np.stack([sizes, s, ss.astype(np.int64), spans.astype(np.int64)], axis=1)
    assert COST.predict_group_sums(sums, 1) == pytest.approx(x @ COST.group_coefficients(1), rel=1e-8)
    coef, *_ = np.linalg.lstsq(x, x @ COST.group_coefficients(1), rcond=None)
    assert coef == pytest.approx(COST.group_coefficients(1), rel=1e-6)
    assert CostModel.from_group_coefficients(coef).group_coefficients(1) == pytest.approx(coef, rel=1e-12)


def test_at_one_rank_is_the_compute_model_and_spans_nodes_above_a_node():
    assert COST.at(1) == CostModel(7e-7, 8e-11, 0.02)  # the compute terms alone
    assert COST.at(16).linear == pytest.approx((7e-7 + 15 * 4.9e-7) / 16)
    assert COST.at(8).linear == pytest.approx((7e-7 + 7 * 5.5e-8) / 8)
    assert COST.at(8, spans=True).linear == pytest.approx((7e-7 + 7 * 4.9e-7) / 8)
    assert spans_nodes(np.array([0, 6, 8]), np.array([8, 4, 8]), 8).tolist() == [False, True, False]


def test_from_te_p2p_counts_three_transfers_per_step_and_layer():
    cost = CostModel.from_te_p2p(
        CostModel(1e-6, 0.0), attention_layers=4, num_query_groups=4, head_dim=128,
        intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, step_latency=20e-6,
    )  # fmt: skip
    kv_bytes = 2 * 4 * 128 * 2  # K and V, 4 heads of 128, bf16
    assert cost.ring_token == pytest.approx(3 * 4 * kv_bytes / 450e9)
    assert cost.ring_token_inter == pytest.approx(3 * 4 * kv_bytes / 50e9)
    assert cost.ring_step == pytest.approx(3 * 4 * 20e-6)
    half = cost.scaled_ring(0.5)
    assert half.ring_token_inter == pytest.approx(cost.ring_token_inter / 2) and half.at(1) == cost.at(1)


def test_bad_costs():
    with pytest.raises(SeqpackTypeError):
        CostModel(1, 0, ring_step="flops")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CostModel(1, 0, ring_token=-1.0, reference_size=1)
    with pytest.raises(SeqpackTypeError):
        predicted_step_time("plan", COST)  # type: ignore[arg-type]
    plan = plan_dcp([5], dp_size=1, max_tokens_per_rank=8, cost=COST)
    with pytest.raises(SeqpackTypeError, match="cost must be a seqpack.CostModel, got str"):
        predicted_step_time(plan, "flops")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sync"):
        predicted_step_time(plan, COST, sync="sometimes")


@given(
    lengths=st.lists(st.integers(1, 70000), min_size=1, max_size=60),
    ranks=st.sampled_from([4, 8, 16]),
    sync=st.sampled_from(["lockstep", "replica"]),
    sizes=st.sampled_from(["pow2", "any"]),
)
@pytest.mark.slow
def test_predicted_step_time_matches_reference(lengths, ranks, sync, sizes):
    plan = plan_dcp(lengths, dp_size=ranks, max_tokens_per_rank=16384, pad_multiple=8, cost=COST,
                    sync=sync, group_sizes=sizes, on_oversize="drop")  # fmt: skip
    assert predicted_step_time(plan, COST, sync=sync) == pytest.approx(step_time_reference(plan, COST, sync), rel=1e-9)


def test_replica_waits_for_a_group_to_assemble():
    """Hand plan: round 0 rank 0 busy alone, rank 1 idle; round 1 both in one group: under
    replica sync the group starts when rank 0 is done."""
    from seqpack.schedulers import Schedule

    i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    plan = Schedule(
        num_microbatches=2, group_round=i64([0, 0, 1]), group_start=i64([0, 1, 0]), group_size=i64([1, 1, 2]),
        group_counts=i64([1, 0, 1]), assigned=i64([0, 1]), lengths=i64([100, 200]),
        original_lengths=i64([100, 200]), dp_size=2, cp_size=1, max_tokens_per_rank=128, pad_multiple=1,
        group_sizes="any",
    )  # fmt: skip
    plan.validate()
    cost = CostModel(1.0, 0.0, 0.0, reference_size=1)
    assert predicted_step_time(plan, cost, sync="replica") == pytest.approx(100 + 100)
    assert predicted_step_time(plan, cost, sync="lockstep") == pytest.approx(100 + 100)
    idle_cost = CostModel(1.0, 0.0, 7.0, reference_size=1)  # an idle rank's filler costs constant under lockstep
    assert predicted_step_time(plan, idle_cost, sync="lockstep") == pytest.approx(107 + 107)
