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
    assert "1 empty rows left out" in caplog.text
    counted = "1 rows truncated to max_tokens=10 (2 tokens" if on_oversize == "truncate" else "1 rows left out"
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
