"""Tiny vision-language models and samples for the tests: random-init Qwen2-VL, Qwen2.5-VL and
Qwen3-VL built from configs of the installed transformers (no downloads), and samples shaped
as their processors give them (placeholders between vision-start and vision-end tokens, one
per merged patch; Qwen3-VL: a run per video frame, timestamp text between)."""

from __future__ import annotations

import torch

from seqpack.cost import CostModel, ModelSpec, VisionSpec
from seqpack.thd import MRopeSpec

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
VOCAB = 128
IMAGE, VIDEO, START, END = 120, 121, 122, 123  # placeholder and vision-start / -end token ids
PATCH_DIM = 3 * 2 * 2 * 2  # channels * temporal_patch * patch**2
IGNORE = -100
QWEN2_SPEC = MRopeSpec(model_type="qwen2_vl", image_token_id=IMAGE, video_token_id=VIDEO)

# The cost tests' model (tests/loader/test_sample_cost_wrapper.py,
# tests/distributed/test_vision_cost_dist.py, tests/vision_calibration_data.py): a language
# model 64 wide under an encoder 256 wide and 8 blocks deep, so that an image's encoder work
# outweighs its placeholder tokens'; COST is the plans' cost model.
COST_VISION = VisionSpec(
    hidden_size=256,
    num_layers=8,
    num_attention_heads=4,
    ffn_hidden_size=1024,
    patch_size=2,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=64,
)
COST_MODEL = ModelSpec(64, 2, 4, 128, vision=COST_VISION)
COST = CostModel(1.0, 0.01, 2.0)


def tiny_vlm(family: str):
    """A tiny random-init model of ``family`` (fp32, sdpa), seeded."""
    import transformers

    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
        bos_token_id=0,
        eos_token_id=1,
    )
    vision = dict(depth=2, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    tokens = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    if family == "qwen2_vl":
        config = transformers.Qwen2VLConfig(
            text_config=text, vision_config=dict(vision, embed_dim=16, hidden_size=32), **tokens
        )
        model = transformers.Qwen2VLForConditionalGeneration(config)
    elif family == "qwen2_5_vl":
        # window 8 px = 2 merged patches a side: several windows per image; block 1 attends fully.
        vision.update(
            hidden_size=16, intermediate_size=32, out_hidden_size=32, window_size=8, fullatt_block_indexes=[1]
        )
        config = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=dict(vision, tokens_per_second=2), **tokens
        )
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    else:
        text["head_dim"] = 8
        text["rope_parameters"] = dict(text["rope_parameters"], mrope_interleaved=True)
        vision.update(hidden_size=16, intermediate_size=32, out_hidden_size=32, num_position_embeddings=16)
        vision["deepstack_visual_indexes"] = [0]
        if family == "qwen3_vl":
            config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **tokens)
            model = transformers.Qwen3VLForConditionalGeneration(config)
        else:  # a mixture of 4 experts, 2 a token
            text.update(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
            config = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, **tokens)
            model = transformers.Qwen3VLMoeForConditionalGeneration(config)
    return model.float()


def _text(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(2, 100, (n,), generator=gen)


def _vision(token: int, n: int) -> torch.Tensor:
    return torch.cat([torch.tensor([START]), torch.full((n,), token), torch.tensor([END])])


def _labelled(sample: dict, prompt: int = 2) -> dict:
    """HF-style labels: ``input_ids`` with -100 on the prompt and on every placeholder."""
    labels = sample["input_ids"].clone()
    labels[:prompt] = IGNORE
    labels[(labels == IMAGE) | (labels == VIDEO)] = IGNORE
    return {**sample, "labels": labels}


def image_sample(gen: torch.Generator, grid, before: torch.Tensor, after: torch.Tensor | None = None) -> dict:
    """``before``, one image of ``grid`` (t, h, w) in patches, ``after``: its placeholders
    between vision-start and -end, its pixels drawn from ``gen``; no labels."""
    t, h, w = grid
    parts = [before, _vision(IMAGE, t * h * w // 4)] + ([] if after is None else [after])
    return {
        "input_ids": torch.cat(parts),
        "pixel_values": torch.randn(t * h * w, PATCH_DIM, generator=gen),
        "image_grid_thw": torch.tensor([list(grid)]),
    }


def two_image_sample(gen: torch.Generator, grids=((1, 4, 4), (1, 4, 6))) -> dict:
    """Text, image, text, image, text: grids (t, h, w) in patches."""
    parts = [_text(3, gen)]
    for t, h, w in grids:
        parts += [_vision(IMAGE, t * h * w // 4), _text(2, gen)]
    patches = sum(t * h * w for t, h, w in grids)
    sample = {
        "input_ids": torch.cat(parts),
        "pixel_values": torch.randn(patches, PATCH_DIM, generator=gen),
        "image_grid_thw": torch.tensor(grids),
    }
    return _labelled(sample)


def video_sample(gen: torch.Generator, frame_runs: bool, grid=(2, 4, 4)) -> dict:
    """A video of ``grid``: one placeholder run, or (Qwen3-VL) a run per frame after a timestamp."""
    t, h, w = grid
    if frame_runs:
        parts = [_text(2, gen)]
        for _ in range(t):
            parts += [_text(1, gen), _vision(VIDEO, h * w // 4)]
        parts.append(_text(3, gen))
    else:
        parts = [_text(2, gen), _vision(VIDEO, t * h * w // 4), _text(3, gen)]
    sample = {
        "input_ids": torch.cat(parts),
        "pixel_values_videos": torch.randn(t * h * w, PATCH_DIM, generator=gen),
        "video_grid_thw": torch.tensor([grid]),
    }
    return _labelled(sample)


def text_sample(gen: torch.Generator, n: int = 7) -> dict:
    return _labelled({"input_ids": _text(n, gen)}, prompt=1)


def mixed_samples(family: str, seed: int = 1) -> list[dict]:
    """The pack of the issue: a sample with two images, one with a video, a text-only one."""
    gen = torch.Generator().manual_seed(seed)
    video = video_sample(gen, frame_runs=family.startswith("qwen3"))
    if family == "qwen2_5_vl":
        video["second_per_grid_ts"] = torch.tensor([1.3])  # interval 2 * 1.3: truncated positions
    return [two_image_sample(gen), video, text_sample(gen)]


def alone_kwargs(sample: dict, model) -> dict:
    """The HF forward of one sample alone: the model computes its own positions."""
    ids = sample["input_ids"]
    types = (ids == model.config.image_token_id).long() + 2 * (ids == model.config.video_token_id).long()
    kwargs = {key: value for key, value in sample.items() if key not in ("input_ids", "labels")}
    return {"input_ids": ids[None], "mm_token_type_ids": types[None], "use_cache": False, **kwargs}
