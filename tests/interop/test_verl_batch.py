"""seqpack.interop.verl_batch without verl or tensordict: a TensorDict (anything with
``batch_size`` that is no dict) is indexed as a whole, its nested values rebuilt row by row; a
mapping is indexed value by value as each type indexes; a mask that is no [B, S] tensor and a
value of no row type are refused naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.errors import SeqpackTypeError
from seqpack.interop.verl import rearrange_micro_batches
from seqpack.interop.verl_batch import row_lengths, select_rows


class FakeTensorDict:
    """What seqpack uses of a TensorDict: ``batch_size``, ``keys``, string and row indexing,
    item assignment and ``exclude``. Row indexing of a nested value fails, as aten's does."""

    def __init__(self, values, batch_size):
        self.values, self.batch_size = dict(values), batch_size
        self.whole_indexings = 0

    def keys(self):
        return self.values.keys()

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.values[key]
        assert not any(v.is_nested for v in self.values.values()), "nested tensors have no row indexing"
        self.whole_indexings += 1
        return FakeTensorDict({k: v[key] for k, v in self.values.items()}, (len(key),))

    def __setitem__(self, key, value):
        self.values[key] = value

    def exclude(self, *keys):
        return FakeTensorDict({k: v for k, v in self.values.items() if k not in keys}, self.batch_size)


def _pieces(rows=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (rows,), generator=g).tolist()
    return [torch.randint(0, 50, (n,), generator=g) for n in lengths], lengths


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_a_tensordict_is_indexed_whole_and_its_nested_values_rebuilt_by_row(layout):
    pieces, lengths = _pieces()
    mask = (torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)
    values = {
        "attention_mask": mask,
        "scores": torch.arange(6.0),
        "responses": torch.nested.as_nested_tensor(pieces, layout=layout),
    }
    batch = FakeTensorDict(values, (6,))
    micro, indices = rearrange_micro_batches(batch, 12)
    assert sorted(i for ix in indices for i in ix) == list(range(6)) and len(micro) > 1
    for mb, ix in zip(micro, indices, strict=True):
        assert isinstance(mb, FakeTensorDict) and mb.batch_size == (len(ix),)
        assert torch.equal(mb["attention_mask"], mask[ix]) and torch.equal(mb["scores"], values["scores"][ix])
        nested = mb["responses"]
        assert nested.is_nested and nested.layout == layout
        assert [p.tolist() for p in nested.unbind()] == [pieces[i].tolist() for i in ix]
        assert int(mb["attention_mask"].sum()) <= 12
    assert batch.whole_indexings == 0  # the batch itself: its nested values were taken out first


def test_a_mapping_is_indexed_value_by_value_as_each_type_indexes():
    pieces, _ = _pieces(4, seed=1)
    batch = {"t": torch.arange(8).view(4, 2), "a": np.arange(4) * 10, "l": ["w", "x", "y", "z"],
             "u": ("p", "q", "r", "s"), "n": torch.nested.as_nested_tensor(pieces, layout=torch.jagged)}  # fmt: skip
    rows = [3, 0, 2]
    out = select_rows(batch, rows)
    assert type(out) is dict and list(out) == list(batch)
    assert torch.equal(out["t"], batch["t"][rows])
    assert out["a"].tolist() == [30, 0, 20]
    assert out["l"] == ["z", "w", "y"] and out["u"] == ["s", "p", "r"]
    assert [p.tolist() for p in out["n"].unbind()] == [pieces[i].tolist() for i in rows]
    none = select_rows({key: batch[key] for key in "tal"}, [])
    assert none["t"].shape == (0, 2) and none["a"].shape == (0,) and none["l"] == []


def test_a_value_of_no_row_type_is_refused_naming_its_key():
    with pytest.raises(SeqpackTypeError, match=r"batch\['meta'\] is a int: values must be tensors, arrays or lists"):
        select_rows({"x": torch.arange(3), "meta": 5}, [0, 1])


@pytest.mark.parametrize(
    ("mask", "got"),
    [
        (torch.ones(4, dtype=torch.int64), r"torch.Size\(\[4\]\)"),
        (torch.ones(2, 3, 4, dtype=torch.int64), r"torch.Size\(\[2, 3, 4\]\)"),
        ([[1, 1], [1, 0]], "list"),
        (torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged), "a nested tensor"),
    ],
    ids=["1-d", "3-d", "list", "nested"],
)
def test_a_mask_that_is_no_b_by_s_tensor_is_refused_naming_what_it_is(mask, got):
    with pytest.raises(SeqpackTypeError, match=rf"attention_mask must be a \[B, S\] tensor, got {got}"):
        row_lengths({"attention_mask": mask})
