"""seqpack.interop.nemo's converters refuse, naming the field and what it holds, the batches
whose layout they cannot read; a batch without labels converts; mRoPE positions are split per
chunk as each chunk alone converts them."""

from __future__ import annotations

import pytest
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks

S = -1000  # NeMo's seq_lens_padding_value


def _batch(**fields):
    ids = torch.arange(1, 13).reshape(2, 6)
    base = {"input_ids": ids, "labels": ids + 1, "seq_lens": torch.tensor([[3, 2], [6, S]]),
            "seq_lens_padded": torch.tensor([[4, 2], [6, S]])}  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"seq_lens": [[3, 2], [6, S]]}, SeqpackTypeError, r"seq_lens must be a tensor, got list"),
        ({"seq_lens_padded": (4, 2)}, SeqpackTypeError, r"seq_lens_padded must be a tensor, got tuple"),
        ({"seq_lens": torch.tensor(5), "seq_lens_padded": torch.tensor(5)}, SampleError,
         r"seq_lens must be \[B, num_packs\], got shape \(\)"),
        ({"seq_lens": torch.zeros(0, 2, dtype=torch.int64)}, SampleError,
         r"seq_lens must be \[B, num_packs\], got shape \(0, 2\)"),
        ({"seq_lens_padded": torch.tensor([[4, 2, S], [6, S, S]])}, SampleError,
         r"seq_lens \(2, 2\) and seq_lens_padded \(2, 3\) differ in shape"),
        ({"seq_lens_padded": torch.tensor([[4, S], [6, S]])}, SampleError,
         r"seq_lens and seq_lens_padded mark different entries as padding \(seq_lens_padding_value=-1000\)"),
        ({"seq_lens": torch.tensor([[3, 2], [7, S]]), "seq_lens_padded": torch.tensor([[4, 2], [7, S]])}, SampleError,
         r"row 1: seq_lens_padded sums to 7 > sequence length 6"),
        ({"labels": [[1, 2]]}, SeqpackTypeError, r"labels must be a tensor, got list"),
        ({"position_ids": torch.zeros(2, 5, dtype=torch.int64)}, SampleError,
         r"position_ids has shape \(2, 5\) but input_ids has \(2, 6\): expected \(2, 6\)"),
    ],
)  # fmt: skip
def test_a_batch_whose_layout_cannot_be_read_is_refused_naming_it(fields, error, match):
    with pytest.raises(error, match=match):
        process_input_for_thd(_batch(**fields))


@pytest.mark.parametrize("num_chunks", [1, 2])
def test_a_batch_without_input_ids_is_refused_naming_its_keys(num_chunks):
    batch = _batch()
    del batch["input_ids"]
    with pytest.raises(SampleError, match=r"batch has no 'input_ids'.*\['labels', 'seq_lens', 'seq_lens_padded'\]"):
        split_batch_into_thd_chunks(batch, num_chunks)


def test_a_batch_without_labels_converts_as_with_them_less_the_labels():
    with_labels = process_input_for_thd(_batch())
    batch = _batch()
    del batch["labels"]
    without = process_input_for_thd(batch)
    assert without["labels"] is None
    for key in ("input_ids", "cu_seqlens", "cu_seqlens_padded", "padding_mask", "max_seqlen"):
        assert torch.equal(without[key], with_labels[key]), key


def test_mrope_positions_are_split_by_chunk_as_each_chunk_converts_them():
    ids = torch.arange(1, 25).reshape(4, 6)
    positions = torch.stack([torch.arange(6).repeat(4, 1) * (k + 1) for k in range(3)])  # [3, B, S], rows differ
    positions[:, 2:] += 100  # the second chunk's rows
    lens = torch.tensor([[6], [6], [6], [6]])
    batch = {"input_ids": ids, "position_ids": positions, "seq_lens": lens, "seq_lens_padded": lens}
    out = split_batch_into_thd_chunks(batch, 2)
    assert out["position_ids"].shape == (2, 3, 1, 12)
    for c in range(2):
        rows = slice(2 * c, 2 * c + 2)
        chunk = {"input_ids": ids[rows], "position_ids": positions[:, rows], "seq_lens": lens[rows],
                 "seq_lens_padded": lens[rows]}  # fmt: skip
        alone = process_input_for_thd(chunk)
        assert torch.equal(out["position_ids"][c], alone["position_ids"])
        assert torch.equal(out["input_ids"][c], alone["input_ids"])


def test_a_chunk_without_sequences_has_max_seqlen_zero_wherever_it_is():
    ids = torch.arange(1, 9).reshape(2, 4)
    for lens, expected in ((torch.tensor([[4], [S]]), [4, 0]), (torch.tensor([[S], [4]]), [0, 4])):
        out = split_batch_into_thd_chunks({"input_ids": ids, "seq_lens": lens, "seq_lens_padded": lens}, 2)
        assert out["max_seqlen"].dtype == torch.int32 and out["max_seqlen"].tolist() == expected
        assert out["cu_seqlens"].tolist() == ([[0, 4], [0, S]] if expected[0] else [[0, S], [0, 4]])
