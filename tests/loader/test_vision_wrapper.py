"""Vision-language samples through wrap_data_iterator on one rank (PackingConfig(mrope=)): the
microbatches equal pack_sequences(mrope=) of their samples; what is refused, by name; the
payload's bytes (what the length gather announces and the exchange moves) and the bytes per
token locality prices. dp=2 gloo, exactness on the models: tests/distributed/test_vision_dist.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from vlm_data import IMAGE, VIDEO, mixed_samples, two_image_sample

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError, StepFailed
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.loader.gather_fields import KEY_BITS, SAMPLE_COLUMNS, step_bytes_per_token
from seqpack.loader.vision_payload import (
    PAYLOAD_KEYS,
    check_topology,
    decode,
    encode,
    payload_bytes,
    read_sequences,
    split_payload,
)
from seqpack.options import DataOwner, LabelFormat
from seqpack.thd import MRopeSpec, pack_sequences
from seqpack.topology import Topology

FAMILIES = {"qwen2_vl": False, "qwen2_5_vl": False, "qwen3_vl": True}
VISION_FIELDS = (
    "input_ids",
    "labels",
    "loss_mask",
    "position_ids",
    "mrope_position_ids",
    "mm_token_type_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
)


def _spec(family: str = "qwen2_vl") -> MRopeSpec:
    return MRopeSpec(model_type=family, image_token_id=IMAGE, video_token_id=VIDEO, tokens_per_second=2)


def _wrap(samples, spec, **kwargs):
    kwargs.setdefault("samples_per_rank", 3)
    kwargs.setdefault("max_tokens_per_rank", 64)
    kwargs.setdefault("pad_multiple", 4)
    kwargs.setdefault("scheduler", "balanced")
    return wrap_data_iterator(samples, Topology.single(), label_format="unshifted", mrope=spec, **kwargs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_microbatch_is_pack_sequences_of_its_samples(family):
    samples = mixed_samples(family, seed=4) + mixed_samples(family, seed=5)
    spec = _spec(family)
    seen = []
    for step in _wrap(samples, spec):
        for batch in step.microbatches:
            ids = [int(g) for g in batch.sample_ids.tolist() if g >= 0]
            seen += [step.step * 3 + g for g in ids]
            want = pack_sequences(
                [samples[step.step * 3 + g] for g in ids], mrope=spec, label_format="unshifted", pad_multiple=4
            )
            for key in VISION_FIELDS:
                got, expected = getattr(batch, key), getattr(want, key)
                assert (got is None) == (expected is None), key
                if got is not None:
                    assert torch.equal(got, expected), key
    assert sorted(seen) == list(range(6))


def test_a_text_only_step_carries_mrope_rows_and_no_pixels():
    samples = [{"input_ids": torch.arange(2, 9 + i)} for i in range(3)]
    (step,) = list(_wrap(samples, _spec()))
    for batch in step.microbatches:
        assert batch.pixel_values is None and batch.image_grid_thw is None
        assert torch.equal(batch.mrope_position_ids, batch.position_ids.expand(3, -1))


def test_payload_round_trip_and_size():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        sample = mixed_samples("qwen2_5_vl")[1]
        sample["pixel_values_videos"] = sample["pixel_values_videos"].to(dtype)
        image = two_image_sample(gen)
        for item in (sample, image):
            (sequence,) = read_sequences(item, _spec("qwen2_5_vl"), where="s", label_format=LabelFormat.UNSHIFTED)
            tokens, payload = split_payload(sequence)
            assert set(tokens) <= {"input_ids", "labels", "loss_mask", "position_ids"}
            data = encode(payload)
            assert data.dtype == torch.uint8 and data.numel() == payload_bytes(sequence)
            back = decode(data)
            assert set(back) == set(payload)
            for key, value in payload.items():
                assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_a_text_only_sample_has_no_payload():
    (sequence,) = read_sequences({"input_ids": torch.arange(5)}, _spec(), where="s", label_format=LabelFormat.SHIFTED)
    assert PAYLOAD_KEYS[0] not in sequence and payload_bytes(sequence) == 0
    stray = {"input_ids": torch.tensor([5, VIDEO, VIDEO, VIDEO, 6])}  # text only, but video placeholders
    with pytest.raises(SampleError, match=r"s has 3 video placeholder tokens but no video_grid_thw"):
        read_sequences(stray, _spec(), where="s", label_format=LabelFormat.SHIFTED)


def test_bytes_per_token_adds_the_pixels():
    lengths = np.array([100, 100])
    mask = KEY_BITS["input_ids"] | KEY_BITS["labels"] | KEY_BITS["loss_mask"]
    zeros = {name: np.zeros(2, np.int64) for name, _ in SAMPLE_COLUMNS.fields}
    assert step_bytes_per_token(mask, lengths, SAMPLE_COLUMNS.rows(2, **zeros)) == 20
    columns = SAMPLE_COLUMNS.rows(2, **{**zeros, "vision_bytes": np.array([4000, 0])})
    assert step_bytes_per_token(mask, lengths, columns) == 20 + 4000 / 200


def _failure(samples, spec, **kwargs) -> str:
    with pytest.raises(StepFailed) as info:
        list(_wrap(samples, spec, **kwargs))
    return str(info.value)


def test_bad_vision_samples_fail_the_step_naming_them():
    gen = torch.Generator().manual_seed(0)
    bad = two_image_sample(gen)
    bad["image_grid_thw"] = torch.tensor([[1, 4, 4], [1, 4, 4]])
    message = _failure([two_image_sample(gen), bad, two_image_sample(gen)], _spec())
    assert "sample 1 of this rank's data" in message and "patches" in message
    placeholders = {"input_ids": torch.tensor([5, 122, IMAGE, IMAGE, 123, 6])}  # no grid
    assert "no image_grid_thw" in _failure([placeholders] * 3, _spec())


def test_without_mrope_images_are_refused():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(StepFailed, match="carries images or videos"):
        list(wrap_data_iterator([two_image_sample(gen)] * 2, Topology.single(), samples_per_rank=2,
                                max_tokens_per_rank=64, label_format="unshifted"))  # fmt: skip


def test_oversize_samples_with_images_are_dropped_counted_or_named_and_never_truncated():
    gen = torch.Generator().manual_seed(0)
    samples = [two_image_sample(gen) for _ in range(3)]
    message = _failure(samples, _spec(), max_tokens_per_rank=16, on_oversize="truncate")
    assert "images or videos" in message and "'drop'" in message
    steps = list(_wrap(samples, _spec(), max_tokens_per_rank=16, on_oversize="drop"))
    assert all(not step.microbatches or step.num_loss_tokens == 0 for step in steps)
    # Dropped, and counted: the three samples of 21 tokens each.
    assert sum(step.stats.dropped_sequences for step in steps) == 3
    assert sum(step.stats.dropped_tokens for step in steps) == 63
    # "error" (the default) names the first sample too long.
    message = _failure(samples, _spec(), max_tokens_per_rank=16)
    assert "sample 0 has 21 tokens, more than one microbatch holds" in message


def test_a_pre_packed_sample_with_images_is_refused():
    gen = torch.Generator().manual_seed(0)
    sample = two_image_sample(gen)
    n = sample["input_ids"].shape[0]
    sample["cu_seqlens"] = torch.tensor([0, n])
    assert "pre-packed" in _failure([sample] * 3, _spec())


def test_config_refusals():
    with pytest.raises(SeqpackTypeError, match="mrope must be an MRopeSpec"):
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, mrope={"model_type": "qwen2_vl"})
    with pytest.raises(ConfigError, match="dynamic_cp"):
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, mrope=_spec(), dynamic_cp=True)
    text, vision = (
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8),
        PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, mrope=_spec()),
    )
    assert text.summary()["mrope"] == "None" and "qwen2_vl" in vision.summary()["mrope"]
    assert text.fingerprint() != vision.fingerprint()


@pytest.mark.parametrize(
    ("sizes", "owner", "words"),
    [
        (dict(cp_size=2), DataOwner.ALL, "CP-sharded"),
        (dict(pp_size=2), DataOwner.ALL, "pipeline"),
        (dict(tp_size=2), DataOwner.TP0, "data_owner='all'"),
    ],
)
def test_topologies_that_cannot_carry_pixels_are_refused(sizes, owner, words):
    with pytest.raises(ConfigError, match=words):
        check_topology(_Sizes(**sizes), _spec(), owner)
    check_topology(_Sizes(**sizes), None, owner)  # text: anything goes
    check_topology(_Sizes(dp_size=2, tp_size=2), _spec(), DataOwner.ALL)


@pytest.mark.parametrize(
    ("sizes", "owner", "words"),
    [
        (dict(cp_size=2), DataOwner.ALL, r"a vision-language pack cannot be CP-sharded yet"),
        (dict(pp_size=2), DataOwner.ALL, r"pipeline stages do not get the vision fields yet; use pp_size=1"),
        (dict(tp_size=2), DataOwner.TP0, r"under data_owner='tp0' the TP broadcast does not carry pixels"),
    ],
)
def test_the_config_refuses_those_topologies_where_it_is_resolved(sizes, owner, words):
    axes = [axis for axis in ("cp", "pp", "tp") if f"{axis}_size" in sizes]
    topology = Topology(**sizes, world_size=2, groups={axis: object() for axis in axes})
    config = PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, mrope=_spec(), data_owner=owner)
    with pytest.raises(ConfigError, match=rf"mrope \(qwen2_vl\) on .*: {words}"):
        config.resolve(topology)
    config.replace(mrope=None).resolve(topology)  # text: anything goes


class _Sizes:
    """A topology's sizes alone (check_topology reads nothing else)."""

    def __init__(self, dp_size=1, cp_size=1, tp_size=1, pp_size=1):
        self.dp_size, self.cp_size, self.tp_size, self.pp_size = dp_size, cp_size, tp_size, pp_size

    def describe(self) -> str:
        return f"dp={self.dp_size} cp={self.cp_size} tp={self.tp_size} pp={self.pp_size}"


def _fields(steps) -> list[dict]:
    return [
        {key: getattr(batch, key) for key in VISION_FIELDS} | {"ids": batch.sample_ids}
        for step in steps
        for batch in step.microbatches
    ]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key, value in x.items():
            assert (value is None) == (y[key] is None), key
            if value is not None:
                assert torch.equal(value, y[key]), key


def test_resume_carries_deferred_samples_with_their_pixels():
    from wrapper_data import ScatterScheduler

    samples = [s for seed in range(4) for s in mixed_samples("qwen2_vl", seed=seed)]

    def fresh():
        return _wrap(samples, _spec(), scheduler=ScatterScheduler(defer_longest=True))

    reference = list(fresh())
    first = fresh()
    head = [next(first)]
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # plain data and tensors, pixels included
    assert any("pixel_values" in s for s in state["deferred_samples"])  # not vacuous: pixels travel
    resumed = fresh()
    resumed.load_state_dict(state)
    _same(_fields(head + list(resumed)), _fields(reference))


def test_static_shapes_packs_carry_the_vision_fields():
    from seqpack.thd import StaticShapes

    samples = mixed_samples("qwen2_vl", seed=2)
    shapes = StaticShapes(token_buckets=(32, 64), max_sequences=4)
    (step,) = list(_wrap(samples, _spec(), static_shapes=shapes))
    for batch in step.microbatches:
        ids = [int(g) for g in batch.sample_ids.tolist() if g >= 0]
        want = pack_sequences(
            [samples[g] for g in ids], mrope=_spec(), label_format="unshifted", pad_multiple=4, static_shapes=shapes
        )
        for key in VISION_FIELDS:
            got, expected = getattr(batch, key), getattr(want, key)
            assert (got is None) == (expected is None), key
            if got is not None:
                assert torch.equal(got, expected), key
