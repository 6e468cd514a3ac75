"""Packed vision-language batches against real Hugging Face models (tiny, random-init Qwen2-VL,
Qwen2.5-VL and Qwen3-VL from configs of the installed transformers, fp32 on CPU): seqpack's
mRoPE positions equal the model's own ``get_rope_index`` on each sample alone, and a pack of a
two-image sample, a video sample and a text-only sample gives each token the loss it has alone
and the gradients (language model and vision tower) of the samples run alone, summed. The
controls show the comparison can fail: positions not restarted per sequence, or the text row
left out, change the losses."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from vlm_data import FAMILIES, alone_kwargs, mixed_samples, text_sample, tiny_vlm, two_image_sample, video_sample  # noqa: E402

from seqpack.interop.hf import HF_KEYS, HF_VISION_KEYS, to_hf  # noqa: E402
from seqpack.thd import pack_sequences  # noqa: E402
from seqpack.thd.mrope import MRopeSpec  # noqa: E402

TOL = 1e-5
BROKEN = 1e-4  # a gap the exactness test refuses (TOL relative of losses about 5), 200x the exact pack's


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny_vlm(request.param)


def _rope_index(model, sample: dict) -> torch.Tensor:
    kwargs = alone_kwargs(sample, model)
    extra = {"second_per_grid_ts": kwargs["second_per_grid_ts"]} if "second_per_grid_ts" in kwargs else {}
    positions, _ = model.model.get_rope_index(
        kwargs["input_ids"],
        kwargs["mm_token_type_ids"],
        kwargs.get("image_grid_thw"),
        kwargs.get("video_grid_thw"),
        **extra,
    )
    return positions[:, 0]  # [3, L]


def _position_cases(family: str) -> list[dict]:
    gen = torch.Generator().manual_seed(5)
    frames = family.startswith("qwen3")
    cases = [
        *mixed_samples(family),
        two_image_sample(gen, grids=((1, 2, 8), (1, 6, 2), (1, 4, 4))),  # wide, tall, square
        video_sample(gen, frames, grid=(3, 2, 6)),
        video_sample(gen, frames, grid=(1, 8, 4)),
    ]
    if family == "qwen2_5_vl":
        cases[-1]["second_per_grid_ts"] = torch.tensor([0.35])
        cases[-2]["second_per_grid_ts"] = [2.0]
    return cases


def test_positions_equal_the_models_get_rope_index_on_each_sample_alone(model):
    spec = MRopeSpec.from_hf(model.config)
    cases = _position_cases(spec.model_type)
    batch = pack_sequences(cases, mrope=spec, pad_multiple=8, label_format="unshifted")
    cu = batch.cu_seqlens_padded.tolist()
    for index, sample in enumerate(cases):
        expected = _rope_index(model, sample)
        length = sample["input_ids"].numel()
        got = batch.mrope_position_ids[:, cu[index] : cu[index] + length]
        assert torch.equal(got, expected), (spec.model_type, index)
    # Not vacuous: the rows differ (time from height, height from width) on uneven grids.
    rows = [_rope_index(model, sample) for sample in cases]
    assert any(not torch.equal(r[0], r[1]) for r in rows) and any(not torch.equal(r[1], r[2]) for r in rows)


def test_given_position_ids_are_used_as_given(model):
    spec = MRopeSpec.from_hf(model.config)
    assert MRopeSpec.from_hf(model) == spec
    samples = mixed_samples(spec.model_type)
    given = [{**sample, "position_ids": _rope_index(model, sample)} for sample in samples]
    computed = pack_sequences(samples, mrope=spec, pad_multiple=4, label_format="unshifted")
    assert torch.equal(
        pack_sequences(given, mrope=spec, pad_multiple=4, label_format="unshifted").mrope_position_ids,
        computed.mrope_position_ids,
    )
    shifted = [{**given[0], "position_ids": given[0]["position_ids"] + 7}, *given[1:]]
    batch = pack_sequences(shifted, mrope=spec, pad_multiple=4, label_format="unshifted")
    length = samples[0]["input_ids"].numel()
    assert torch.equal(batch.mrope_position_ids[:, :length], computed.mrope_position_ids[:, :length] + 7)


def _token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token losses of the supervised tokens, in order (``targets`` next-token, -100 = none)."""
    losses = F.cross_entropy(logits, targets, reduction="none", ignore_index=-100)
    return losses[targets != -100]


def _alone(model, samples: list[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Every sample run alone: its per-token losses, and the gradients of their sum."""
    model.zero_grad(set_to_none=True)
    losses = []
    for sample in samples:
        logits = model(**alone_kwargs(sample, model)).logits[0]
        token = _token_losses(logits[:-1], sample["labels"][1:])
        token.sum().backward()
        losses.append(token.detach())
    return torch.cat(losses), _grads(model)


def _packed(model, kwargs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """One packed forward and backward: per-token losses, gradients of their sum, HF's loss."""
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    token = _token_losses(out.logits[0], kwargs["shift_labels"][0])
    token.sum().backward()
    return token.detach(), _grads(model), out.loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pack(model, samples):
    spec = MRopeSpec.from_hf(model.config)
    return pack_sequences(samples, mrope=spec, label_format="unshifted", pad_multiple=4, pad_to=96)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_pack_gives_each_token_its_loss_and_the_summed_gradients_of_the_samples_alone(family, attention):
    model = tiny_vlm(family)
    model.set_attn_implementation(attention)  # the text model's and the vision tower's
    samples = mixed_samples(family)
    batch = _pack(model, samples)
    kwargs = to_hf(batch)
    assert set(kwargs) == set(HF_VISION_KEYS) and set(HF_KEYS) < set(HF_VISION_KEYS)
    assert kwargs["position_ids"].shape == (4, 1, batch.num_tokens)
    alone_losses, alone_grads = _alone(model, samples)
    losses, grads, hf_loss = _packed(model, kwargs)

    assert losses.shape == alone_losses.shape and losses.numel() == batch.num_loss_tokens
    torch.testing.assert_close(losses, alone_losses, rtol=TOL, atol=TOL * float(alone_losses.abs().max()))
    torch.testing.assert_close(hf_loss, alone_losses.mean(), rtol=TOL, atol=0.0)  # HF's own loss from to_hf's labels
    assert set(grads) == set(alone_grads)
    worst = max(_relative(grads[name], alone_grads[name]) for name in grads)
    assert worst <= TOL, worst
    # Not vacuous: the vision tower and the language model both learn, and the pack is mixed.
    vision = [name for name in grads if ".visual." in name]
    assert vision and all(float(alone_grads[name].norm()) > 0 for name in vision)
    assert any("language_model" in name and float(alone_grads[name].norm()) > 0 for name in grads)
    assert batch.image_grid_thw.shape[0] == 2 and batch.video_grid_thw.shape[0] == 1
    assert batch.num_sequences == 3 and bool(batch.padding_mask.any())


def test_the_comparison_fails_for_wrong_positions(model):
    samples = mixed_samples(model.config.model_type)
    batch = _pack(model, samples)
    alone_losses, _ = _alone(model, samples)

    def gap(text: torch.Tensor, mrope: torch.Tensor, with_text: bool = True) -> float:
        rows = torch.cat([text[None], mrope]) if with_text else mrope  # [4 or 3, T]
        losses, _, _ = _packed(model, {**to_hf(batch), "position_ids": rows[:, None]})
        return float((losses - alone_losses).abs().max())

    text, mrope = batch.position_ids, batch.mrope_position_ids
    starts = batch.cu_seqlens_padded[batch.seq_idx.long()].long()  # [T], each token's sequence start
    assert gap(text, mrope) <= TOL * 10
    # The text row counting on through the pack: one document, each attends to those before it.
    assert gap(text + starts, mrope) > BROKEN
    # The three mRoPE rows alone ([3, 1, T]): no packed mask either.
    assert gap(text, mrope, with_text=False) > BROKEN
    # Text positions on the mRoPE rows (a text packer's): images lose their grid positions.
    assert gap(text, text.expand(3, -1)) > BROKEN
    # Not a failure: mRoPE rows counting on through the pack move each sequence by one offset,
    # which rotary attention (relative positions, within a sequence) does not see.
    assert gap(text, mrope + starts) <= TOL * 10


def test_a_text_only_pack_needs_the_text_row_on_qwen2_vl():
    model = tiny_vlm("qwen2_vl")
    gen = torch.Generator().manual_seed(3)
    samples = [text_sample(gen, n) for n in (6, 9, 4)]
    alone_losses, _ = _alone(model, samples)
    spec = MRopeSpec.from_hf(model.config)
    with_rows = to_hf(pack_sequences(samples, mrope=spec, label_format="unshifted"))
    plain = to_hf(pack_sequences(samples, label_format="unshifted"))
    assert set(plain) == set(HF_KEYS) and with_rows["position_ids"].shape[0] == 4
    losses, _, _ = _packed(model, with_rows)
    torch.testing.assert_close(losses, alone_losses, rtol=TOL, atol=TOL)
    # [1, T] positions: Qwen2-VL expands them to the three mRoPE rows and builds no packed mask.
    losses, _, _ = _packed(model, plain)
    assert float((losses - alone_losses).abs().max()) > BROKEN


def _flash_standin(module, query, key, value, attention_mask, *, scaling=None, is_causal=None, **kwargs):
    """Flash attention's varlen semantics on CPU: the sequences of ``cu_seq_lens_q`` where given,
    else those of ``position_ids`` (a position not the previous one plus 1 starts one, as
    transformers' flash path finds them), else one; causal unless the module says otherwise."""
    total = query.shape[2]  # [1, heads, T, head_dim]
    cu, positions = kwargs.get("cu_seq_lens_q"), kwargs.get("position_ids")
    if cu is None and positions is not None:
        positions = positions.reshape(-1)
        starts = torch.nonzero(positions[1:] != positions[:-1] + 1).flatten() + 1
        cu = torch.cat([torch.tensor([0]), starts, torch.tensor([total])])
    bounds = [0, total] if cu is None else cu.tolist()
    _FLASH_CALLS.append((type(module).__name__, bounds))
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=causal, scale=scaling, enable_gqa=True
        )
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(parts, dim=2).transpose(1, 2), None  # [1, T, heads, head_dim]


_FLASH_CALLS: list[tuple[str, list[int]]] = []


@pytest.mark.parametrize("family", FAMILIES)
def test_flash_style_attention_is_exact_and_the_vision_tower_keeps_its_own_offsets(family):
    # A name with "flash" in it sends transformers down its flash paths (no mask built; the
    # vision tower's varlen call); set on every sub-config, as set_attn_implementation would
    # after importing flash-attn, which this machine has not.
    transformers.AttentionInterface.register("seqpack_flash_standin", _flash_standin)
    model = tiny_vlm(family)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None:
            config._attn_implementation_internal = "seqpack_flash_standin"
    samples = mixed_samples(family)
    batch = _pack(model, samples)
    alone_losses, alone_grads = _alone(model, samples)
    _FLASH_CALLS.clear()
    losses, grads, _ = _packed(model, to_hf(batch))
    torch.testing.assert_close(losses, alone_losses, rtol=TOL, atol=TOL * float(alone_losses.abs().max()))
    assert max(_relative(grads[name], alone_grads[name]) for name in grads) <= TOL
    text = batch.cu_seqlens_padded.tolist()
    patches = int(batch.image_grid_thw.prod(1).sum())  # the images' encoder call
    vision = [bounds for name, bounds in _FLASH_CALLS if "Vision" in name]
    assert vision and all(bounds[-1] in (patches, int(batch.video_grid_thw.prod(1).sum())) for bounds in vision)
    assert all(bounds == text for name, bounds in _FLASH_CALLS if "Vision" not in name)
    assert len(_FLASH_CALLS) > len(vision)  # the text model's calls too


def test_the_docs_example_runs():
    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "multimodal.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert blocks
    namespace: dict = {}
    for index, code in enumerate(blocks):
        exec(compile(code, f"{doc.name}[block {index}]", "exec"), namespace)
    assert namespace["out"].logits.shape[1] == namespace["batch"].num_tokens


def test_to_device_moves_the_vision_fields(model):
    batch = _pack(model, mixed_samples(model.config.model_type)).to("cpu")
    assert batch.pixel_values is not None and batch.pixel_values.device.type == "cpu"
    assert to_hf(batch)["pixel_values"] is batch.pixel_values
