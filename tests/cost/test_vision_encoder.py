"""The vision encoder's cost (issue 41 item 3): VisionSpec's checks, its windows against a
brute-force count of each window's attention pairs and against transformers' own window index,
and its training FLOPs against what PyTorch's FlopCounterMode counts over the tiny HF encoders
(Qwen2-VL, Qwen2.5-VL with windows, Qwen3-VL with deepstack mergers), forward and backward."""

import itertools

import numpy as np
import pytest

from seqpack.cost import VisionSpec
from seqpack.cost.vision_encoder import window_pairs
from seqpack.errors import ConfigError, SampleError, SeqpackTypeError

SHAPE = dict(
    hidden_size=32, num_layers=4, num_attention_heads=2, ffn_hidden_size=40, patch_size=14, temporal_patch_size=2,
    spatial_merge_size=2, out_hidden_size=48,
)  # fmt: skip
GRIDS = [[1, 2, 2], [1, 6, 10], [2, 4, 4], [1, 10, 2], [3, 16, 18], [1, 34, 50], [4, 8, 8]]


def windowed(window_size=112, layers=(1, 3), merge=2, patch=14):
    shape = {**SHAPE, "spatial_merge_size": merge, "patch_size": patch}
    return VisionSpec(**shape, window_size=window_size, full_attention_layers=layers)


def brute_window_pairs(grid, merge, units):
    """Attention pairs of the windowed blocks, patch by patch: a patch (f, y, x) is in window
    (f, y // merge // units, x // merge // units); patches of one window attend each other."""
    t, h, w = grid
    windows = {}
    for f, y, x in itertools.product(range(t), range(h), range(w)):
        key = (f, y // merge // units, x // merge // units)
        windows[key] = windows.get(key, 0) + 1
    return sum(n * n for n in windows.values())


def test_window_pairs_sum_the_squared_window_sizes():
    for n, k in itertools.product(range(30), (1, 2, 3, 4, 7)):
        sizes = [min(k, n - start) for start in range(0, n, k)]
        assert window_pairs(n, k) == sum(a * a for a in sizes)
    ns = np.arange(30)
    assert window_pairs(ns, 4).tolist() == [window_pairs(int(n), 4) for n in ns]


@pytest.mark.parametrize("window_size, merge, patch", [(112, 2, 14), (56, 2, 14), (84, 2, 14), (16, 2, 4), (12, 1, 4)])
def test_window_features_count_the_pairs_of_each_window(window_size, merge, patch):
    spec = windowed(window_size, merge=merge, patch=patch)
    grids = [g for g in GRIDS if g[1] % merge == 0 and g[2] % merge == 0]
    features = spec.grid_features(grids)
    cut_short = False
    for grid, (patches, full, window) in zip(grids, features.tolist(), strict=True):
        t, h, w = grid
        assert patches == t * h * w and full == t * (h * w) ** 2
        assert window == brute_window_pairs(grid, merge, spec.window_units)
        cut_short |= (h // merge) % spec.window_units != 0 or (w // merge) % spec.window_units != 0
    assert cut_short  # not vacuous: some windows are cut short at the frame's edge


@pytest.mark.slow
def test_the_windows_are_transformers_windows():
    """get_vision_window_index's windows (its cu_window_seqlens) hold the pairs counted."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_window_index

    for window_size, merge, patch in [(112, 2, 14), (56, 2, 14), (16, 2, 4), (12, 1, 4)]:
        spec = windowed(window_size, merge=merge, patch=patch)
        grids = [g for g in GRIDS if g[1] % merge == 0 and g[2] % merge == 0]
        grid = torch.tensor(grids)
        _, cu_windows = get_vision_window_index(grid, merge, window_size, patch)
        cu_full = get_vision_cu_seqlens(grid)
        features = spec.grid_features(grids)
        assert int((cu_windows.diff().long() ** 2).sum()) == int(features[:, 2].sum())
        assert int((cu_full.diff().long() ** 2).sum()) == int(features[:, 1].sum())


def test_flops_are_the_coefficients_times_the_features():
    spec = windowed()
    linear, full, window = spec.coefficients
    assert spec.attention_kinds == (2, 2) and spec.window_units == 4
    expected = 0
    for t, h, w in GRIDS:
        expected += linear * t * h * w + full * t * (h * w) ** 2 + window * brute_window_pairs((t, h, w), 2, 4)
    assert spec.flops(GRIDS[:3], GRIDS[3:]) == expected
    assert np.allclose(spec.grid_flops(GRIDS).sum(), expected, rtol=1e-12)
    plain = VisionSpec(**SHAPE)
    assert plain.attention_kinds == (4, 0) and plain.window_flops == 0 and plain.window_units is None
    assert plain.grid_features(GRIDS)[:, 2].tolist() == [0] * len(GRIDS)


def test_sample_flops_is_flops_per_sample():
    spec = windowed()
    rng = np.random.default_rng(0)
    samples = [[GRIDS[i] for i in rng.integers(0, len(GRIDS), size=n)] for n in (0, 1, 3, 0, 2, 5)]
    rows = [g for s in samples for g in s]
    owner = [i for i, s in enumerate(samples) for _ in s]
    got = spec.sample_flops(rows, owner, len(samples))
    assert got.dtype == np.float64 and got.shape == (len(samples),)
    want = [spec.flops(s or None) for s in samples]
    assert np.allclose(got, want, rtol=1e-12) and got[0] == 0.0 and got[3] == 0.0
    assert spec.sample_flops(np.zeros((0, 3), dtype=np.int64), [], 2).tolist() == [0.0, 0.0]
    assert spec.flops() == 0 and spec.flops(np.zeros((0, 3), dtype=np.int64)) == 0


def test_flops_are_exact_python_ints_past_int64():
    spec = VisionSpec(**{**SHAPE, "hidden_size": 8192, "num_attention_heads": 64, "num_layers": 1000})
    huge = [[2000, 400, 400]]  # 2000 frames of 160,000 patches
    flops = spec.flops(huge)
    assert isinstance(flops, int) and flops > 2**63
    assert np.isclose(spec.grid_flops(huge)[0], float(flops), rtol=1e-12)


@pytest.mark.parametrize(
    "change, error, words",
    [
        ({"hidden_size": 33}, ConfigError, "not divisible by num_attention_heads=2"),
        ({"patch_size": 0}, ConfigError, "VisionSpec.patch_size"),
        ({"num_layers": 2.0}, SeqpackTypeError, "VisionSpec.num_layers"),
        ({"gated_linear_unit": 1}, SeqpackTypeError, "VisionSpec.gated_linear_unit"),
        ({"full_attention_layers": (1,)}, ConfigError, "without a window_size"),
        ({"window_size": 27}, ConfigError, "window_size=27 pixels is under one merged patch"),
        ({"window_size": 112, "full_attention_layers": (4,)}, ConfigError, "full_attention_layers element"),
        ({"window_size": 112, "full_attention_layers": (1, 1)}, ConfigError, "repeats a block"),
        ({"window_size": 112, "full_attention_layers": "13"}, SeqpackTypeError, "sequence of ints"),
    ],
)
def test_bad_shapes_are_named(change, error, words):
    with pytest.raises(error, match=words):
        VisionSpec(**{**SHAPE, **change})


def test_full_attention_layers_are_stored_sorted():
    spec = VisionSpec(**SHAPE, window_size=112, full_attention_layers=[3, 0])
    assert spec.full_attention_layers == (0, 3) and hash(spec) == hash(windowed(layers=(0, 3)))


@pytest.mark.parametrize(
    "grid, words",
    [
        ([[1, 3, 4]], r"row 0 is \[1, 3, 4\]: h and w must be multiples of spatial_merge_size=2"),
        ([[1, 4, 4], [0, 4, 4]], r"row 1 is \[0, 4, 4\]: t, h and w must be >= 1"),
        ([1, 4, 4], r"must be \[k, 3\] rows"),
        ([[1, 4, 4, 1]], r"must be \[k, 3\] rows"),
    ],
)
def test_bad_grids_are_named(grid, words):
    with pytest.raises(SampleError, match=words):
        windowed().grid_features(grid)


def test_bad_sample_indices_are_named():
    spec = windowed()
    with pytest.raises(SampleError, match="sample_index has 1 entries but grid_thw has 2 rows"):
        spec.sample_flops([[1, 4, 4], [1, 4, 4]], [0], 1)
    with pytest.raises(SampleError, match="sample_index holds 2, outside 0..1"):
        spec.sample_flops([[1, 4, 4]], [2], 2)
    with pytest.raises(SeqpackTypeError, match="grid_thw must be integers"):
        spec.grid_features([[1.5, 4, 4]])


# -- against the HF encoders -------------------------------------------------------------


def _tiny_encoders():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    common = dict(num_heads=2, patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    return {
        "qwen2_vl": (
            transformers.Qwen2VLConfig(
                vision_config=dict(depth=2, embed_dim=32, hidden_size=48, mlp_ratio=2, **common)
            ),
            Qwen2VisionTransformerPretrainedModel,
        ),
        "qwen2_5_vl": (
            transformers.Qwen2_5_VLConfig(
                vision_config=dict(
                    depth=3,
                    hidden_size=32,
                    intermediate_size=40,
                    out_hidden_size=48,
                    window_size=16,
                    fullatt_block_indexes=[1],
                    **common,
                )
            ),
            Qwen2_5_VisionTransformerPretrainedModel,
        ),
        "qwen3_vl": (
            transformers.Qwen3VLConfig(
                vision_config=dict(
                    depth=3,
                    hidden_size=32,
                    intermediate_size=40,
                    out_hidden_size=48,
                    num_position_embeddings=64,
                    deepstack_visual_indexes=[0, 2],
                    **common,
                )
            ),
            Qwen3VLVisionModel,
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_flops_are_what_the_hf_encoder_computes(family):
    """Forward and backward of the tiny HF encoder (eager attention: one product per window or
    frame), counted by FlopCounterMode, are exactly VisionSpec.flops of its grids."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    config, encoder_class = _tiny_encoders()[family]
    vision = config.vision_config
    spec = VisionSpec.from_hf(config)
    torch.manual_seed(0)
    model = encoder_class._from_config(vision, attn_implementation="eager")
    grids = torch.tensor([[1, 6, 10], [2, 4, 4], [1, 10, 2]])  # 6 and 10: windows cut short
    pixels = torch.randn(int(grids.prod(-1).sum()), vision.in_channels * vision.temporal_patch_size * 4 * 4)
    with FlopCounterMode(display=False) as counter:
        out = model(pixels, grid_thw=grids)
        loss = out.pooler_output.sum() + sum(f.sum() for f in (getattr(out, "deepstack_features", None) or []))
        loss.backward()
    assert spec.flops(grids) == counter.get_total_flops()
    if family == "qwen2_5_vl":
        assert spec.attention_kinds == (1, 2) and spec.window_units == 2
    if family == "qwen3_vl":
        assert spec.num_mergers == 3
