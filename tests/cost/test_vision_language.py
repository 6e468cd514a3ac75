"""ModelSpec's vision-language half (issue 41 item 3): ModelSpec.from_hf on transformers' own
configs (the real-size defaults and tiny ones), field by field against the config attributes
and FLOPs against the tiny HF models; the vision field's checks; a sample's FLOPs."""

import dataclasses
import types

import numpy as np
import pytest

from seqpack.cost import ModelSpec, VisionSpec, window_feature
from seqpack.cost.vision_language import TEXT_MODEL_TYPES, VISION_LANGUAGE_MODEL_TYPES, model_fields_from_hf
from seqpack.errors import ConfigError, SeqpackTypeError

transformers = pytest.importorskip("transformers")

TEXT = dict(
    vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)  # fmt: skip
VISION = dict(num_heads=2, patch_size=4, temporal_patch_size=2, spatial_merge_size=2, depth=2)
TINY = {
    "llama": lambda: transformers.LlamaConfig(**TEXT),
    "qwen2": lambda: transformers.Qwen2Config(**TEXT),
    "qwen3": lambda: transformers.Qwen3Config(**TEXT, head_dim=16),  # not hidden/heads: read, not derived
    "qwen2_vl": lambda: transformers.Qwen2VLConfig(
        text_config=TEXT, vision_config=dict(VISION, embed_dim=16, hidden_size=32, mlp_ratio=3)
    ),
    "qwen2_5_vl": lambda: transformers.Qwen2_5_VLConfig(
        text_config=TEXT,
        vision_config=dict(VISION, hidden_size=16, intermediate_size=24, out_hidden_size=32, fullatt_block_indexes=[1]),
    ),
    "qwen3_vl": lambda: transformers.Qwen3VLConfig(
        text_config=dict(TEXT, head_dim=16),
        vision_config=dict(
            VISION, hidden_size=16, intermediate_size=24, out_hidden_size=32, deepstack_visual_indexes=[0]
        ),
    ),
}
DEFAULTS = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "qwen2_vl": transformers.Qwen2VLConfig,
    "qwen2_5_vl": transformers.Qwen2_5_VLConfig,
    "qwen3_vl": transformers.Qwen3VLConfig,
}


def _check_text_fields(spec, text):
    assert spec.hidden_size == text.hidden_size
    assert spec.num_layers == text.num_hidden_layers and spec.hybrid_layer_pattern is None
    assert spec.num_attention_heads == text.num_attention_heads
    assert spec.ffn_hidden_size == text.intermediate_size and spec.gated_linear_unit
    assert spec.query_groups == text.num_key_value_heads
    assert spec.vocab_size == text.vocab_size
    assert spec.head_dim == getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert spec.causal and spec.window_size is None


def _check_vision_fields(vision, config):
    assert isinstance(vision, VisionSpec)
    assert vision.num_layers == config.depth and vision.num_attention_heads == config.num_heads
    for field in ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels"):
        assert getattr(vision, field) == getattr(config, field)
    if config.model_type == "qwen2_vl_vision":
        assert vision.hidden_size == config.embed_dim and vision.out_hidden_size == config.hidden_size
        assert vision.ffn_hidden_size == config.embed_dim * config.mlp_ratio and not vision.gated_linear_unit
        assert vision.window_size is None and vision.num_mergers == 1
        return
    assert vision.hidden_size == config.hidden_size and vision.out_hidden_size == config.out_hidden_size
    assert vision.ffn_hidden_size == config.intermediate_size
    if config.model_type == "qwen2_5_vl_vision":
        assert vision.gated_linear_unit and vision.window_size == config.window_size
        assert vision.full_attention_layers == tuple(config.fullatt_block_indexes)
        assert vision.num_mergers == 1
    else:
        assert not vision.gated_linear_unit and vision.window_size is None
        assert vision.num_mergers == 1 + len(config.deepstack_visual_indexes)


@pytest.mark.parametrize("family", list(DEFAULTS))
@pytest.mark.parametrize("size", ["default", "tiny"])
def test_from_hf_reads_each_field_of_the_config(family, size):
    config = DEFAULTS[family]() if size == "default" else TINY[family]()
    spec = ModelSpec.from_hf(config)
    assert config.model_type == family and spec.name == family
    if family in VISION_LANGUAGE_MODEL_TYPES:
        _check_text_fields(spec, config.text_config)
        _check_vision_fields(spec.vision, config.vision_config)
        assert VisionSpec.from_hf(config) == VisionSpec.from_hf(config.vision_config) == spec.vision
    else:
        _check_text_fields(spec, config)
        assert spec.vision is None
    assert ModelSpec.from_hf(config.text_config if spec.vision else config).vision is None


def test_the_real_size_encoders():
    """The published encoders' shapes, as transformers' defaults give them."""
    qwen2 = ModelSpec.from_hf(transformers.Qwen2VLConfig()).vision
    assert (qwen2.hidden_size, qwen2.ffn_hidden_size, qwen2.num_layers, qwen2.patch_size) == (1280, 5120, 32, 14)
    qwen25 = ModelSpec.from_hf(transformers.Qwen2_5_VLConfig()).vision
    assert qwen25.window_units == 4 and qwen25.attention_kinds == (4, 28)  # 112 px = 4 merged patches of 28 px
    qwen3 = ModelSpec.from_hf(transformers.Qwen3VLConfig()).vision
    assert qwen3.num_mergers == 4 and qwen3.patch_size == 16
    # A 448 x 448 image (32 x 32 patches): 16 windows of 8 x 8 patches, 1/16 of the full pairs.
    features = qwen25.grid_features([[1, 32, 32]])[0]
    assert features.tolist() == [1024, 1024**2, 16 * 64**2]


def _linear_weights(module, skip=None):
    torch = pytest.importorskip("torch")
    return sum(
        m.weight.numel()
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Linear) and not (skip and name.startswith(skip))
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", list(TINY))
def test_text_flops_are_what_the_hf_model_computes(family):
    """Per token, the language model's linears (2 FLOPs per weight, times 3 for training); the
    text families also end to end: forward and backward of one sequence counted by
    FlopCounterMode (eager attention computes the whole s x s product: causal=False)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    config = TINY[family]()
    spec = ModelSpec.from_hf(config)
    torch.manual_seed(0)
    auto = transformers.AutoModelForCausalLM if spec.vision is None else transformers.AutoModelForImageTextToText
    model = auto.from_config(config, attn_implementation="eager")
    if spec.vision is None:
        assert spec.linear_flops == 3 * 2 * _linear_weights(model)
        ids = torch.randint(0, 100, (1, 37))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids).logits.sum().backward()
        assert dataclasses.replace(spec, causal=False).sequence_flops([37]) == counter.get_total_flops()
    else:
        assert spec.linear_flops == 3 * 2 * _linear_weights(model, skip="model.visual")


def test_sliding_window_layers_are_read_as_the_hf_mask_has_them():
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    config = transformers.Qwen2Config(**{**TEXT, "num_hidden_layers": 4}, use_sliding_window=True, sliding_window=5)
    config.layer_types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    spec = ModelSpec.from_hf(config)
    assert spec.hybrid_layer_pattern == "*-W-W-*-" and spec.num_layers == 8 and spec.window_size == 4
    assert spec.attention_kinds == (2, 2) and spec.layer_counts == (4, 4, 0)
    window = sliding_window_overlay(5)
    for length in (1, 4, 5, 6, 23):
        pairs = sum(
            bool(causal_mask_function(0, 0, q, k) and window(0, 0, q, k)) for q in range(length) for k in range(length)
        )
        assert 2 * pairs - length == window_feature(length, spec.window_size)  # w(s, W) = 2 P(s, W) - s
    plain = transformers.Qwen2Config(**TEXT, use_sliding_window=False, max_window_layers=0)
    assert ModelSpec.from_hf(plain).window_size is None  # sliding_attention layer types, but no window


def test_a_model_is_read_for_its_config():
    config = TINY["qwen2_vl"]()

    class Model:  # what from_hf reads of a PreTrainedModel: .config
        pass

    model = Model()
    model.config = config
    assert ModelSpec.from_hf(model) == ModelSpec.from_hf(config)


@pytest.mark.parametrize(
    "config, words",
    [
        (lambda: transformers.MistralConfig(), "model_type='mistral' is not one seqpack reads"),
        (lambda: transformers.Qwen3MoeConfig(), "model_type='qwen3_moe' is not one seqpack reads"),
        (lambda: object(), "model_type=None is not one seqpack reads"),
    ],
)
def test_unknown_model_types_are_named(config, words):
    with pytest.raises(ConfigError, match=words):
        ModelSpec.from_hf(config())


def test_missing_attributes_are_named():
    vision = TINY["qwen2_5_vl"]().vision_config
    read = ["model_type", "hidden_size", "intermediate_size", "out_hidden_size", "window_size", "in_channels", *VISION]
    config = types.SimpleNamespace(**{name: getattr(vision, name) for name in read})  # no fullatt_block_indexes
    with pytest.raises(ConfigError, match="the qwen2_5_vl_vision config has no fullatt_block_indexes"):
        VisionSpec.from_hf(config)
    config = TINY["qwen2_vl"]()
    config.vision_config = None
    with pytest.raises(ConfigError, match="the qwen2_vl config has no vision_config"):
        ModelSpec.from_hf(config)
    with pytest.raises(ConfigError, match="model_type='llama' is not a vision encoder"):
        VisionSpec.from_hf(TINY["llama"]())
    assert set(TEXT_MODEL_TYPES) >= {"llama", "qwen2", "qwen3"}


def test_the_vision_field():
    vision = VisionSpec.from_hf(TINY["qwen2_5_vl"]())
    spec = ModelSpec(32, 2, 4, 48, vision=vision)
    assert spec.vision is vision and dataclasses.replace(spec, num_layers=3).vision is vision
    assert spec != ModelSpec(32, 2, 4, 48) and hash(spec) == hash(ModelSpec(32, 2, 4, 48, vision=vision))
    with pytest.raises(SeqpackTypeError, match="ModelSpec.vision must be a VisionSpec or None, got dict"):
        ModelSpec(32, 2, 4, 48, vision={"hidden_size": 16})
    assert model_fields_from_hf(TINY["llama"]())["vision"] is None


def test_sample_flops_add_the_encoder_to_the_language_model():
    spec = ModelSpec.from_hf(TINY["qwen2_5_vl"]())
    images, videos = np.array([[1, 4, 6], [1, 8, 8]]), np.array([[3, 4, 4]])
    placeholders = (24 + 64 + 48) // 4
    length = 10 + placeholders
    text = spec.sequence_flops([length])
    assert spec.sample_flops(length, images, videos) == text + spec.vision.flops(images, videos)
    assert spec.sample_flops(length) == text < spec.sample_flops(length, images)
    text_only = ModelSpec.from_hf(TINY["qwen2"]())
    assert text_only.sample_flops(12) == text_only.sequence_flops([12])
    with pytest.raises(ConfigError, match="has no vision encoder"):
        text_only.sample_flops(12, images)
