"""seqpack.interop.hf.to_hf against real Hugging Face models (tiny, random-init from configs, no
downloads): packed logits and losses equal the unpacked ones, the keys equal
DataCollatorWithFlattening's, and the natural wrong ways are refused or fixed."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from seqpack.errors import ConfigError, SampleError  # noqa: E402
from seqpack.interop.hf import HF_KEYS, to_hf  # noqa: E402
from seqpack.thd import IGNORE_INDEX, pack_sequences, padding_only_batch, shard_for_cp  # noqa: E402

VOCAB = 97
LENGTHS = [5, 17, 1, 40, 9, 23]
TOL = 1e-5


def _tiny(kind: str):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common)).eval()


@pytest.fixture(scope="module")
def models():
    return {kind: _tiny(kind) for kind in ("llama", "qwen3")}


def _samples(hf_labels: bool = False, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in LENGTHS:
        sample = {"input_ids": torch.randint(0, VOCAB, (n,), generator=g)}
        if hf_labels:  # HF's convention: input_ids copied, -100 on a prompt
            labels = sample["input_ids"].clone()
            labels[: n // 3] = IGNORE_INDEX
            sample["labels"] = labels
        out.append(sample)
    return out


def _pack(samples, **kwargs):
    # Pads inside the pack (every sequence to a multiple of 8) and a tail pad.
    return pack_sequences(samples, pad_multiple=8, pad_to=136, **kwargs)


@torch.no_grad()
def _unpacked(model, samples):
    """Logits of each sequence run alone, and the token-mean loss over all of them."""
    logits, loss_sum, count = [], 0.0, 0
    for s in samples:
        out = model(input_ids=s["input_ids"][None], labels=s.get("labels", s["input_ids"])[None], use_cache=False)
        logits.append(out.logits[0])
        labels = s.get("labels", s["input_ids"])
        n = int((labels[1:] != IGNORE_INDEX).sum())  # HF's loss: token t predicts label t + 1
        if n:
            loss_sum += out.loss.item() * n
            count += n
    return torch.cat(logits), loss_sum / count, count


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.slow
def test_packed_logits_and_loss_equal_unpacked(models, kind, impl):
    model = models[kind]
    model.set_attn_implementation(impl)
    samples = _samples()
    batch = _pack(samples)
    assert batch.padding_mask.sum() > 0 and batch.num_sequences == len(LENGTHS)  # really padded, really packed
    with torch.no_grad():
        out = model(**to_hf(batch))
    ref_logits, ref_loss, count = _unpacked(model, samples)
    assert batch.num_loss_tokens == count
    assert (out.logits[0][~batch.padding_mask] - ref_logits).abs().max().item() < TOL
    assert abs(out.loss.item() - ref_loss) < TOL
    # num_items_in_batch: the loss is then the sum over the batch's tokens divided by it.
    with torch.no_grad():
        summed = model(**to_hf(batch, num_items_in_batch=2 * count)).loss.item()
    assert abs(summed * 2 - ref_loss) < TOL


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.slow
def test_hf_style_labels_through_unshifted_give_the_same_loss(models, kind):
    model = models[kind]
    model.set_attn_implementation("sdpa")
    samples = _samples(hf_labels=True)
    batch = _pack(samples, label_format="unshifted")
    with torch.no_grad():
        loss = model(**to_hf(batch)).loss.item()
    _, ref_loss, count = _unpacked(model, samples)
    assert batch.num_loss_tokens == count
    assert abs(loss - ref_loss) < TOL


@pytest.mark.skipif(
    os.environ.get("SEQPACK_TEST_FLEX") != "1",
    reason="flex_attention compiles with inductor on CPU (~90 s cold); set SEQPACK_TEST_FLEX=1",
)
def test_packed_logits_equal_unpacked_on_flex_attention(models):
    samples = _samples()
    batch = _pack(samples)
    model = models["llama"]
    model.set_attn_implementation("eager")
    ref_logits, ref_loss, _ = _unpacked(model, samples)  # the reference runs on eager
    model.set_attn_implementation("flex_attention")
    try:
        with torch.no_grad():
            out = model(**to_hf(batch))
    finally:
        model.set_attn_implementation("sdpa")
    assert (out.logits[0][~batch.padding_mask] - ref_logits).abs().max().item() < TOL
    assert abs(out.loss.item() - ref_loss) < TOL


def test_keys_equal_data_collator_with_flattening():
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    for hf_labels in (False, True):
        samples = _samples(hf_labels=hf_labels)
        theirs = collator([{k: v.tolist() for k, v in s.items()} for s in samples])
        ours = to_hf(pack_sequences(samples, label_format="unshifted"))
        common = set(theirs) & set(ours)
        assert common == set(theirs) - {"attention_mask"}  # every key they define, we define
        assert {"cu_seq_lens_q", "max_length_k", "seq_idx", "labels"} <= common
        for key in common:
            a, b = theirs[key], ours[key]
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b), key
            else:
                assert type(a) is type(b) and a == b, key


def test_flash_attention_kwargs_match_what_hf_derives_from_position_ids():
    """flash_attention_2 reads cu_seq_lens when given, else derives them from position_ids:
    both must cut the pack the same way, pads included (checked without a GPU)."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    batch = _pack(_samples())
    kwargs = to_hf(batch)
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(kwargs["position_ids"])
    assert torch.equal(cu_q, kwargs["cu_seq_lens_q"]) and torch.equal(cu_k, kwargs["cu_seq_lens_k"])
    assert int(max_q) == kwargs["max_length_q"] == batch.max_seqlen
    assert kwargs["cu_seq_lens_q"].tolist() == batch.cu_seqlens_padded.tolist() != batch.cu_seqlens.tolist()


def test_every_key_has_the_collators_shape_and_dtype():
    kwargs = to_hf(_pack(_samples()), num_items_in_batch=7)
    assert set(kwargs) == {*HF_KEYS, "num_items_in_batch"}
    for key in ("input_ids", "position_ids", "labels", "shift_labels"):
        assert kwargs[key].shape == (1, 136) and kwargs[key].dtype == torch.int64, key
    assert kwargs["seq_idx"].shape == (1, 136) and kwargs["seq_idx"].dtype == torch.int32
    assert kwargs["cu_seq_lens_q"].dtype == torch.int32 and kwargs["use_cache"] is False
    assert kwargs["num_items_in_batch"] == 7
    # labels are shift_labels moved one token right: HF's shift gives shift_labels back.
    assert torch.equal(kwargs["labels"][0, 1:], kwargs["shift_labels"][0, :-1])
    assert kwargs["labels"][0, 0] == IGNORE_INDEX


def test_shift_labels_keep_a_target_at_the_packs_last_token(models):
    """Megatron-style labels (every token has a target, the last one too) with no tail pad:
    ``labels`` cannot carry the last target; ``shift_labels`` does, and HF's loss reads it."""
    model = models["llama"]
    model.set_attn_implementation("sdpa")
    g = torch.Generator().manual_seed(5)
    text = [torch.randint(0, VOCAB, (n + 1,), generator=g) for n in (6, 9)]
    samples = [{"input_ids": t[:-1], "labels": t[1:]} for t in text]
    batch = pack_sequences(samples)
    assert batch.labels[-1] != IGNORE_INDEX and batch.num_loss_tokens == 15
    with torch.no_grad():
        loss = model(**to_hf(batch)).loss.item()
        ref = sum(
            torch.nn.functional.cross_entropy(
                model(input_ids=s["input_ids"][None], use_cache=False).logits[0], s["labels"], reduction="sum"
            ).item()
            for s in samples
        )
    assert abs(loss - ref / 15) < TOL


# --- the natural wrong ways: refused, or fixed by to_hf ------------------------------------------


@pytest.mark.slow
def test_the_natural_wrong_ways_are_fixed_or_refused(models):
    model = models["llama"]
    model.set_attn_implementation("sdpa")
    samples = _samples()
    batch = _pack(samples)
    ref_logits, ref_loss, _ = _unpacked(model, samples)
    real = ~batch.padding_mask
    with torch.no_grad():
        # 1. use_cache left at its default: HF skips its packed-sequence detection and attends
        #    across documents. to_hf passes use_cache=False.
        naive = model(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None]).logits[0]
        fixed = model(**to_hf(batch)).logits[0]
        assert (naive[real] - ref_logits).abs().max().item() > 1e-2
        assert (fixed[real] - ref_logits).abs().max().item() < TOL
        # 2. seqpack's labels are next-token targets: passed as HF labels they are shifted twice,
        #    each token scored against the token two ahead. to_hf passes HF-aligned labels.
        kwargs = {k: v for k, v in to_hf(batch).items() if k not in ("labels", "shift_labels")}
        twice = model(**kwargs, labels=batch.labels[None]).loss.item()
        two_ahead = torch.full_like(batch.labels, IGNORE_INDEX)
        two_ahead[:-1] = batch.labels[1:]
        wrong = torch.nn.functional.cross_entropy(fixed, two_ahead).item()
        assert abs(twice - wrong) < TOL and abs(twice - ref_loss) > 1e-3
        assert abs(model(**to_hf(batch)).loss.item() - ref_loss) < TOL
    # 3. HF-style labels read as next-token targets: refused, naming label_format.
    with pytest.raises(SampleError, match="label_format='shifted'.*pass label_format='unshifted'"):
        _pack(_samples(hf_labels=True))
    # 4. Batches HF cannot run: a CP shard, a middle pipeline stage's layout-only batch.
    with pytest.raises(ConfigError, match=r"CP rank 1's shard of a cp_size=2 batch: Hugging Face models have no THD"):
        to_hf(shard_for_cp(batch, 2, 1))
    layout_only = pack_sequences(samples)
    layout_only.input_ids = layout_only.labels = layout_only.loss_mask = None
    with pytest.raises(ConfigError, match="to_hf needs a batch with input_ids.*middle pipeline stage"):
        to_hf(layout_only)


def test_position_ids_hf_would_misread_and_weighted_masks_are_refused():
    # A sequence whose positions continue from the previous one would be joined to it.
    joined = pack_sequences(
        [{"input_ids": torch.arange(1, 4)}, {"input_ids": torch.arange(1, 4), "position_ids": torch.arange(3, 6)}]
    )
    with pytest.raises(ConfigError, match=r"position_ids\[3\]=3 starts sequence 1 but follows position 2"):
        to_hf(joined)
    # A jump inside a sequence would split it.
    split = pack_sequences([{"input_ids": torch.arange(1, 5), "position_ids": torch.tensor([0, 1, 5, 6])}])
    with pytest.raises(ConfigError, match=r"position_ids\[2\]=5 inside sequence 0 jumps from position 1"):
        to_hf(split)
    weighted = pack_sequences([{"input_ids": torch.arange(1, 5), "loss_mask": torch.tensor([1.0, 0.5, 1.0, 0.0])}])
    with pytest.raises(ConfigError, match="loss_mask holds weights other than 0 and 1"):
        to_hf(weighted)
    assert to_hf(weighted, check=False)["shift_labels"].tolist() == [[2, 3, 4, IGNORE_INDEX]]
    # Labels -100 and mask-0 tokens are both left out of HF's targets.
    masked = pack_sequences([{"input_ids": torch.arange(1, 5), "loss_mask": torch.tensor([1.0, 0.0, 1.0, 1.0])}])
    assert to_hf(masked)["shift_labels"].tolist() == [[2, IGNORE_INDEX, 4, IGNORE_INDEX]]
    assert to_hf(masked)["labels"].tolist() == [[IGNORE_INDEX, 2, IGNORE_INDEX, 4]]
    # A padding-only filler goes through (no supervised token, positions 0..n-1).
    filler = to_hf(padding_only_batch(8))
    assert (filler["shift_labels"] == IGNORE_INDEX).all() and filler["cu_seq_lens_q"].tolist() == [0, 8]


@pytest.mark.parametrize("tail", ["append_dummy_seq", "extend_last"])
def test_fixed_shapes_keep_the_bucket_and_the_logits_of_the_plain_pack(models, tail):
    """A StaticShapes pack through to_hf: inputs of the bucket's length, cu_seq_lens of
    max_sequences + 1 entries, and on the real tokens the plain pack's logits and loss."""
    from seqpack.thd import StaticShapes

    model = models["llama"]
    model.set_attn_implementation("sdpa")
    samples = _samples()
    shapes = StaticShapes(token_buckets=(64, 128, 192), max_sequences=9, tail_padding=tail)
    plain = pack_sequences(samples, pad_multiple=8)
    fixed = pack_sequences(samples, pad_multiple=8, static_shapes=shapes)
    kwargs = to_hf(fixed)
    assert kwargs["input_ids"].shape == (1, 128) and kwargs["cu_seq_lens_q"].shape == (10,)
    assert kwargs["max_length_q"] == 128 and fixed.padding_mask[plain.num_tokens :].all()
    with torch.no_grad():
        a, b = model(**to_hf(plain)), model(**kwargs)
    real = ~plain.padding_mask
    assert (a.logits[0][real] - b.logits[0][: plain.num_tokens][real]).abs().max().item() < TOL
    assert abs(a.loss.item() - b.loss.item()) < TOL
