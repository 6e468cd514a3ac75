"""The vision-language sample contract (seqpack.thd.vision) and its packing, without a model:
every refusal names the sample and the values; pixels and grids are concatenated in sequence
order; each sequence's mRoPE positions are its own, by the rule worked out by hand here
(tests/interop/test_hf_vision.py checks the rule against the installed transformers)."""

from __future__ import annotations

import types

import pytest
import torch

from seqpack.errors import ConfigError, SampleError
from seqpack.thd import StaticShapes, normalize_sample, pack_sequences, sample_sequences, shard_for_cp
from seqpack.thd.mrope import MRopeSpec

IMG, VID, START, END = 120, 121, 122, 123
D = 24
QWEN2 = MRopeSpec("qwen2_vl", image_token_id=IMG, video_token_id=VID, spatial_merge_size=2)
QWEN3 = MRopeSpec("qwen3_vl", image_token_id=IMG, video_token_id=VID, spatial_merge_size=2)
QWEN25 = MRopeSpec("qwen2_5_vl", image_token_id=IMG, video_token_id=VID, spatial_merge_size=2, tokens_per_second=2)


def _ids(*parts) -> torch.Tensor:
    """Text ids (ints, lists) and placeholder runs (``("img", n)``) as one ``input_ids``."""
    out = []
    for part in parts:
        if isinstance(part, tuple):
            token = {"img": IMG, "vid": VID}[part[0]]
            out += [START] + [token] * part[1] + [END]
        else:
            out += list(part) if isinstance(part, list) else [part]
    return torch.tensor(out)


def _image(grids=((1, 4, 4),), text=(5, 6)) -> dict:
    parts = [list(text)]
    for t, h, w in grids:
        parts += [("img", t * h * w // 4), [7]]
    patches = sum(t * h * w for t, h, w in grids)
    return {
        "input_ids": _ids(*parts),
        "pixel_values": torch.randn(patches, D),
        "image_grid_thw": torch.tensor(grids),
    }


def test_positions_follow_the_grid_and_restart_per_sequence():
    # [5, 6, START, 4 placeholders of a (1, 4, 4) grid, END, 7]: text 0..2, the image at 3
    # (t 3; h 3 3 4 4; w 3 4 3 4), then 3 + max(4, 4) / 2 = 5 onward.
    sample = _image()
    batch = pack_sequences([sample, {"input_ids": torch.arange(2, 6)}, sample], mrope=QWEN2, pad_multiple=4)
    first = torch.tensor([[0, 1, 2, 3, 3, 3, 3, 5, 6], [0, 1, 2, 3, 3, 4, 4, 5, 6], [0, 1, 2, 3, 4, 3, 4, 5, 6]])
    cu = batch.cu_seqlens_padded.tolist()
    assert cu == [0, 12, 16, 28]
    assert torch.equal(batch.mrope_position_ids[:, 0:9], first)
    assert torch.equal(batch.mrope_position_ids[:, 16:25], first)  # restarts with its sequence
    assert torch.equal(batch.mrope_position_ids[:, 12:16], torch.arange(4).expand(3, -1))  # text-only: arange
    # Pads count on from the sequence's largest position + 1, on every row; they are text.
    assert torch.equal(batch.mrope_position_ids[:, 9:12], torch.tensor([7, 8, 9]).expand(3, -1))
    assert batch.mm_token_type_ids.tolist()[:12] == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert torch.equal(batch.position_ids[:12], torch.arange(12))  # the text row as for any pack
    # Pixels and grids of both images, in sequence order.
    assert torch.equal(batch.pixel_values, torch.cat([sample["pixel_values"]] * 2))
    assert batch.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 4]]
    assert batch.pixel_values_videos is None and batch.video_grid_thw is None and batch.has_vision


def test_a_wide_image_moves_on_by_its_larger_side_and_videos_space_time():
    sample = _image(grids=((1, 2, 6),))  # 3 placeholders: h 3; w 3 4 5; then 3 + 6 / 2 = 6
    rows = pack_sequences([sample], mrope=QWEN2).mrope_position_ids
    assert rows[:, 3:7].tolist() == [[3, 3, 3, 6], [3, 3, 3, 6], [3, 4, 5, 6]]
    video = {
        "input_ids": _ids([5], ("vid", 4)),  # a (2, 2, 4) grid: 2 frames of 2 placeholders
        "pixel_values_videos": torch.randn(16, D),
        "video_grid_thw": torch.tensor([[2, 2, 4]]),
        "second_per_grid_ts": [1.3],
    }
    time = pack_sequences([video], mrope=QWEN2).mrope_position_ids[0, 2:6].tolist()
    assert time == [2, 2, 3, 3]  # Qwen2-VL: one step a frame
    time = pack_sequences([video], mrope=QWEN25).mrope_position_ids[0, 2:6].tolist()
    assert time == [2, 2, 4, 4]  # Qwen2.5-VL: int(1 * 2 * 1.3) = 2 a frame
    frames = {**video, "input_ids": _ids([5], ("vid", 2), [9], ("vid", 2))}  # Qwen3-VL: a run a frame
    assert pack_sequences([frames], mrope=QWEN3).mrope_position_ids[0, 2:4].tolist() == [2, 2]
    with pytest.raises(
        SampleError, match=r"has 1 video placeholder runs \(of \[4\] tokens\) but video_grid_thw gives 2 frames"
    ):
        pack_sequences([video], mrope=QWEN3)


def test_text_only_packs():
    samples = [
        {"input_ids": torch.arange(1, 6)},
        {"input_ids": torch.arange(1, 4), "position_ids": torch.arange(3) + 4},
    ]
    plain = pack_sequences(samples)
    assert not plain.has_vision and plain.mm_token_type_ids is None and plain.pixel_values is None
    rows = pack_sequences(samples, mrope=QWEN2)
    assert torch.equal(rows.mrope_position_ids, rows.position_ids.expand(3, -1))  # the given text row too
    assert rows.pixel_values is None and not bool(rows.mm_token_type_ids.any())
    assert torch.equal(rows.input_ids, plain.input_ids) and torch.equal(rows.position_ids, plain.position_ids)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s.pop("image_grid_thw"), r"sample 1 has pixel_values but no image_grid_thw"),
        (lambda s: s.pop("pixel_values"), r"sample 1 has image_grid_thw but no pixel_values: a grid row without"),
        (
            lambda s: s.update(pixel_values=torch.randn(15, D)),
            r"sample 1: pixel_values has 15 patches but image_grid_thw \[\[1, 4, 4\]\] gives sum\(t\*h\*w\) = 16",
        ),
        (
            lambda s: s.update(input_ids=_ids([5, 6], ("img", 5), [7])),
            r"sample 1: image 0 has 5 placeholder tokens but its grid \(1, 4, 4\) needs t\*h\*w / "
            r"spatial_merge_size\*\*2 = 4",
        ),
        (
            lambda s: s.update(input_ids=_ids([5], ("img", 4), [6], ("img", 4))),
            r"sample 1 has 2 image placeholder runs \(of \[4, 4\] tokens\) but image_grid_thw gives 1 images",
        ),
        (
            lambda s: s.update(image_grid_thw=torch.tensor([[1, 3, 4]]), pixel_values=torch.randn(12, D)),
            r"image_grid_thw \[\[1, 3, 4\]\] has an h or w that is not a multiple of spatial_merge_size=2",
        ),
        (lambda s: s.update(image_grid_thw=torch.tensor([[1, 0, 4]])), r"image_grid_thw has a side <= 0"),
        (lambda s: s.update(image_grid_thw=torch.tensor([1, 4, 4])), r"'image_grid_thw' must be integer \[n, 3\]"),
        (lambda s: s.update(pixel_values=torch.ones(16, D, dtype=torch.int64)), r"'pixel_values' must be floating"),
        (
            lambda s: s.update(mm_token_type_ids=torch.zeros(9, dtype=torch.int64)),
            r"sample 1: mm_token_type_ids\[3\]=0 but the token there is an image placeholder \(1\)",
        ),
        (
            lambda s: s.update(position_ids=torch.zeros(3, 8, dtype=torch.int64)),
            r"sample 1: multi-row 'position_ids' must be integer \[3, 9\]",
        ),
    ],
)
def test_a_sample_that_breaks_the_contract_is_refused_by_name(change, match):
    sample = _image()
    change(sample)
    with pytest.raises(SampleError, match=match):
        pack_sequences([{"input_ids": torch.arange(1, 4)}, sample], mrope=QWEN2)


def test_placeholders_need_grids_and_packs_one_patch_format():
    stray = {"input_ids": _ids([5], ("img", 4))}
    with pytest.raises(SampleError, match=r"sample 0 has 4 image placeholder tokens but no image_grid_thw"):
        pack_sequences([stray], mrope=QWEN2)
    other = {**_image(), "pixel_values": torch.randn(16, D + 1)}
    with pytest.raises(SampleError, match=r"sample 1: pixel_values is torch.float32 \[.., 25\] but sample 0's"):
        pack_sequences([_image(), other], mrope=QWEN2)
    seconds = {**_image(), "input_ids": _ids([5], ("vid", 4)), "video_grid_thw": torch.tensor([[1, 4, 4]])}
    seconds.update(pixel_values_videos=seconds.pop("pixel_values"), second_per_grid_ts=[1.0, 2.0])
    del seconds["image_grid_thw"]
    with pytest.raises(SampleError, match=r"second_per_grid_ts has 2 entries for 1 videos"):
        pack_sequences([seconds], mrope=QWEN25)


def test_vision_samples_need_a_model_family():
    with pytest.raises(ConfigError, match=r"sample 0 is a vision-language sample \(image_grid_thw, pixel_values\) but"):
        pack_sequences([_image()])
    with pytest.raises(ConfigError, match=r"position_ids\) but pack_sequences got no mrope="):
        pack_sequences([{"input_ids": torch.arange(4), "position_ids": torch.zeros(3, 4, dtype=torch.int64)}])
    with pytest.raises(SampleError, match=r"model_type='llava': seqpack does not know this model's multimodal"):
        MRopeSpec.from_hf(types.SimpleNamespace(model_type="llava", image_token_id=3, video_token_id=4))
    with pytest.raises(SampleError, match=r"model_type='gemma3'"):
        MRopeSpec("gemma3", image_token_id=1, video_token_id=2)
    vision = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=4)
    config = types.SimpleNamespace(model_type="qwen2_5_vl", image_token_id=7, video_token_id=8, vision_config=vision)
    assert MRopeSpec.from_hf(config) == MRopeSpec("qwen2_5_vl", 7, 8, 2, 4.0)
    with pytest.raises(ConfigError, match="has no vision_config"):
        MRopeSpec.from_hf(types.SimpleNamespace(model_type="qwen2_vl", image_token_id=7, video_token_id=8))
    with pytest.raises(ConfigError, match="both 7"):
        MRopeSpec("qwen2_vl", image_token_id=7, video_token_id=7)


def test_the_batch_checks_its_vision_fields_and_refuses_cp():
    batch = pack_sequences([_image(), {"input_ids": torch.arange(1, 6)}], mrope=QWEN2, pad_multiple=4)
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    with pytest.raises(ConfigError, match=r"PackedBatch.pixel_values and image_grid_thw go together; image_grid_thw"):
        type(batch)(**{**fields, "image_grid_thw": None})
    with pytest.raises(ConfigError, match=r"mrope_position_ids has shape \(3, 11\)"):
        type(batch)(**{**fields, "mrope_position_ids": batch.mrope_position_ids[:, :11]})
    with pytest.raises(ConfigError, match="vision fields need both mrope_position_ids"):
        type(batch)(**{**fields, "mrope_position_ids": None})
    with pytest.raises(ConfigError, match=r"a vision-language pack cannot be CP-sharded yet \(cp_size=2\)"):
        shard_for_cp(batch, 2, 0)
    moved = batch.to("cpu")
    assert torch.equal(moved.pixel_values, batch.pixel_values) and moved.has_vision


def test_fixed_shapes_keep_each_sequence_and_count_the_tail_from_zero():
    samples = [_image(), {"input_ids": torch.arange(1, 6)}]
    plain = pack_sequences(samples, mrope=QWEN2)
    fixed = pack_sequences(samples, mrope=QWEN2, static_shapes=StaticShapes(token_buckets=(32,), max_sequences=4))
    assert fixed.num_tokens == 32
    assert torch.equal(fixed.mrope_position_ids[:, :14], plain.mrope_position_ids)
    assert torch.equal(fixed.mrope_position_ids[:, 14:], torch.arange(18).expand(3, -1))  # the tail slot


def test_paths_that_cannot_carry_images_refuse_them_rather_than_drop_them():
    # normalize_sample serves the wrapper (sample_sequences) and pack_dataset: dropping the
    # pixels would train on the placeholders alone.
    with pytest.raises(
        SampleError, match=r"sample 3 carries images or videos \(image_grid_thw, pixel_values\), which only"
    ):
        normalize_sample(_image(), where="sample 3")
    with pytest.raises(SampleError, match="carries images or videos"):
        sample_sequences({**_image(), "cu_seqlens": torch.tensor([0, 9])}, where="row 2")
    rows = {"input_ids": torch.arange(4), "position_ids": torch.zeros(3, 4, dtype=torch.int64)}
    with pytest.raises(SampleError, match=r"must be 1-D, got shape \(3, 4\) \(mRoPE's t, h, w rows: pack_sequences"):
        normalize_sample(rows)
