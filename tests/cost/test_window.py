"""Sliding-window attention in the cost model (issue 21, cost part): the window feature
against brute-force mask counts, ModelSpec's FLOPs by hand, CostModel's windowed term, the
fit and the presets."""

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import nnls_kkt_violation

from seqpack.cost import (
    CostModel,
    ModelSpec,
    length_features,
    model_preset,
    nnls_fit,
    transformer_flops,
    window_feature,
)
from seqpack.cost.terms import exact_sums, sequence_features
from seqpack.errors import ConfigError, SeqpackTypeError

LLAMA3_8B = dict(
    hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=14336, num_query_groups=8,
    vocab_size=128256,
)  # fmt: skip


def _mask_pairs(length, left, right):
    """(query, key) pairs of a banded mask over one sequence, counted one by one."""
    return sum(1 for i in range(length) for j in range(length) if i - left <= j <= i + right)


@pytest.mark.parametrize("window", [0, 1, 2, 3, 7, 16, 1000])
def test_window_pairs_match_a_brute_force_count_of_the_mask(window):
    seen_beyond = False
    for s in range(0, 41):
        causal = _mask_pairs(s, window, 0)  # TE window_size=(W, 0): keys i-W .. i
        assert window_feature(s, window) == _mask_pairs(s, window, window) == 2 * causal - s
        if s <= window + 1:
            assert causal == s * (s + 1) // 2 and window_feature(s, window) == s * s
        else:
            seen_beyond = True
            assert causal == (window + 1) * (2 * s - window) // 2
            assert window_feature(s, window) == (2 * window + 1) * s - window * (window + 1)
    assert seen_beyond or window >= 39  # not vacuous: lengths past the window were counted


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 70_000), min_size=0, max_size=20), st.integers(0, 70_000))
def test_vectorised_features_are_the_exact_sums(lengths, window):
    per_sequence = sequence_features(np.array(lengths, dtype=np.int64), window)
    assert per_sequence.shape == (len(lengths), 3)
    assert per_sequence[:, 2].tolist() == [window_feature(s, window) for s in lengths]
    assert exact_sums(lengths, window, "mb") == tuple(int(v) for v in per_sequence.sum(axis=0)) or not lengths


# -- ModelSpec ------------------------------------------------------------------------------


@pytest.mark.slow
def test_gpt_oss_flops_by_hand_one_sequence():
    spec = model_preset("gpt-oss-20b")
    assert spec.attention_kinds == (12, 12) and spec.layer_counts == (24, 24, 0)
    s, window = 1000, 128
    q, kv = 64 * 64, 8 * 64
    per_token = 24 * (2 * 2880 * (q + 2 * kv) + 2 * q * 2880) + 24 * 3 * 2 * 2880 * 11520 + 2 * 2880 * 201088
    # Causal attention, Megatron's convention: 2 products x FMA x q per pair, s**2/2 pairs for
    # a full layer; a windowed layer the pairs of its mask with the diagonal counted half.
    pair_flops = 2 * 2 * q
    full = 12 * pair_flops * s * s // 2
    windowed = 12 * pair_flops * (2 * _mask_pairs(s, window, 0) - s) // 2
    expected = 3 * (per_token * s + full + windowed)
    assert spec.sequence_flops([s]) == expected
    assert spec.flops(s, s * s, window_feature(s, window)) == expected
    with pytest.raises(ConfigError, match="gpt-oss-20b has sliding-window layers: pass seqlen_window_sum"):
        spec.flops(s, s * s)


def test_gemma3_is_five_local_to_one_global():
    spec = model_preset("gemma3-27b")
    assert spec.attention_kinds == (10, 52) and spec.layer_counts == (62, 62, 0)
    layers = spec.hybrid_layer_pattern[::2]
    assert [i for i, kind in enumerate(layers) if kind == "*"] == [i for i in range(62) if (i + 1) % 6 == 0]
    assert spec.window_size == 1024 and spec.cost_model().window == 1024


@pytest.mark.parametrize("window", [0, 64, 4096])
@pytest.mark.slow
def test_windowed_model_costs_what_the_full_one_does_below_the_window_and_grows_linearly_above(window):
    full, local = ModelSpec(**LLAMA3_8B), ModelSpec(**LLAMA3_8B, window_size=window)
    assert local.attention_kinds == (0, 32) and local.quadratic_flops == 0
    assert local.windowed_flops == full.quadratic_flops
    below = range(0, window + 2)
    assert all(local.sequence_flops([s]) == full.flops(s, s * s) for s in below)
    lengths = np.arange(0, window + 2, dtype=np.int64)
    assert np.array_equal(local.cost_model().cost(lengths), full.cost_model().cost(lengths))
    # Far above: each extra token costs the same (linear), full attention keeps growing.
    above = [local.sequence_flops([s]) for s in range(window + 2, window + 40)]
    steps = {b - a for a, b in pairwise(above)}
    assert steps == {local.linear_flops + local.windowed_flops * (2 * window + 1)}
    big = 64 * (window + 2)
    assert local.sequence_flops([big]) < full.sequence_flops([big])


def test_pattern_letters_and_windows_must_agree():
    shape = dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=128)
    with pytest.raises(ConfigError, match=r"2 sliding-window layers \(W\) but no window_size"):
        ModelSpec(**shape, num_layers=4, hybrid_layer_pattern="W-W-")
    with pytest.raises(ConfigError, match="window_size=8 but hybrid_layer_pattern has no sliding-window layer"):
        ModelSpec(**shape, num_layers=4, hybrid_layer_pattern="*-*-", window_size=8)
    with pytest.raises(ConfigError, match=r"unknown layer types \['E'\]; use M \(Mamba2\), .* W \(sliding-window"):
        ModelSpec(**shape, num_layers=2, hybrid_layer_pattern="E-")
    with pytest.raises(SeqpackTypeError, match="hybrid_layer_pattern must be a string"):
        ModelSpec(**shape, num_layers=2, hybrid_layer_pattern=["*", "-"])
    with pytest.raises(ValueError, match="window_size must be an integer 0 <= w <= 2147483647, got -1"):
        ModelSpec(**shape, num_layers=2, window_size=-1)
    mixed = ModelSpec(**shape, num_layers=4, hybrid_layer_pattern="W-*-", window_size=8)
    assert mixed.attention_kinds == (1, 1) and mixed.quadratic_flops == mixed.windowed_flops > 0
    # Pattern without Mamba layers: the Mamba shape is not checked (1.5*64 heads would not divide).
    ModelSpec(**shape, num_layers=2, hybrid_layer_pattern="*-", mamba_head_dim=48)


def test_transformer_flops_and_from_transformer_take_the_window():
    got = transformer_flops(
        **LLAMA3_8B, seqlen_sum=5000, seqlen_sq_sum=5000**2, seqlen_window_sum=window_feature(5000, 4096),
        window_size=4096,
    )  # fmt: skip
    assert got == ModelSpec(**LLAMA3_8B, window_size=4096).sequence_flops([5000])
    cost = CostModel.from_transformer(**LLAMA3_8B, window_size=4096, constant=3.0)
    assert (cost.window, cost.quadratic, cost.constant) == (4096, 0.0, 3.0) and cost.windowed > 0


# -- CostModel ------------------------------------------------------------------------------


def test_windowed_cost_is_linear_quadratic_and_windowed_terms():
    model = CostModel(3.0, 0.5, 7.0, windowed=2.0, window=4)
    lengths = np.arange(0, 30)
    want = [3.0 * s + 0.5 * s * s + 2.0 * window_feature(s, 4) for s in range(30)]
    assert model.cost(lengths).tolist() == pytest.approx(want, rel=1e-15)
    assert model.microbatch_cost([3, 20]) == pytest.approx(7.0 + want[3] + want[20])
    assert model.terms == ("constant", "linear", "quadratic", "windowed")
    assert model.coefficients == (7.0, 3.0, 0.5, 2.0)
    assert CostModel.from_coefficients(model.coefficients, window=4) == model
    assert model.predict_sums(np.array([[23, 409, 9 + 160]])).tolist() == [model.microbatch_cost([3, 20])]
    with pytest.raises(ConfigError, match="needs sums of"):
        model.predict_sums(np.array([23, 409]))
    assert window_feature(3, 4) == 9 and window_feature(20, 4) == 9 * 20 - 4 * 5 == 160
    share = model.quadratic_share(20)
    assert share == pytest.approx((0.5 * 400 + 2.0 * 160) / (60 + 0.5 * 400 + 2.0 * 160))


def test_a_model_without_window_is_the_three_term_model_bit_for_bit():
    old = CostModel(1.5, 0.25, 3.0)
    assert repr(old) == "CostModel(linear=1.5, quadratic=0.25, constant=3.0)"
    assert old == CostModel(1.5, 0.25, 3.0, windowed=0.0, window=None) and old.terms == (
        "constant",
        "linear",
        "quadratic",
    )
    assert hash(old) == hash(CostModel(linear=1.5, quadratic=0.25, constant=3.0))
    assert "windowed=0.0, window=128" in repr(CostModel(1.0, 0.0, window=128))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(windowed=1.0), ConfigError, r"windowed=1.0 needs a window"),
        (dict(windowed=1.0, window=-1), ConfigError, "window must be an integer 0 <= w <= 2147483647"),
        (dict(windowed=1.0, window=2**64), ConfigError, f"window must be an integer 0 <= w <= 2147483647, got {2**64}"),
        (dict(windowed=1.0, window=True), SeqpackTypeError, "window must be"),
        (dict(windowed=-1.0, window=4), ConfigError, "CostModel.windowed must be >= 0.0, got -1.0"),
        (dict(windowed="1", window=4), SeqpackTypeError, "windowed must be a number"),
    ],
)
def test_windowed_term_is_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        CostModel(1.0, 0.0, **kwargs)


def test_only_a_windowed_term_is_a_valid_model_and_all_zero_is_not():
    assert CostModel(0, 0, windowed=1.0, window=8).cost([4]).tolist() == [16.0]
    with pytest.raises(ConfigError, match="got all four"):
        CostModel(0, 0, window=8)


def test_fit_with_a_window_recovers_four_coefficients_and_is_the_nnls_optimum():
    truth = CostModel(2e-4, 1e-9, 0.01, windowed=3e-7, window=256)
    rng = np.random.default_rng(0)
    mbs = [rng.integers(16, 4096, rng.integers(1, 8)) for _ in range(60)]
    times = [truth.microbatch_cost(mb) for mb in mbs]
    fit = CostModel.fit(mbs, times, window=256)
    assert fit.window == 256
    for name in ("linear", "quadratic", "constant", "windowed"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    noisy = np.array(times) * np.exp(0.3 * rng.standard_normal(60))
    features = length_features(mbs, 256)
    assert features.shape == (60, 4)
    coef = np.array(CostModel.fit(mbs, noisy, window=256).coefficients)
    assert nnls_kkt_violation(features, noisy, coef) < 1e-7
    assert nnls_kkt_violation(features, noisy, coef + np.array([0, 0, 0, 1e-6])) > 1e-4  # the check can fail
    assert np.array_equal(nnls_fit(features, noisy), coef)
    # Without a window the fit is the three-term one, as before.
    assert CostModel.fit(mbs, times).window is None


def test_fit_below_the_window_gives_the_quadratic_term_not_the_windowed_one():
    """Every sequence within the window: SW == SS, the columns coincide and the smaller,
    earlier support (quadratic) wins: the fitted model is the full-attention one."""
    truth = CostModel(1e-4, 2e-7, 0.02)
    rng = np.random.default_rng(1)
    mbs = [rng.integers(8, 200, rng.integers(1, 6)) for _ in range(30)]
    fit = CostModel.fit(mbs, [truth.microbatch_cost(mb) for mb in mbs], window=512)
    assert fit.windowed == 0 and fit.quadratic == pytest.approx(truth.quadratic, rel=1e-6)


@pytest.mark.parametrize("bound", [2**31, 2**62, 2**64])
def test_a_window_past_int32_is_refused_where_it_enters(bound):
    # Accepted before; a window of 2**62 or more then failed in calibration's per-sequence
    # features with "OverflowError: Python int too large to convert to C long".
    shape = dict(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128)
    message = rf"must be an integer 0 <= w <= 2147483647, got {bound}"
    with pytest.raises(ConfigError, match="window_size " + message):
        ModelSpec(**shape, window_size=bound)
    with pytest.raises(ConfigError, match="window " + message):
        CostModel.fit([[100], [200, 50], [400], [30, 30, 30], [7]], [1.0, 2.1, 4.3, 1.0, 0.1], window=bound)
    with pytest.raises(ConfigError, match="window " + message):
        CostModel.from_coefficients([0.0, 1.0, 0.0, 1.0], window=bound)


def test_the_widest_window_is_exact_in_every_feature():
    widest = 2**31 - 1
    lengths = np.array([5, 2**30, 2**31])
    assert sequence_features(lengths, widest)[:, 2].tolist() == [exact_sums([s], widest, "s")[2] for s in lengths]
    model = ModelSpec(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128, window_size=widest)
    full = ModelSpec(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128)
    assert model.sequence_flops([2**20]) == full.sequence_flops([2**20])  # the window reaches every key
