"""PackedBatch: its contract fields, te_kwargs() and the padding-only filler."""

import pytest
import torch

from seqpack.thd import PackedBatch, pack_sequences, padding_only_batch


def _samples(lengths, seed=0, with_labels=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        s = {"input_ids": torch.randint(1, 1000, (n,), generator=g)}
        if with_labels:
            s["labels"] = torch.randint(0, 1000, (n,), generator=g)
            s["position_ids"] = torch.arange(n) + int(torch.randint(0, 9, (1,), generator=g))
        out.append(s)
    return out


def test_te_kwargs_tail_only_padding_is_absorbed():
    b = pack_sequences(_samples([4, 5]), pad_to=12)
    kw = b.te_kwargs()
    assert kw["pad_between_seqs"] is False
    assert kw["cu_seqlens_q"] is kw["cu_seqlens_q_padded"]
    assert kw["cu_seqlens_q"].tolist() == [0, 4, 12]
    assert kw["max_seqlen_q"] == 8 and kw["qkv_format"] == "thd"
    assert kw["attn_mask_type"] == "padding_causal"


def test_te_kwargs_padded_as_real():
    b = pack_sequences(_samples([3, 5]), pad_multiple=4)
    kw = b.te_kwargs(padded_as_real=True)
    assert kw["cu_seqlens_q"] is kw["cu_seqlens_q_padded"] and kw["pad_between_seqs"] is False
    assert "qkv_format" not in b.te_kwargs(include_format=False)


def test_padding_only_batch():
    b = padding_only_batch(8)
    assert b.num_tokens == 8 and b.num_real_tokens == 0
    assert b.cu_seqlens.tolist() == [0, 0] and b.cu_seqlens_padded.tolist() == [0, 8]
    assert b.loss_mask.sum() == 0 and b.sample_ids.tolist() == [-1]
    with pytest.raises(ValueError, match="num_tokens"):
        padding_only_batch(0)


def test_packed_batch_is_dataclass_with_contract_fields():
    names = [f for f in PackedBatch.__dataclass_fields__]
    for field in (
        "input_ids",
        "labels",
        "loss_mask",
        "position_ids",
        "seq_idx",
        "padding_mask",
        "cu_seqlens",
        "cu_seqlens_padded",
        "max_seqlen",
        "sample_ids",
        "cp_size",
        "cp_rank",
        "num_loss_tokens",
    ):
        assert field in names


def _fields(batch):
    return {f: getattr(batch, f) for f in batch.__dataclass_fields__}


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("labels", torch.zeros(3, dtype=torch.int64), r"PackedBatch.labels has shape \(3,\)"),
        ("padding_mask", torch.zeros(2, 8, dtype=torch.bool), r"PackedBatch.padding_mask has shape \(2, 8\)"),
        ("cu_seqlens_padded", torch.tensor([0, 8], dtype=torch.int32), "cu_seqlens_padded"),
        ("sample_ids", torch.tensor([0], dtype=torch.int64), r"sample_ids has shape \(1,\), expected \(2,\)"),
        ("cp_rank", 1, "cp_rank"),
        ("max_seqlen", -1, "max_seqlen"),
        ("num_loss_tokens", -1, r"PackedBatch.num_loss_tokens must be an integer >= 0, got -1"),
        ("num_loss_tokens", 2.0, r"PackedBatch.num_loss_tokens must be an integer"),
    ],
)
def test_packed_batch_refuses_inconsistent_shapes(field, value, match):
    batch = pack_sequences([{"input_ids": torch.arange(1, 4)}, {"input_ids": torch.arange(1, 6)}], pad_multiple=4)
    fields = _fields(batch)
    fields[field] = value
    with pytest.raises(ValueError, match=match):
        PackedBatch(**fields)
    PackedBatch(**_fields(batch))  # the builder's own fields pass
