"""seqpack.pack_dataset: packed rows hold every row once, within max_tokens, with
position_ids restarting per sequence, cu_seqlens, and labels in the rows' convention (checked
against seqpack.thd.pack_sequences); a datasets.Dataset in gives one out; refusals name the
row."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import seqpack
from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.thd import IGNORE_INDEX, pack_sequences


def _rows(n=40, seed=0, labels=False, mask=False, low=1, high=30):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        length = int(rng.integers(low, high + 1))
        ids = rng.integers(1, 1000, length)
        row = {"input_ids": ids.tolist()}
        if labels:  # Hugging Face-style: aligned with input_ids, a prompt left out
            hf = ids.copy()
            hf[: length // 3] = IGNORE_INDEX
            row["labels"] = hf.tolist()
        if mask:
            row["completion_mask"] = (np.arange(length) >= length // 2).astype(int).tolist()
        rows.append(row)
    return rows


def _check(packed, rows, max_tokens):
    seen = []
    for row in packed:
        assert set(row) == set(seqpack.packing.PACKED_KEYS)
        total = row["input_ids"].shape[0]
        assert 0 < total <= max_tokens
        cu = row["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == total
        assert len(row["sample_ids"]) == len(cu) - 1
        for k, i in enumerate(row["sample_ids"].tolist()):
            a, b = int(cu[k]), int(cu[k + 1])
            assert row["input_ids"][a:b].tolist() == list(rows[i]["input_ids"])
            assert row["position_ids"][a:b].tolist() == list(range(b - a))
            seen.append(i)
    assert sorted(seen) == list(range(len(rows)))  # every row exactly once
    return seen


@pytest.mark.parametrize("label_format", ["shifted", "unshifted", "position_aligned"])
def test_rows_are_packed_once_within_max_tokens(label_format):
    rows = _rows(60, seed=1)
    packed = seqpack.pack_dataset(rows, 64, label_format=label_format)
    _check(packed, rows, 64)
    bound = -(-sum(len(r["input_ids"]) for r in rows) // 64)
    assert bound <= len(packed) <= bound + 1
    assert len(packed) > 1  # not vacuous


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
@pytest.mark.parametrize(("labels", "mask"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.slow
def test_labels_equal_pack_sequences(label_format, labels, mask):
    rows = _rows(30, seed=2, labels=labels and label_format == "unshifted", mask=mask)
    packed = seqpack.pack_dataset(rows, 50, label_format=label_format)
    for row in packed:
        # pack_sequences packs the same sequences in seqpack's form (next-token targets); a
        # completion_mask is a loss_mask aligned with input_ids (an "unshifted" weight).
        members = [rows[i] for i in row["sample_ids"].tolist()]
        samples = []
        for m in members:
            sample = {"input_ids": m["input_ids"]}
            if "labels" in m:
                sample["labels"] = m["labels"]
            if "completion_mask" in m:
                keep = torch.tensor(m["completion_mask"]) > 0
                ids = torch.tensor(m["input_ids"])
                if label_format == "unshifted":
                    given = torch.tensor(m["labels"]) if "labels" in m else ids
                    sample["labels"] = torch.where(keep, given, IGNORE_INDEX)
                else:  # the target at t is token t + 1, learned where the mask says so
                    nxt = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
                    sample["labels"] = torch.where(torch.cat([keep[1:], torch.tensor([False])]), nxt, IGNORE_INDEX)
            samples.append(sample)
        ref = pack_sequences(samples, label_format=label_format)
        labels_out, mask_out = row["labels"], row["loss_mask"]
        if label_format == "unshifted":  # HF: label of token t + 1 is the target at t
            starts = row["cu_seqlens"][:-1].long()
            assert (labels_out[starts] == IGNORE_INDEX).all() and (mask_out[starts] == 0).all()
            labels_out = torch.cat([labels_out[1:], torch.tensor([IGNORE_INDEX])])
            mask_out = torch.cat([mask_out[1:], torch.tensor([0.0])])
            labels_out[row["cu_seqlens"][1:].long() - 1] = IGNORE_INDEX
            mask_out[row["cu_seqlens"][1:].long() - 1] = 0.0
        assert torch.equal(labels_out, ref.labels)
        assert torch.equal(mask_out, ref.loss_mask)
        assert torch.equal(row["position_ids"], ref.position_ids)
        assert torch.equal(row["cu_seqlens"], ref.cu_seqlens)
        assert ((row["labels"] == IGNORE_INDEX) == (row["loss_mask"] == 0)).all()


def test_hf_labels_match_trls_flattening_collator():
    # TRL's padding-free collator: labels a copy of input_ids, -100 where the completion
    # mask is 0 and at the first token of every sequence.
    rows = _rows(20, seed=3, mask=True)
    for row in seqpack.pack_dataset(rows, 64, label_format="unshifted"):
        expected = []
        for i in row["sample_ids"].tolist():
            ids, keep = rows[i]["input_ids"], rows[i]["completion_mask"]
            expected += [IGNORE_INDEX] + [t if k else IGNORE_INDEX for t, k in zip(ids[1:], keep[1:], strict=True)]
        assert row["labels"].tolist() == expected


def test_a_dataset_in_gives_the_same_rows_as_a_dataset_out():
    datasets = pytest.importorskip("datasets")
    rows = _rows(50, seed=4, labels=True, mask=True)
    ds = datasets.Dataset.from_list(rows)
    out = seqpack.pack_dataset(ds, 40, label_format="unshifted")
    assert isinstance(out, datasets.Dataset)
    expected = seqpack.pack_dataset(rows, 40, label_format="unshifted")
    assert out.num_rows == len(expected) > 1
    for got, want in zip(out, expected, strict=True):
        for key in seqpack.packing.PACKED_KEYS:
            assert got[key] == want[key].tolist(), key


def test_deterministic():
    rows = _rows(80, seed=5)
    a = seqpack.pack_dataset(rows, 45)
    b = seqpack.pack_dataset(rows, 45)
    assert [r["sample_ids"].tolist() for r in a] == [r["sample_ids"].tolist() for r in b]


def test_an_oversize_row_is_refused_by_name():
    rows = [{"input_ids": [1] * 5}, {"input_ids": [2] * 12}, {"input_ids": [3] * 3}]
    with pytest.raises(SampleError, match=r"row 1 has 12 tokens > max_tokens=10 .*on_oversize='truncate'"):
        seqpack.pack_dataset(rows, 10)


@pytest.mark.parametrize("on_oversize", ["truncate", "drop"])
def test_oversize_and_empty_rows_are_counted(on_oversize, caplog):
    rows = [{"input_ids": [1] * 5}, {"input_ids": [2] * 12}, {"input_ids": []}, {"input_ids": [3] * 3}]
    with caplog.at_level(logging.WARNING, logger="seqpack.packing.dataset"):
        packed = seqpack.pack_dataset(rows, 10, on_oversize=on_oversize)
    ids = sorted(i for row in packed for i in row["sample_ids"].tolist())
    assert ids == ([0, 1, 3] if on_oversize == "truncate" else [0, 3])
    assert "1 empty sequences left out" in caplog.text
    truncated = "1 sequences truncated to max_tokens=10 (2 tokens"
    counted = truncated if on_oversize == "truncate" else "1 sequences left out"
    assert counted in caplog.text


@pytest.mark.parametrize(
    ("rows", "kwargs", "error", "match"),
    [
        ([{"input_ids": [1, 2], "position_ids": [0, 1]}, {"input_ids": [1, 2, 3], "position_ids": [0, 1, 0]}], {},
         SampleError, r"row 1: 'position_ids' is 0 at token 2"),
        ([{"input_ids": list(range(1, 10)), "labels": list(range(1, 10))}], {}, SampleError,
         r"row 0: labels equal input_ids .*label_format='shifted'"),
        ([{"input_ids": [1, 2, 3], "completion_mask": [1, 1]}], {}, SampleError, r"row 0: 'completion_mask' has shape"),
        ([{"input_ids": [1, 2], "assistant_masks": [1, -1]}], {}, SampleError, r"row 0: 'assistant_masks' must be"),
        ([{"input_ids": [1.5]}], {}, SeqpackTypeError, r"row 0: 'input_ids'"),
        ([{"labels": [1]}], {}, SampleError, r"row 0 has no 'input_ids'"),
        ({"input_ids": [1]}, {}, SeqpackTypeError, r"rows must be an iterable of mappings"),
        ([{"input_ids": [1]}], {"label_format": "hf"}, ConfigError, r"label_format"),
        ([{"input_ids": [1]}], {"on_oversize": "cut"}, ConfigError, r"on_oversize"),
    ],
)  # fmt: skip
def test_refusals(rows, kwargs, error, match):
    with pytest.raises(error, match=match):
        seqpack.pack_dataset(rows, 10, **kwargs)


def test_a_dataset_with_a_null_or_misaligned_column_is_refused_by_row():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "labels": [[1, 2], [3, 4]]})
    with pytest.raises(SampleError, match=r"row 1: 'labels' has 2 tokens but 'input_ids' has 3"):
        seqpack.pack_dataset(ds, 10, label_format="unshifted")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], None]})
    with pytest.raises(SampleError, match=r"row 1: 'input_ids' is null"):
        seqpack.pack_dataset(ds, 10)


# --- rows packed already, indices, the guard on the rows together ------------------------------


def _prepacked(rows, gap=0):
    """Rows 2k and 2k + 1 as one pre-packed row (``gap`` pad tokens after each sequence)."""
    out = []
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        pad = [0] * gap
        ids = a["input_ids"] + pad + b["input_ids"] + pad
        na, nb = len(a["input_ids"]), len(b["input_ids"])
        row = {"input_ids": ids, "cu_seqlens": [0, na, na + nb]}
        if gap:
            row["cu_seqlens_padded"] = [0, na + gap, na + nb + 2 * gap]
        if "labels" in a:
            row["labels"] = a["labels"] + pad + b["labels"] + pad
        row["position_ids"] = list(range(na)) + pad + list(range(nb)) + pad  # restarting, as packed rows carry
        out.append(row)
    return out


@pytest.mark.parametrize("gap", [0, 2])
@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
def test_a_prepacked_row_is_split_into_its_sequences_as_the_wrapper_splits_it(label_format, gap):
    datasets = pytest.importorskip("datasets")
    rows = _rows(40, seed=6, labels=label_format == "unshifted")
    prepacked = _prepacked(rows, gap)
    want = seqpack.pack_dataset(rows, 64, label_format=label_format)
    for got in (
        seqpack.pack_dataset(prepacked, 64, label_format=label_format),
        seqpack.pack_dataset(datasets.Dataset.from_list(prepacked), 64, label_format=label_format),
    ):
        assert len(got) == len(want) > 1
        for g, w in zip(got, want, strict=True):
            assert (torch.as_tensor(g["sample_ids"]) == w["sample_ids"] // 2).all()  # the pre-packed row
            for key in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "seq_lengths"):
                assert torch.as_tensor(g[key]).tolist() == w[key].tolist(), key
    # The sequences are the wrapper's: split_packed_sample on the normalised row.
    from seqpack.thd import normalize_sample, split_packed_sample

    row = prepacked[0]
    split = split_packed_sample({**normalize_sample(row), **{k: v for k, v in row.items() if k.startswith("cu_")}})
    assert [s["input_ids"].tolist() for s in split] == [rows[0]["input_ids"], rows[1]["input_ids"]]


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"input_ids": [1, 2, 3], "cu_seqlens": [1, 3]}, r"row 0 is pre-packed with a bad layout: .*start at 0"),
        ({"input_ids": [1, 2, 3], "cu_seqlens": [0, 2, 5]}, r"row 0 is pre-packed with a bad layout"),
        ({"input_ids": [1, 2, 3], "cu_seqlens": [0, 2], "position_ids": [0, 2, 0]},
         r"row 0, sequence 0: 'position_ids' is 2 at token 1"),
    ],
)  # fmt: skip
def test_a_bad_prepacked_row_is_refused_by_name_on_both_paths(row, match):
    datasets = pytest.importorskip("datasets")
    rows = [{"input_ids": [4, 5], "cu_seqlens": [0, 2], "position_ids": [0, 1]}, {"position_ids": [0, 1, 2], **row}]
    match = match.replace("row 0", "row 1")
    with pytest.raises(SampleError, match=match):
        seqpack.pack_dataset(rows, 10)
    with pytest.raises(SampleError, match=match):
        seqpack.pack_dataset(datasets.Dataset.from_list(rows), 10)


def test_a_packed_row_index_that_is_no_integer_is_a_type_error_naming_it():
    packed = seqpack.pack_dataset(_rows(10), 64)
    with pytest.raises(TypeError, match=r"packed row indices must be integers or slices, got 1.0 \(float\)"):
        packed[1.0]
    assert packed[np.int64(0)]["input_ids"].tolist() == packed[0]["input_ids"].tolist()


def _short_answers(n, supervised, hf, seed=0):
    """Rows with an answer of ``supervised`` tokens: labels copies of input_ids (``hf``) or
    the next tokens (next-token labels, the last one the first token after the row)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        ids = rng.permutation(1000)[:25] + 1  # no repeats: every supervised token is checked
        labels = np.full(24, IGNORE_INDEX)
        labels[-supervised:] = (ids[:-1] if hf else ids[1:])[-supervised:]
        rows.append({"input_ids": ids[:-1].tolist(), "labels": labels.tolist()})
    return rows


@pytest.mark.parametrize("supervised", [2, 3, 7])
def test_short_hf_answers_declared_shifted_are_refused_on_the_rows_together(supervised):
    rows = _short_answers(1000, supervised, hf=True)
    with pytest.raises(SampleError, match=rf"the rows together .*first misaligned is row 0.*on {supervised * 1000} of"):
        seqpack.pack_dataset(rows, 128)
    seqpack.pack_dataset(_short_answers(1000, supervised, hf=False), 128)  # next-token labels: no false positive
    seqpack.pack_dataset(rows, 128, label_format="unshifted")  # declared right


def test_the_guard_on_the_rows_together_needs_90_percent_of_their_checked_tokens():
    # What the guard cannot see: short misaligned answers among rows in the declared alignment
    # once they are under LABEL_COPY_FRACTION of the checked tokens (docs/packing.md).
    wrong = _short_answers(900, 5, hf=True)  # 4,500 misaligned tokens
    with pytest.raises(SampleError, match=r"the rows together .* on 4500 of 5000 supervised"):
        seqpack.pack_dataset(wrong + _short_answers(100, 5, hf=False, seed=1), 128)
    seqpack.pack_dataset(wrong + _short_answers(101, 5, hf=False, seed=1), 128)  # 4,500 of 5,005: passes


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
def test_a_dataset_of_several_arrow_batches_packed_in_small_chunks_gives_the_rows_packing(label_format, monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = _rows(60, seed=7, labels=label_format == "unshifted", mask=True)
    int32 = datasets.List(datasets.Value("int32"))
    parts = [datasets.Dataset.from_list(rows[i : i + 13]).cast_column("input_ids", int32) for i in range(0, 60, 13)]
    ds = datasets.concatenate_datasets(parts)
    assert len(ds.data.to_batches()) == len(parts) > 1  # the Arrow table is read batch by batch
    monkeypatch.setattr(seqpack.packing.dataset, "CHUNK_TOKENS", 50)  # several chunks of packed rows
    out = seqpack.pack_dataset(ds, 40, label_format=label_format)
    expected = seqpack.pack_dataset(rows, 40, label_format=label_format)
    assert out.num_rows == len(expected) > 5
    assert len(out.data.to_batches()) > 1  # written chunk by chunk
    types = {field.name: str(field.type.value_type) for field in out.data.schema}
    assert types["input_ids"] == types["position_ids"] == "int32"  # the input's type; positions fit
    assert types["labels"] == ("int64" if "labels" in ds.column_names else "int32")  # int64 labels given
    assert out.with_format("torch")[0]["labels"].dtype == torch.int64
    for got, want in zip(out, expected, strict=True):
        for key in seqpack.packing.PACKED_KEYS:
            assert got[key] == want[key].tolist(), key


def test_next_token_labels_of_a_prepacked_row_stop_at_each_sequence():
    # A pre-packed row's next-token labels run across its documents: the first document's
    # last label is the second's first token. Split, no document learns the next one's start.
    datasets = pytest.importorskip("datasets")
    rows = [{"input_ids": [1, 2, 3, 4, 5, 6], "labels": [2, 3, 4, 5, 6, -100], "cu_seqlens": [0, 3, 6]}]
    for packed in (seqpack.pack_dataset(rows, 8), seqpack.pack_dataset(datasets.Dataset.from_list(rows), 8)):
        (row,) = packed
        assert list(row["labels"]) == [2, 3, IGNORE_INDEX, 5, 6, IGNORE_INDEX]
        assert list(row["loss_mask"]) == [1, 1, 0, 1, 1, 0]
    # A row of one sequence keeps its last label (a chunk's next token, outside the row).
    (row,) = seqpack.pack_dataset([*rows, {"input_ids": [7, 8], "labels": [8, 9]}], 8)
    assert row["labels"].tolist()[-2:] == [8, 9]
