"""NeMo Automodel's BSHD -> THD converters (seqpack.interop.nemo), against its documented contract."""

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks


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


@pytest.mark.parametrize(
    "num_chunks, error, match",
    [
        (0, ConfigError, "num_chunks must be a positive integer, got 0"),
        (-2, ConfigError, "num_chunks must be a positive integer, got -2"),
        (1.0, SeqpackTypeError, "num_chunks must be a positive integer, got 1.0"),
        ("2", SeqpackTypeError, "num_chunks must be a positive integer, got '2'"),
        (True, SeqpackTypeError, "num_chunks must be a positive integer, got True"),
        (3, ConfigError, "batch size 2 is not divisible by num_chunks=3"),
    ],
)
def test_split_batch_into_thd_chunks_rejects_bad_num_chunks(num_chunks, error, match):
    with pytest.raises(error, match=match):
        split_batch_into_thd_chunks(_nemo_example(), num_chunks=num_chunks)


def test_split_batch_into_thd_chunks_one_chunk_is_process_input_for_thd():
    one = split_batch_into_thd_chunks(_nemo_example(), num_chunks=1)
    ref = process_input_for_thd(_nemo_example())
    assert one.keys() == ref.keys()
    for key, value in ref.items():
        assert torch.equal(one[key], value) if isinstance(value, torch.Tensor) else one[key] == value


def test_float_seq_lens_are_errors_not_truncated():
    bad = {**_nemo_example(), "seq_lens": torch.tensor([[3.0, 2.5], [6.0, -1000.0]])}
    with pytest.raises(SeqpackTypeError, match="seq_lens must hold integers, got dtype torch.float32"):
        process_input_for_thd(bad)
    with pytest.raises(SeqpackTypeError, match="input_ids must be a .* tensor, got list"):
        process_input_for_thd({"input_ids": [[1, 2]]})
    with pytest.raises(SampleError, match=r"input_ids must be \[B, S\] or \[B, S, H\], got \(2,\)"):
        process_input_for_thd({"input_ids": torch.tensor([1, 2])})


def _mask_reference(seq_lens, seq_lens_padded, seq_len):
    """Per token, row by row (rows fully listed, as NeMo assumes): pad unless inside a real span."""
    mask = []
    for reals, slots in zip(seq_lens, seq_lens_padded, strict=True):
        row = [True] * seq_len
        start = 0
        for real, slot in zip(reals, slots, strict=True):
            if real == -1000:
                continue
            for t in range(start, start + real):
                row[t] = False
            start += slot
        mask += row
    return mask


@given(
    rows=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), min_size=0, max_size=3), min_size=1, max_size=3
    ),
    extra=st.integers(0, 3),
)
@pytest.mark.slow
def test_padding_mask_from_the_layout_matches_a_per_token_reference(rows, extra):
    used = [sum(r + p for r, p in row) for row in rows]
    seq_len = max(used) + extra
    # Every row but the last is fully listed (NeMo's assumption): its last slot takes the rest.
    width = max(len(row) for row in rows) or 1
    reals, slots = [], []
    for i, row in enumerate(rows):
        row_real = [r for r, _ in row]
        row_slot = [r + p for r, p in row]
        if i < len(rows) - 1 and row:
            row_slot[-1] += seq_len - used[i]
        reals.append(row_real + [-1000] * (width - len(row)))
        slots.append(row_slot + [-1000] * (width - len(row)))
    batch = {
        "input_ids": torch.ones(len(rows), seq_len, dtype=torch.long),
        "labels": torch.zeros(len(rows), seq_len, dtype=torch.long),
        "position_ids": torch.zeros(len(rows), seq_len, dtype=torch.long),
        "seq_lens": torch.tensor(reals),
        "seq_lens_padded": torch.tensor(slots),
    }
    last = max((i for i, row in enumerate(rows) if row), default=-1)
    if seq_len > 0 and any(not rows[i] and (i == 0 or not rows[i - 1]) for i in range(last)):
        # An empty row with no sequence before it to absorb its tokens, ahead of rows with sequences.
        with pytest.raises(SampleError, match="holds no sequence but precedes rows that do"):
            process_input_for_thd(batch)
        return
    out = process_input_for_thd(batch)
    assert out["padding_mask"].tolist() == _mask_reference(reals, slots, seq_len)


@pytest.mark.processes
def test_thd_names_in_either_import_order():
    import seqpack.interop.nemo
    import seqpack.thd
    import seqpack.thd.cp

    assert not hasattr(seqpack.thd, "process_input_for_thd")  # interop builds on thd, not the reverse
    assert seqpack.thd.shard_for_cp is seqpack.thd.cp.shard_for_cp
    for name in seqpack.thd.__all__:
        assert getattr(seqpack.thd, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        seqpack.thd.nope  # noqa: B018
    # `import seqpack` imports seqpack.thd and its modules before any of them: one of them
    # first is the same order as another (a process each would cost seconds for nothing).
    for first in ("seqpack.interop.nemo", "seqpack.thd.cp"):
        code = f"import {first}; from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks"
        subprocess.run([sys.executable, "-c", code], check=True)
