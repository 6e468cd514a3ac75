import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from naive import pack_reference

from seqpack.thd import (
    IGNORE_INDEX,
    PackedBatch,
    pack_sequences,
    pad_multiple_for,
    padded_lengths,
    padding_only_batch,
    process_input_for_thd,
    split_batch_into_thd_chunks,
    split_packed_sample,
)


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


# --- pack_sequences -------------------------------------------------------------------


def test_pack_basic_layout():
    b = pack_sequences(
        [{"input_ids": torch.tensor([1, 2, 3, 4, 5])}, {"input_ids": torch.tensor([7, 8, 9])}], pad_multiple=4
    )
    assert b.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 7, 8, 9, 0]
    assert b.labels.tolist() == [2, 3, 4, 5, -100, -100, -100, -100, 8, 9, -100, -100]
    assert b.loss_mask.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
    assert b.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert b.seq_idx.tolist() == [0] * 8 + [1] * 4
    assert b.padding_mask.tolist() == [False] * 5 + [True] * 3 + [False] * 3 + [True]
    assert b.cu_seqlens.tolist() == [0, 5, 8] and b.cu_seqlens.dtype == torch.int32
    assert b.cu_seqlens_padded.tolist() == [0, 8, 12] and b.cu_seqlens_padded.dtype == torch.int32
    assert b.max_seqlen == 8
    assert b.sample_ids.tolist() == [0, 1]
    assert (b.num_tokens, b.num_real_tokens, b.num_sequences) == (12, 8, 2)
    assert b.input_ids.dtype == torch.int64 and b.labels.dtype == torch.int64
    assert b.loss_mask.dtype == torch.float32 and b.seq_idx.dtype == torch.int32
    assert b.padding_mask.dtype == torch.bool and b.position_ids.dtype == torch.int64


def test_pack_no_padding_shares_cu_seqlens_object():
    b = pack_sequences(_samples([3, 5]))
    assert b.cu_seqlens_padded is b.cu_seqlens
    kw = b.te_kwargs()
    assert kw["cu_seqlens_q"] is kw["cu_seqlens_q_padded"]
    assert kw["pad_between_seqs"] is False
    moved = b.to("cpu")
    assert moved.cu_seqlens_padded is moved.cu_seqlens


def test_pack_pad_to_absorbed_into_last_sequence():
    b = pack_sequences(_samples([3, 5]), pad_multiple=2, pad_to=16, pad_token_id=7)
    assert b.num_tokens == 16
    assert b.cu_seqlens_padded.tolist() == [0, 4, 16]
    assert b.cu_seqlens.tolist() == [0, 3, 8]
    assert b.position_ids[4:].tolist() == list(range(12))
    assert b.input_ids[9:].tolist() == [7] * 7
    assert b.seq_idx[4:].tolist() == [1] * 12
    assert b.max_seqlen == 12
    # Only the tail differs from the real layout? No: the first sequence is padded too.
    assert b.te_kwargs()["pad_between_seqs"] is True


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


def test_pack_keeps_given_labels_mask_positions():
    s = [
        {
            "input_ids": torch.tensor([5, 6, 7]),
            "labels": torch.tensor([-100, 7, 8]),
            "loss_mask": torch.tensor([0.0, 1.0, 0.5]),
            "position_ids": torch.tensor([10, 11, 12]),
        },
        {"input_ids": torch.tensor([1, 2])},
    ]
    b = pack_sequences(s, pad_multiple=4)
    assert b.labels.tolist() == [-100, 7, 8, -100, 2, -100, -100, -100]
    assert b.loss_mask.tolist() == [0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert b.position_ids.tolist() == [10, 11, 12, 13, 0, 1, 2, 3]


def test_pack_sample_ids_and_lists():
    b = pack_sequences([{"input_ids": [1, 2]}, {"input_ids": np.array([3])}], sample_ids=[40, 7])
    assert b.sample_ids.tolist() == [40, 7]
    assert b.input_ids.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "samples, kwargs, error, match",
    [
        ([], {}, ValueError, "empty"),
        (
            [{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([], dtype=torch.long)}],
            {},
            ValueError,
            "sample 1 has a zero-length",
        ),
        (
            [{"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1])}],
            {},
            ValueError,
            "sample 0: 'labels' has 1 tokens but 'input_ids' has 2",
        ),
        ([{"input_ids": torch.tensor([1.0, 2.0])}], {}, TypeError, "sample 0: 'input_ids' must hold integers"),
        ([{"labels": torch.tensor([1])}], {}, ValueError, "sample 0 has no 'input_ids'"),
        ([{"input_ids": torch.ones(2, 2, dtype=torch.long)}], {}, ValueError, "must be 1-D"),
        ([{"input_ids": torch.tensor([1, 2, 3])}], {"pad_to": 2}, ValueError, "pad_to=2"),
        ([{"input_ids": torch.tensor([1, 2, 3])}], {"pad_multiple": 0}, ValueError, "pad_multiple"),
        (
            [{"input_ids": torch.tensor([1, 2, 3])}],
            {"pad_multiple": 4, "pad_to": 6},
            ValueError,
            "multiple of pad_multiple",
        ),
        (["abc"], {}, TypeError, "sample 0 must be a mapping"),
    ],
)
def test_pack_bad_input(samples, kwargs, error, match):
    with pytest.raises(error, match=match):
        pack_sequences(samples, **kwargs)


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    pad_multiple=st.sampled_from([1, 2, 3, 4, 8, 16]),
    extra=st.integers(0, 3),
    with_labels=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_pack_matches_reference(lengths, pad_multiple, extra, with_labels, seed):
    samples = _samples(lengths, seed, with_labels)
    padded = int(padded_lengths(lengths, pad_multiple).sum())
    pad_to = padded + extra * pad_multiple if extra else None
    b = pack_sequences(samples, pad_multiple=pad_multiple, pad_to=pad_to, pad_token_id=3)
    ref, cu, cu_padded = pack_reference(samples, pad_multiple, pad_to, pad_token_id=3)
    for key, values in ref.items():
        assert getattr(b, key).tolist() == values, key
    assert b.cu_seqlens.tolist() == cu
    assert b.cu_seqlens_padded.tolist() == cu_padded
    # Invariants: tokens come back in order, lengths are real, padding minimal.
    real = b.input_ids[~b.padding_mask]
    assert real.tolist() == torch.cat([s["input_ids"] for s in samples]).tolist()
    assert b.seq_lens().tolist() == list(lengths)
    pl = b.seq_lens_padded().tolist()
    if pad_to is None:
        assert pl == [-(-n // pad_multiple) * pad_multiple for n in lengths]
    assert all(
        p % pad_multiple == 0 and p >= n and p - n < pad_multiple for p, n in zip(pl[:-1], lengths[:-1], strict=True)
    )
    assert b.max_seqlen == max(pl)
    assert b.labels[b.padding_mask].eq(IGNORE_INDEX).all() and b.loss_mask[b.padding_mask].eq(0).all()


# --- pad_multiple_for, filler, split ----------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        ((1,), 1),
        ((2,), 4),
        ((4,), 8),
        ((4, 2, True), 16),
        ((4, 2, False), 8),
        ((1, 4, True), 4),
        ((1, 1, False, True), 16),
        ((3, 1, False, True), 48),
        ((2, 2, True, True), 16),
        ((4, 3, True, True), 48),
    ],
)
def test_pad_multiple_for(args, expected):
    assert pad_multiple_for(*args) == expected


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_pad_multiple_for_rejects(bad):
    with pytest.raises(ValueError, match="cp_size"):
        pad_multiple_for(bad)


def test_padding_only_batch():
    b = padding_only_batch(8)
    assert b.num_tokens == 8 and b.num_real_tokens == 0
    assert b.cu_seqlens.tolist() == [0, 0] and b.cu_seqlens_padded.tolist() == [0, 8]
    assert b.loss_mask.sum() == 0 and b.sample_ids.tolist() == [-1]
    with pytest.raises(ValueError, match="num_tokens"):
        padding_only_batch(0)


def test_split_packed_sample_roundtrip():
    b = pack_sequences(_samples([3, 6, 1], seed=4), pad_multiple=4)
    parts = split_packed_sample(
        {
            "input_ids": b.input_ids,
            "labels": b.labels,
            "cu_seqlens": b.cu_seqlens,
            "cu_seqlens_padded": b.cu_seqlens_padded,
        }
    )
    assert [p["input_ids"].numel() for p in parts] == [3, 6, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), b.input_ids[~b.padding_mask])
    with pytest.raises(ValueError, match="cu_seqlens"):
        split_packed_sample({"input_ids": b.input_ids})


# --- NeMo Automodel converters ----------------------------------------------------------


def _nemo_example():
    return {
        "input_ids": torch.tensor([[1, 2, 3, 99, 4, 5], [6, 7, 8, 9, 10, 11]]),
        "labels": torch.tensor([[2, 3, 99, 4, 5, 6], [7, 8, 9, 10, 11, 12]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 5]]),
        "seq_lens": torch.tensor([[3, 2], [6, -1000]]),
        "seq_lens_padded": torch.tensor([[4, 2], [6, -1000]]),
        "qkv_format": "thd",
    }


def test_process_input_for_thd_documented_example():
    out = process_input_for_thd(_nemo_example())
    assert out["input_ids"].shape == (12,) and out["labels"].shape == (12,) and out["position_ids"].shape == (12,)
    assert out["cu_seqlens"].tolist() == [0, 3, 5, 11] and out["cu_seqlens"].dtype == torch.int32
    assert out["cu_seqlens_padded"].tolist() == [0, 4, 6, 12] and out["cu_seqlens_padded"].dtype == torch.int32
    assert out["max_seqlen"].dtype == torch.int32 and out["max_seqlen"].dim() == 0 and int(out["max_seqlen"]) == 6
    assert out["padding_mask"].tolist() == [False] * 3 + [True] + [False] * 8
    assert out["qkv_format"] == "thd"
    assert "seq_lens" not in out and "seq_lens_padded" not in out


def test_process_input_for_thd_tail_absorbed():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0]]),
        "labels": torch.zeros(1, 8, dtype=torch.long),
        "position_ids": torch.arange(8).unsqueeze(0),
        "seq_lens": torch.tensor([[3, 2]]),
        "seq_lens_padded": torch.tensor([[3, 2]]),
    }
    out = process_input_for_thd(batch)
    assert out["cu_seqlens"].tolist() == [0, 3, 8]
    assert "cu_seqlens_padded" not in out
    assert int(out["max_seqlen"]) == 5
    assert out["padding_mask"].tolist() == [False] * 5 + [True] * 3


def test_process_input_for_thd_padding_mask_from_layout_not_token_values():
    # Token id 0 (the padding id) appears as content; the mask must still be right.
    batch = {
        "input_ids": torch.tensor([[0, 2, 0, 9, 9, 9]]),
        "labels": torch.zeros(1, 6, dtype=torch.long),
        "position_ids": torch.arange(6).unsqueeze(0),
        "seq_lens": torch.tensor([[2, 1]]),
        "seq_lens_padded": torch.tensor([[4, 2]]),
    }
    out = process_input_for_thd(batch, padding_token_id=0)
    assert out["padding_mask"].tolist() == [False, False, True, True, False, True]
    assert out["cu_seqlens"].tolist() == [0, 2, 3]
    assert out["cu_seqlens_padded"].tolist() == [0, 4, 6]


def test_process_input_for_thd_embeddings_and_custom_sentinel():
    batch = {
        "input_ids": torch.randn(2, 4, 8),
        "labels": torch.zeros(2, 4, dtype=torch.long),
        "position_ids": torch.arange(4).repeat(2, 1),
        "seq_lens": torch.tensor([[4, -1], [2, 2]]),
        "seq_lens_padded": torch.tensor([[4, -1], [2, 2]]),
    }
    out = process_input_for_thd(batch, seq_lens_padding_value=-1)
    assert out["input_ids"].shape == (8, 8)
    assert torch.equal(out["input_ids"], batch["input_ids"].reshape(8, 8))
    assert out["cu_seqlens"].tolist() == [0, 4, 6, 8]
    assert "cu_seqlens_padded" not in out


def test_process_input_for_thd_interior_row_tail_keeps_offsets():
    # Row 0 lists 5 of its 6 slots; NeMo would place row 1's sequence at offset 5.
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 11]]),
        "labels": torch.zeros(2, 6, dtype=torch.long),
        "position_ids": torch.arange(6).repeat(2, 1),
        "seq_lens": torch.tensor([[3, 2], [6, -1000]]),
        "seq_lens_padded": torch.tensor([[3, 2], [6, -1000]]),
    }
    out = process_input_for_thd(batch)
    assert out["cu_seqlens_padded"].tolist() == [0, 3, 6, 12]
    assert out["cu_seqlens"].tolist() == [0, 3, 5, 11]
    assert out["padding_mask"].tolist() == [False] * 5 + [True] + [False] * 6


def test_process_input_for_thd_without_seq_lens():
    batch = {
        "input_ids": torch.tensor([[4, 5, 6, 0, 0]]),
        "labels": torch.zeros(1, 5, dtype=torch.long),
        "position_ids": torch.arange(5)[None],
    }
    out = process_input_for_thd(batch)
    assert out["padding_mask"].tolist() == [False, False, False, True, True]
    with pytest.raises(ValueError, match="padding_token_id=0 also occurs"):
        process_input_for_thd({**batch, "input_ids": torch.tensor([[4, 0, 6, 0, 0]])})


def test_process_input_for_thd_bad_shapes():
    with pytest.raises(ValueError, match="input_ids must be"):
        process_input_for_thd({"input_ids": torch.tensor([1, 2])})
    bad = _nemo_example()
    bad["seq_lens_padded"] = torch.tensor([[2, 2], [6, -1000]])
    with pytest.raises(ValueError, match="seq_lens"):
        process_input_for_thd(bad)


def test_split_batch_into_thd_chunks_documented_example():
    batch = {
        "input_ids": torch.arange(1, 25).reshape(4, 6),
        "labels": torch.arange(2, 26).reshape(4, 6),
        "position_ids": torch.arange(6).repeat(4, 1),
        "seq_lens": torch.tensor([[6], [6], [6], [6]]),
        "seq_lens_padded": torch.tensor([[6], [6], [6], [6]]),
    }
    out = split_batch_into_thd_chunks(batch, num_chunks=2)
    assert out["input_ids"].shape == (2, 12)
    assert out["cu_seqlens"].tolist() == [[0, 6, 12], [0, 6, 12]]
    assert out["max_seqlen"].tolist() == [6, 6]
    assert out["padding_mask"].shape == (2, 12)
    assert "cu_seqlens_padded" not in out


def test_split_batch_into_thd_chunks_ragged_and_padded():
    out = split_batch_into_thd_chunks(_nemo_example(), num_chunks=2)
    assert out["cu_seqlens"].tolist() == [[0, 3, 5], [0, 6, -1000]]
    # Chunk 0 emits padded offsets; chunk 1 absorbed, so its row is its cu_seqlens.
    assert out["cu_seqlens_padded"].tolist() == [[0, 4, 6], [0, 6, -1000]]
    assert out["max_seqlen"].tolist() == [3, 6]
    assert out["qkv_format"] == "thd"
    single = split_batch_into_thd_chunks(_nemo_example(), num_chunks=1)
    assert single["cu_seqlens"].tolist() == [0, 3, 5, 11]
    with pytest.raises(ValueError, match="not divisible"):
        split_batch_into_thd_chunks(_nemo_example(), num_chunks=3)


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
    ):
        assert field in names


def test_process_input_for_thd_seq_lens_only_rows_ending_in_padding():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 7, 0, 0, 0, 0]]),
        "labels": torch.zeros(2, 8, dtype=torch.long),
        "position_ids": torch.arange(8).repeat(2, 1),
        "seq_lens": torch.tensor([[3], [4]]),
    }
    out = process_input_for_thd(batch)
    assert out["padding_mask"].tolist() == [False] * 3 + [True] * 5 + [False] * 4 + [True] * 4
    assert out["cu_seqlens"].tolist() == [0, 3, 7]
    assert out["cu_seqlens_padded"].tolist() == [0, 8, 12]  # row 1 starts at token 8
    # One row (or rows without gaps): NeMo's output, no cu_seqlens_padded.
    single = process_input_for_thd({k: v[:1] for k, v in batch.items()})
    assert single["cu_seqlens"].tolist() == [0, 3] and "cu_seqlens_padded" not in single
    assert single["padding_mask"].tolist() == [False] * 3 + [True] * 5
