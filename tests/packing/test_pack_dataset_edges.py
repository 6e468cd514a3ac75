"""seqpack.pack_dataset at its edges: a datasets.Dataset with a bad column is refused naming
the column (and the row where there is one), as the rows path refuses the same row; a column
stored apart from input_ids, boolean masks, rows with and without labels, and an empty input
give what the rows path gives; a failed write leaves no partial file beside the input."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import seqpack
from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.packing.packer import token_lower_bound
from seqpack.thd import IGNORE_INDEX

datasets = pytest.importorskip("datasets")


def _ds(columns):
    return datasets.Dataset.from_dict(columns)


def _same(got, want):
    """The packed rows ``got`` (a Dataset or PackedRows) hold ``want``'s fields, row by row."""
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        for key in seqpack.packing.PACKED_KEYS:
            assert torch.as_tensor(g[key]).tolist() == w[key].tolist(), key


@pytest.mark.parametrize(
    ("columns", "error", "match"),
    [
        ({"labels": [[1, 2]]}, SampleError, r"the dataset has no 'input_ids' column \(columns: \['labels'\]\)"),
        ({"input_ids": [[1, 2]], "labels": [3]}, SeqpackTypeError,
         r"'labels' column must hold a list per row, got int64"),
        ({"input_ids": [[1.5, 2.0]]}, SeqpackTypeError, r"'input_ids' column must hold integers, got dtype float64"),
        ({"input_ids": [[1, 2, 3]], "cu_seqlens": [[0.0, 3.0]]}, SeqpackTypeError,
         r"cu_seqlens must hold integers, got dtype float64"),
        ({"input_ids": [[1, 2, 3]], "loss_mask": [["a", "b", "c"]]}, SeqpackTypeError,
         r"'loss_mask' column must hold numbers"),
    ],
)  # fmt: skip
def test_a_dataset_column_of_the_wrong_type_is_refused_naming_it(columns, error, match):
    with pytest.raises(error, match=match):
        seqpack.pack_dataset(_ds(columns), 10)


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"input_ids": [[1, 2, 3]], "cu_seqlens": [[0, 3]], "cu_seqlens_padded": [[0, 1, 3]]},
         r"row 0 is pre-packed with a bad layout: cu_seqlens has 2 entries but cu_seqlens_padded has 3"),
        ({"input_ids": [[1, 2], [1, 2, 3]], "cu_seqlens": [[0, 2], []]},
         r"row 1 is pre-packed with a bad layout: cu_seqlens must have at least one entry"),
        ({"input_ids": [[1, 2], [1, 2, 3]], "loss_mask": [[1.0, 1.0], [1.0, -1.0, 1.0]]},
         r"row 1: 'loss_mask' must be >= 0 and finite, got .*-1\.0.* at token 1"),
        ({"input_ids": [[1, 2], [1, 2, 3]], "loss_mask": [[1.0, 1.0], [1.0, 1.0, float("nan")]]},
         r"row 1: 'loss_mask' must be >= 0 and finite, got .*nan.* at token 2"),
        ({"input_ids": [[1, 2], [1, 2, 3]], "completion_mask": [[1, 1], [1, -2, 1]]},
         r"row 1: 'completion_mask' must be >= 0 and finite, got .*-2.* at token 1"),
    ],
)  # fmt: skip
def test_a_bad_dataset_row_is_refused_by_row(columns, match):
    with pytest.raises(SampleError, match=match):
        seqpack.pack_dataset(_ds(columns), 10)


def test_a_token_mask_of_strings_is_a_type_error_naming_its_dtype():
    with pytest.raises(SeqpackTypeError, match=r"row 0: 'completion_mask' must hold 0/1 \(or bools\), got dtype <U1"):
        seqpack.pack_dataset([{"input_ids": [1, 2], "completion_mask": ["a", "b"]}], 10)


@pytest.mark.parametrize("dtype", ["bool", "uint8"])
def test_a_boolean_or_unsigned_mask_column_packs_as_the_rows_do(dtype):
    rows = [{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}, {"input_ids": [4, 5], "completion_mask": [1, 0]}]
    want = seqpack.pack_dataset(rows, 10)
    assert want[0]["loss_mask"].tolist() != [1.0] * 5  # the mask takes effect
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                                  "completion_mask": datasets.List(datasets.Value(dtype))})  # fmt: skip
    ds = datasets.Dataset.from_list(rows, features=features)
    _same(seqpack.pack_dataset(ds, 10), want)


def test_a_column_stored_apart_from_input_ids_is_read_in_its_own_layout():
    # Arrow list columns sliced from larger arrays keep their offsets: labels' rows start at
    # value 3, input_ids' at 0. Each row must still get its own labels.
    import pyarrow as pa
    from datasets.table import InMemoryTable

    ids = pa.array([[1, 2], [3, 4, 5]], pa.list_(pa.int64()))
    labels = pa.array([[9, 9, 9], [IGNORE_INDEX, 2], [IGNORE_INDEX, 4, 5]], pa.list_(pa.int64())).slice(1)
    assert labels.offsets[0].as_py() == 3
    ds = datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids, "labels": labels})))
    rows = [{"input_ids": [1, 2], "labels": [IGNORE_INDEX, 2]},
            {"input_ids": [3, 4, 5], "labels": [IGNORE_INDEX, 4, 5]}]  # fmt: skip
    want = seqpack.pack_dataset(rows, 10, label_format="unshifted")
    _same(seqpack.pack_dataset(ds, 10, label_format="unshifted"), want)


def test_rows_without_labels_get_next_tokens_beside_rows_with_labels():
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6], "labels": [IGNORE_INDEX, 6, IGNORE_INDEX]}]
    explicit = [{"input_ids": [1, 2, 3], "labels": [2, 3, IGNORE_INDEX]}, rows[1]]
    (row,) = seqpack.pack_dataset(rows, 10)
    _same([row], seqpack.pack_dataset(explicit, 10))
    assert row["labels"].tolist() == [2, 3, IGNORE_INDEX, IGNORE_INDEX, 6, IGNORE_INDEX]


@pytest.mark.parametrize(
    "columns",
    [{"input_ids": []}, {"input_ids": [[], []]}],
    ids=["no rows", "empty rows"],
)
def test_a_dataset_of_nothing_to_pack_gives_an_empty_dataset_with_the_packed_columns(columns):
    out = seqpack.pack_dataset(_ds(columns), 10)
    assert isinstance(out, datasets.Dataset)
    assert out.num_rows == 0
    assert out.column_names == list(seqpack.packing.PACKED_KEYS)
    assert len(seqpack.pack_dataset([{"input_ids": []}], 10)) == 0  # the rows path agrees


def test_the_packed_dataset_is_written_beside_the_input_and_a_refused_one_leaves_no_file(tmp_path):
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "good")
    out = seqpack.pack_dataset(datasets.load_from_disk(tmp_path / "good"), 10)
    (written,) = out.cache_files
    assert os.path.dirname(written["filename"]) == str(tmp_path / "good")
    _same(out, seqpack.pack_dataset(rows, 10))
    # Misaligned labels are refused once every chunk is written: the partial file goes.
    bad = [{"input_ids": list(range(1, 10)), "labels": list(range(1, 10))}]
    datasets.Dataset.from_list(bad).save_to_disk(tmp_path / "bad")
    before = sorted(os.listdir(tmp_path / "bad"))
    with pytest.raises(SampleError, match=r"row 0: labels equal input_ids"):
        seqpack.pack_dataset(datasets.load_from_disk(tmp_path / "bad"), 10)
    assert sorted(os.listdir(tmp_path / "bad")) == before


def test_progress_shows_a_bar_on_request_and_packs_the_same(capsys):
    rows = [{"input_ids": list(range(1, n + 1))} for n in (3, 5, 2)]
    with_bar = seqpack.pack_dataset(rows, 8, progress=True)
    assert "seqpack: reading rows" in capsys.readouterr().err
    _same(with_bar, seqpack.pack_dataset(rows, 8, progress=False))
    assert "seqpack: reading rows" not in capsys.readouterr().err
    with pytest.raises(SeqpackTypeError, match=r"progress .*'yes'"):
        seqpack.pack_dataset(rows, 8, progress="yes")


def test_packed_rows_slice_as_a_list_does():
    packed = seqpack.pack_dataset([{"input_ids": [k] * n} for k, n in enumerate((6, 5, 4, 3, 2), 1)], 7)
    every = [packed[k] for k in range(len(packed))]
    for cut in (slice(None), slice(1, None), slice(None, None, -1), slice(5, 9)):
        got = packed[cut]
        assert [r["sample_ids"].tolist() for r in got] == [r["sample_ids"].tolist() for r in every[cut]]


def test_the_token_bound_of_lengths_whose_int64_sum_wraps_is_exact():
    lengths = np.full(3, 2**62, dtype=np.int64)
    assert int(lengths.sum()) < 0  # what a plain int64 sum gives
    assert token_lower_bound(lengths, 2**62) == 3
    assert token_lower_bound(lengths, 2**62 + 1) == 3
    assert token_lower_bound(np.zeros(0, np.int64), 5) == 0
