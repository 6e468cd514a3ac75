import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import nnls_kkt_violation

from seqpack.cost import (
    MODEL_PRESETS,
    CostModel,
    ModelSpec,
    default_cost_model,
    length_features,
    mamba2_flops,
    model_preset,
    nnls_fit,
    transformer_flops,
)

# Llama-3-8B (Meta's published config): h=4096, 32 layers, 32 heads, 8 KV heads,
# FFN 14336 (SwiGLU), vocab 128256.
LLAMA3_8B = dict(
    hidden_size=4096,
    num_layers=32,
    num_attention_heads=32,
    ffn_hidden_size=14336,
    num_query_groups=8,
    vocab_size=128256,
)


def test_llama3_8b_parameter_count_matches_published():
    # 8,030,261,248 parameters as published for Meta-Llama-3-8B.
    assert model_preset("llama3-8b").num_parameters() == 8_030_261_248


def test_nemotron_h_8b_parameter_count_matches_published():
    # Nemotron-H-8B-Base-8K: 24 Mamba2, 4 attention and 24 MLP layers; 8,100,852,736 params.
    spec = model_preset("nemotron-h-8b")
    assert spec.layer_counts == (4, 24, 24)
    assert spec.num_parameters() == 8_100_852_736


def test_llama3_8b_flops_by_hand_one_8k_sequence():
    s = 8192
    # Forward, per layer and token, 2 FLOPs per multiply-add:
    q_proj, k_proj, v_proj, o_proj = 4096 * 4096, 4096 * 1024, 4096 * 1024, 4096 * 4096
    mlp = 3 * 4096 * 14336
    per_token_fwd = 2 * 32 * (q_proj + k_proj + v_proj + o_proj + mlp) + 2 * 4096 * 128256
    assert per_token_fwd == 15_009_316_864
    # Causal attention: QK^T and AV each s*s/2 * 4096 multiply-adds per layer.
    attention_fwd = 32 * 2 * (2 * (s * s // 2) * 4096)
    expected = 3 * (per_token_fwd * s + attention_fwd)
    assert expected == 421_645_529_382_912
    got = transformer_flops(**LLAMA3_8B, seqlen_sum=s, seqlen_sq_sum=s * s)
    assert got == expected and isinstance(got, int)
    # Non-causal attention doubles the quadratic term only.
    full = transformer_flops(**LLAMA3_8B, seqlen_sum=s, seqlen_sq_sum=s * s, causal=False)
    assert full - got == 3 * attention_fwd


def test_matches_megatron_closed_form_for_fixed_length_batches():
    # Megatron-LM's classic formula for B sequences of length s (GQA, SwiGLU):
    # 12*B*s*L*h^2 * ((1 + g/n + s/(2h)) + 1.5*ffn/h + V/(2*L*h)).
    b, s, h, L, n, g, ffn, V = 16, 4096, 4096, 32, 32, 8, 14336, 128256
    closed = 12 * b * s * L * h * h * ((1 + g / n + s / h / 2) + 1.5 * ffn / h + V / (2 * L * h))
    ours = transformer_flops(**LLAMA3_8B, seqlen_sum=b * s, seqlen_sq_sum=b * s * s)
    assert ours == pytest.approx(closed, rel=1e-12)


def test_packed_flops_are_linear_in_the_two_sums():
    spec = model_preset("llama3-70b")
    lengths = [100, 2000, 37]
    total = spec.flops(sum(lengths), sum(x * x for x in lengths))
    assert total == sum(spec.flops(x, x * x) for x in lengths)
    assert spec.flops(0, 0) == 0


def test_mamba2_layers_by_hand():
    # One Nemotron-H-8B Mamba2 mixer: h=4096, d_inner=8192, 8 groups, state 128, 128 heads.
    in_proj = 2 * 4096 * (2 * 8192 + 2 * 8 * 128 + 128)
    scan = 7 * 8192 * 128
    out_proj = 2 * 8192 * 4096
    per_token_train = 3 * (in_proj + scan + out_proj)
    assert mamba2_flops(1000, hidden_size=4096, num_heads=128) == 1000 * per_token_train
    assert mamba2_flops(10, hidden_size=4096, num_layers=24) == 24 * 10 * per_token_train
    # In the hybrid model: Mamba and MLP layers are linear; only 4 attention layers are quadratic.
    spec = model_preset("nemotron-h-8b")
    mlp_train = 3 * 2 * 2 * 4096 * 21504  # squared ReLU: two projections
    attn_linear_train = 3 * 2 * (4096 * (4096 + 2 * 1024) + 4096 * 4096)
    logits_train = 3 * 2 * 4096 * 131072
    assert spec.linear_flops == 24 * per_token_train + 24 * mlp_train + 4 * attn_linear_train + logits_train
    assert spec.quadratic_flops == 3 * 4 * 2 * 4096
    assert (
        spec.flops(10, 100)
        == mamba2_flops(10, hidden_size=4096, num_layers=24)
        + 10 * (24 * mlp_train + 4 * attn_linear_train + logits_train)
        + 100 * spec.quadratic_flops
    )


def test_cost_model_from_transformer_and_presets():
    c = CostModel.from_transformer(**LLAMA3_8B)
    assert c.linear == 3 * 15_009_316_864 and c.quadratic == 3 * 32 * 2 * 4096
    assert c == CostModel.from_preset("llama3-8b") == default_cost_model()
    # GQA: fewer KV heads -> cheaper per token; attention term unchanged.
    mha = CostModel.from_transformer(**{**LLAMA3_8B, "num_query_groups": None})
    assert mha.linear > c.linear and mha.quadratic == c.quadratic
    assert CostModel.from_transformer(**LLAMA3_8B, causal=False).quadratic == 2 * c.quadratic
    assert CostModel.from_transformer(**LLAMA3_8B, constant=5.0).constant == 5.0
    # One 8K sequence: the quadratic term is ~12.5% of its cost.
    assert 0.12 < c.quadratic_share(8192) < 0.13
    lengths = np.array([1, 10, 8192])
    assert np.allclose(c.cost(lengths), c.linear * lengths + c.quadratic * lengths**2.0)
    assert c.microbatch_cost(lengths) == pytest.approx(c.cost(lengths).sum())
    for spec in MODEL_PRESETS.values():
        assert spec.cost_model().linear > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(linear=-1.0, quadratic=0.0), "CostModel.linear must be >= 0.0, got -1.0"),
        (dict(linear=0.0, quadratic=0.0), "linear > 0 or quadratic > 0"),
        (dict(linear=1.0, quadratic=float("nan")), "quadratic must be finite"),
        (dict(linear=10**400, quadratic=0.0), "CostModel.linear must be finite"),
    ],
)
def test_cost_model_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**kwargs)


def test_cost_model_rejects_non_numbers():
    with pytest.raises(TypeError, match="must be a number"):
        CostModel("1", 0.0)


def test_model_spec_validation():
    with pytest.raises(ValueError, match="num_attention_heads=32 is not a multiple of num_query_groups=5"):
        ModelSpec(4096, 2, 32, 100, num_query_groups=5)
    with pytest.raises(ValueError, match="unknown layer types"):
        ModelSpec(64, 2, 4, 100, hybrid_layer_pattern="MX")
    with pytest.raises(ValueError, match="has 2 layers but num_layers=3"):
        ModelSpec(64, 3, 4, 100, hybrid_layer_pattern="M*")
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        ModelSpec(0, 3, 4, 100)
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        model_preset("gpt5")
    with pytest.raises(ValueError, match="seqlen_sum must be an integer >= 0"):
        model_preset("llama3-8b").flops(-1, 0)


def test_cost_model_fit_recovers_coefficients_and_stays_non_negative():
    rng = np.random.default_rng(0)
    truth = CostModel(2e-4, 3e-7, 0.01)
    mbs = [rng.integers(16, 2048, rng.integers(1, 12)) for _ in range(40)]
    times = [truth.microbatch_cost(mb) for mb in mbs]
    fit = CostModel.fit(mbs, times)
    assert fit.linear == pytest.approx(truth.linear, rel=1e-6)
    assert fit.quadratic == pytest.approx(truth.quadratic, rel=1e-6)
    assert fit.constant == pytest.approx(truth.constant, rel=1e-6)
    # Purely linear timings with noise that would push the quadratic term negative.
    lin = [1e-3 * float(np.sum(mb)) - 1e-12 * float(np.sum(np.asarray(mb, float) ** 2)) for mb in mbs]
    fit = CostModel.fit(mbs, lin)
    assert fit.quadratic >= 0 and fit.constant >= 0 and fit.linear > 0
    with pytest.raises(ValueError, match="at least 3"):
        CostModel.fit(mbs[:2], times[:2])
    with pytest.raises(ValueError, match="2 timings"):
        CostModel.fit(mbs[:3], times[:2])


# -- robust fit (issue 10, item 1) ----------------------------------------------------------


def _random_microbatches(rng, count, low=16, high=2048):
    return [rng.integers(low, high, rng.integers(1, 12)) for _ in range(count)]


def test_cost_model_constant_only_is_valid_and_zero_is_not():
    flat = CostModel(0, 0, 0.02)
    assert flat.microbatch_cost([100, 2000]) == pytest.approx(0.02)
    assert flat.microbatch_cost([]) == pytest.approx(0.02)
    assert flat.quadratic_share(1000) == 0.0
    assert np.all(flat.cost([5, 7]) == 0)
    with pytest.raises(ValueError, match="got all three 0"):
        CostModel(0, 0, 0)


def test_fit_flat_timings_gives_a_constant_model_instead_of_raising():
    rng = np.random.default_rng(1)
    mbs = _random_microbatches(rng, 30)
    fit = CostModel.fit(mbs, [0.020] * len(mbs))
    assert fit.linear == 0 and fit.quadratic == 0
    assert fit.constant == pytest.approx(0.020)
    # Timings that fall with length: the best non-negative model is still a constant.
    falling = [0.03 - 1e-7 * float(np.sum(mb)) for mb in mbs]
    fit = CostModel.fit(mbs, falling)
    assert fit.linear == 0 and fit.quadratic == 0 and fit.constant == pytest.approx(np.mean(falling))


def test_fit_launch_bound_clock_keeps_its_constant():
    # The h2048 x4 H100 fit of issue 10: 20 ms + 7.32e-7 s*S + 7.84e-11 s*SS.
    truth = CostModel(7.32e-7, 7.84e-11, 0.020)
    rng = np.random.default_rng(2)
    mbs = _random_microbatches(rng, 64, 64, 4096)
    fit = CostModel.fit(mbs, [truth.microbatch_cost(mb) for mb in mbs])
    for name in ("linear", "quadratic", "constant"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_fit_rejects_non_finite_and_non_positive_timings(bad):
    mbs = [[10], [20], [30], [40]]
    with pytest.raises(ValueError, match=r"seconds\[2\]="):
        CostModel.fit(mbs, [1.0, 2.0, bad, 4.0])


def test_fit_checks_its_arguments():
    with pytest.raises(ValueError, match="robust must be"):
        CostModel.fit([[1], [2], [3]], [1.0, 2.0, 3.0], robust="yes")
    with pytest.raises(ValueError, match="negative length"):
        CostModel.fit([[1], [-2], [3]], [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="integers"):
        CostModel.fit([[1.5], [2], [3]], [1.0, 2.0, 3.0])
    # Empty microbatches (padding-only fillers) are fine: S = SS = 0.
    fit = CostModel.fit([[], [10], [20], [30]], [1.0, 2.0, 3.0, 4.0])
    assert fit.constant == pytest.approx(1.0) and fit.linear == pytest.approx(0.1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(3, 25),
    coef=st.tuples(
        st.sampled_from([0.0, 1e-3, 0.05]), st.sampled_from([0.0, 1e-6, 3e-5]), st.sampled_from([0.0, 1e-10, 1e-8])
    ),
    noise=st.sampled_from([0.0, 0.05, 0.5]),
)
@pytest.mark.slow
def test_fit_is_the_exact_nnls_optimum(seed, count, coef, noise):
    """KKT conditions of NNLS hold for every fit: it is the optimum, not an approximation."""
    rng = np.random.default_rng(seed)
    mbs = _random_microbatches(rng, count, 1, 4096)
    feats = length_features(mbs)
    base = feats @ np.array(coef) + 1e-3
    y = base * np.exp(noise * rng.standard_normal(count))
    fit = CostModel.fit(mbs, y)
    got = np.array([fit.constant, fit.linear, fit.quadratic])
    assert nnls_kkt_violation(feats, y, got) < 1e-7
    # Not vacuous: the fit explains the data no worse than the best constant does.
    assert float(((feats @ got - y) ** 2).sum()) <= float(((y - y.mean()) ** 2).sum()) + 1e-9 * float(y @ y)


def test_nnls_fit_matches_the_kkt_reference_with_weights():
    rng = np.random.default_rng(3)
    mbs = _random_microbatches(rng, 40)
    feats = length_features(mbs)
    y = feats @ np.array([0.01, 2e-5, 0.0]) * np.exp(0.2 * rng.standard_normal(40))
    w = rng.uniform(0.1, 2.0, 40)
    coef = nnls_fit(feats, y, w)
    assert nnls_kkt_violation(feats, y, coef, w) < 1e-7
    assert nnls_kkt_violation(feats, y, coef + np.array([0.0, 1e-6, 0.0]), w) > 1e-4  # the check can fail


@pytest.mark.parametrize("truth", [CostModel(7.32e-7, 7.84e-11, 0.020), CostModel(3.32e-6, 1.00e-10, 9.2e-4)])
def test_robust_fit_ignores_3x_outliers(truth):
    rng = np.random.default_rng(4)
    mbs = _random_microbatches(rng, 120, 64, 4096)
    clean = np.array([truth.microbatch_cost(mb) for mb in mbs])
    noisy = clean * rng.uniform(0.95, 1.05, clean.shape[0])
    outliers = rng.choice(clean.shape[0], 12, replace=False)  # 10% compile steps / GC pauses
    noisy[outliers] *= 3.0
    robust = CostModel.fit(mbs, noisy, robust=True)
    plain = CostModel.fit(mbs, noisy)

    def worst_error(model):
        pred = np.array([model.microbatch_cost(mb) for mb in mbs])
        return float(np.max(np.abs(pred / clean - 1)))

    assert worst_error(robust) < 0.03
    assert worst_error(plain) > 0.10  # the outliers do drag a plain fit: the test can fail


def test_robust_fit_on_clean_data_is_the_exact_model():
    truth = CostModel(2e-4, 3e-7, 0.01)
    rng = np.random.default_rng(5)
    mbs = _random_microbatches(rng, 30)
    fit = CostModel.fit(mbs, [truth.microbatch_cost(mb) for mb in mbs], robust=True)
    for name in ("linear", "quadratic", "constant"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    flat = CostModel.fit(mbs, [0.5] * 30, robust=True)
    assert (flat.linear, flat.quadratic, flat.constant) == (0, 0, pytest.approx(0.5))


def test_cost_past_float64_is_an_error_not_inf():
    model = CostModel(1.0, 1e300)
    with pytest.raises(ValueError, match=r"cost of a 1\.04858e\+06-token sequence .* is past float64"):
        model.cost([2**20])
    with pytest.raises(ValueError, match="past float64"):
        model.microbatch_cost([2**20, 5])
    from seqpack.schedulers import get_scheduler

    with pytest.raises(ValueError, match="past float64"):
        get_scheduler("balanced").schedule([2**20] * 4, dp_size=2, max_tokens_per_rank=2**21, cost=model)
    assert model.cost([1]).tolist() == [1.0 + 1e300]  # large but finite stays a number
