"""Fuzz offline packing (seqpack.packing): random lengths and rows keep the invariants (every
sequence in exactly one pack, no pack over max_tokens, never fewer packs than the token
bound), and hostile arguments get a SeqpackError naming them (hostile.check_answer)."""

from __future__ import annotations

import numpy as np
import pytest
from hostile import Target, spoil_one
from hypothesis import given, settings
from hypothesis import strategies as st

import seqpack
from seqpack.errors import SeqpackError
from seqpack.packing import pack_lengths

TARGETS = [
    Target(
        "pack_lengths",
        pack_lengths,
        lambda: {"lengths": [3, 5, 2], "max_tokens": 8},
        {"lengths": "any", "max_tokens": "int"},
        aliases={"lengths": ("length", "sequence")},
    ),
    Target(
        "pack_dataset",
        seqpack.pack_dataset,
        lambda: {"rows": [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}], "max_tokens": 8},
        {"rows": "any", "max_tokens": "int", "label_format": "str", "on_oversize": "str", "progress": "opt_bool"},
        aliases={"rows": ("row", "input_ids", "dataset")},
    ),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.slow
def test_hostile_arguments_are_refused_by_name(target, data):
    spoil_one(target, data)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(-2, 300), max_size=50), max_tokens=st.integers(1, 400))
@pytest.mark.slow
def test_pack_lengths_invariants_or_a_named_refusal(lengths, max_tokens):
    try:
        packing = pack_lengths(lengths, max_tokens)
    except SeqpackError as exc:
        assert "sequence" in str(exc) and (min(lengths) < 1 or max(lengths) > max_tokens)
        return
    assert sorted(packing.order.tolist()) == list(range(len(lengths)))
    assert all(0 <= k < packing.num_packs for k in packing.pack_of.tolist())
    sums = np.bincount(packing.pack_of, np.asarray(lengths, dtype=np.float64), packing.num_packs)
    assert (sums <= max_tokens).all() and packing.num_packs >= packing.token_bound


row = st.integers(0, 30).flatmap(
    lambda n: st.fixed_dictionaries(
        {"input_ids": st.lists(st.integers(0, 50_000), min_size=n, max_size=n)},
        optional={"completion_mask": st.lists(st.integers(0, 1), min_size=n, max_size=n)},
    )
)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(row, max_size=30),
    max_tokens=st.integers(1, 60),
    label_format=st.sampled_from(["shifted", "unshifted", "position_aligned"]),
    on_oversize=st.sampled_from(["error", "truncate", "drop"]),
)
@pytest.mark.slow
def test_pack_dataset_invariants_or_a_named_refusal(rows, max_tokens, label_format, on_oversize):
    try:
        packed = seqpack.pack_dataset(rows, max_tokens, label_format=label_format, on_oversize=on_oversize)
    except SeqpackError as exc:
        assert on_oversize == "error" and "max_tokens" in str(exc)
        return
    seen = []
    for out in packed:
        total = out["input_ids"].shape[0]
        assert 0 < total <= max_tokens and out["cu_seqlens"][-1] == total
        assert ((out["labels"] == -100) == (out["loss_mask"] == 0)).all()
        for k, i in enumerate(out["sample_ids"].tolist()):
            a, b = int(out["cu_seqlens"][k]), int(out["cu_seqlens"][k + 1])
            assert out["input_ids"][a:b].tolist() == rows[i]["input_ids"][: b - a]
            assert out["position_ids"][a:b].tolist() == list(range(b - a))
            seen.append(i)
    expected = [
        i for i, r in enumerate(rows) if r["input_ids"] and (on_oversize != "drop" or len(r["input_ids"]) <= max_tokens)
    ]
    assert sorted(seen) == expected


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(row, min_size=1, max_size=24),
    group=st.integers(1, 4),
    gap=st.integers(0, 3),
    max_tokens=st.integers(1, 60),
    label_format=st.sampled_from(["shifted", "unshifted"]),
)
@pytest.mark.slow
def test_prepacked_rows_pack_as_their_sequences_on_both_paths(rows, group, gap, max_tokens, label_format):
    datasets = pytest.importorskip("datasets")
    rows = [{"input_ids": r["input_ids"], "completion_mask": r.get("completion_mask", [1] * len(r["input_ids"]))}
            for r in rows]  # fmt: skip
    prepacked = []  # rows [g * group, (g + 1) * group) as one row, `gap` pad tokens after each sequence
    for g in range(0, len(rows), group):
        members = rows[g : g + group]
        ids, mask, cu, padded = [], [], [0], [0]
        for m in members:
            ids += m["input_ids"] + [0] * gap
            mask += m["completion_mask"] + [0] * gap
            cu.append(cu[-1] + len(m["input_ids"]))
            padded.append(len(ids))
        prepacked.append({"input_ids": ids, "completion_mask": mask, "cu_seqlens": cu, "cu_seqlens_padded": padded})
    kwargs = dict(label_format=label_format, on_oversize="truncate")
    want = seqpack.pack_dataset(rows, max_tokens, **kwargs)
    for got in (
        seqpack.pack_dataset(prepacked, max_tokens, **kwargs),
        seqpack.pack_dataset(datasets.Dataset.from_list(prepacked), max_tokens, **kwargs),
    ):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert [i // group for i in w["sample_ids"].tolist()] == list(g["sample_ids"])
            for key in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "seq_lengths"):
                assert list(g[key]) == w[key].tolist(), key
