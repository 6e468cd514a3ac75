"""Fuzz the verl drop-ins (``seqpack.interop.verl``) with batches as verl builds them and as a
careless caller does: random batch sizes and widths, masks with left padding and all-empty rows
(int, bool or float), nested ``input_ids`` (jagged or strided), extra tensor / array / list /
tuple values, and one fault at a time (a value of other rows, a 0-d tensor, a dict value, a
mask value other than 0 and 1); uids of several types for ``get_group_balanced_partitions``,
with unhashable and NaN ones.

The contract: accepted, with every sample in exactly one micro-batch (partition), no
micro-batch over ``max_token_len`` real tokens, each micro-batch's values the batch's rows
(checked against slow, obvious references: lengths counted token by token, rows picked one by
one, the fewest bins found by brute force); or one SeqpackError naming the value. With verl
0.9.1's ``force_group_size``, every micro-batch holds whole groups of consecutive rows."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.errors import SeqpackError
from seqpack.interop.verl import get_group_balanced_partitions, rearrange_micro_batches

MASK_DTYPES = (torch.int64, torch.int32, torch.bool, torch.float32)


# --- slow references --------------------------------------------------------------------------


def reference_lengths(batch: dict[str, Any]) -> list[int]:
    """Real tokens per row, one token at a time."""
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.is_nested:
        return [len(piece) for piece in ids.unbind()]
    return [sum(1 for x in row.tolist() if x == 1) for row in batch["attention_mask"]]


def fewest_bins(lengths: list[int], cap: int) -> int:
    """The fewest bins of ``cap`` that hold ``lengths`` (brute force over assignments; a
    lower bound past 8 rows)."""
    positive = sorted((s for s in lengths if s), reverse=True)
    bound = max(1, -(-sum(positive) // cap))
    if len(positive) > 8:
        return bound

    def fits(bins: list[int], i: int) -> bool:
        if i == len(positive):
            return True
        tried = set()
        for b, load in enumerate(bins):
            if load + positive[i] <= cap and load not in tried:
                tried.add(load)
                bins[b] += positive[i]
                if fits(bins, i + 1):
                    return True
                bins[b] -= positive[i]
        return False

    return next(k for k in itertools.count(bound) if fits([0] * k, 0))


def reference_rows(value: Any, rows: list[int]) -> Any:
    """``value`` at ``rows``, picked one by one."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        return [value.unbind()[i] for i in rows]
    if isinstance(value, torch.Tensor):
        return torch.stack([value[i] for i in rows])
    if isinstance(value, np.ndarray):
        return np.stack([value[i] for i in rows])
    return [value[i] for i in rows]


def same_rows(got: Any, want: Any) -> bool:
    if isinstance(got, torch.Tensor) and got.is_nested:
        pieces = got.unbind()
        return len(pieces) == len(want) and all(torch.equal(a, b) for a, b in zip(pieces, want, strict=True))
    if isinstance(got, torch.Tensor):
        return torch.equal(got, want)
    if isinstance(got, np.ndarray):
        return np.array_equal(got, want)
    return list(got) == want


# --- rearrange_micro_batches ------------------------------------------------------------------

FAULTS = ("short", "long", "scalar", "dict", "mask_value")


@st.composite
def verl_batches(draw):
    """``(batch, kwargs, fault)``: a verl-style batch, the other arguments, the one fault
    planted (``None``, or ``(kind, key)``)."""
    form = draw(st.sampled_from(["mask", "mask", "jagged", "strided"]))
    n = draw(st.integers(0 if form == "mask" else 1, 12))
    width = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(0, width), min_size=n, max_size=n))
    if draw(st.booleans()):  # all-empty rows, or a whole empty batch, are common enough
        lengths = [0 if draw(st.booleans()) else s for s in lengths]
    batch: dict[str, Any] = {}
    if form == "mask":
        mask = torch.zeros(n, width, dtype=torch.int64)
        for i, s in enumerate(lengths):
            left = draw(st.integers(0, width - s))
            mask[i, left : left + s] = 1
        batch["attention_mask"] = mask.to(draw(st.sampled_from(MASK_DTYPES)))
        batch["input_ids"] = torch.randint(0, 50, (n, width))
    else:
        layout = torch.jagged if form == "jagged" else torch.strided
        batch["input_ids"] = torch.nested.nested_tensor(
            [torch.arange(s) + 100 * i for i, s in enumerate(lengths)], layout=layout
        )
    extras = draw(st.lists(st.sampled_from(["tensor", "array", "list", "tuple", "matrix"]), max_size=3))
    for j, kind in enumerate(extras):
        key = f"{kind}{j}"
        batch[key] = {
            "tensor": torch.arange(n, dtype=torch.float32),
            "matrix": torch.arange(n * 3).reshape(n, 3),
            "array": np.arange(n) * 10,
            "list": [f"row{i}" for i in range(n)],
            "tuple": tuple(range(n)),
        }[kind]
    fault = None
    if draw(st.integers(0, 3)) == 0:  # one fault in four examples
        kind = draw(st.sampled_from(FAULTS if form == "mask" else FAULTS[:-1]))
        if kind == "mask_value":
            if not n:
                kind = "short"
            else:
                row, col = draw(st.integers(0, n - 1)), draw(st.integers(0, width - 1))
                odd = draw(st.sampled_from([2, -1, 0.5]))
                mask = batch["attention_mask"].to(torch.float32)
                mask[row, col] = odd
                batch["attention_mask"] = mask
                fault = ("mask_value", "attention_mask")
        if kind in ("short", "long") and (kind == "long" or n):
            rows = draw(st.integers(n + 1, n + 3)) if kind == "long" else draw(st.integers(0, n - 1))
            which = draw(st.sampled_from(["tensor", "array", "list"]))
            batch["bad"] = {"tensor": torch.zeros(rows), "array": np.zeros(rows), "list": [0] * rows}[which]
            fault = (kind, "bad")
        elif kind == "scalar":
            batch["bad"] = torch.tensor(3)
            fault = (kind, "bad")
        elif kind == "dict":
            batch["bad"] = {"a": 1}
            fault = (kind, "bad")
    kwargs = {"max_token_len": draw(st.integers(1, 2 * width + 2))}
    if draw(st.booleans()):
        kwargs["min_num_micro_batch"] = draw(st.integers(0, n + 2))
    if draw(st.booleans()):
        kwargs["num_batches_divided_by"] = draw(st.integers(1, 4))
    kwargs["use_dynamic_bsz_balance"] = draw(st.booleans())
    if draw(st.booleans()):
        kwargs["force_group_size"] = draw(st.integers(1, 3))
    return batch, kwargs, fault


def group_lengths(lengths: list[int], size: int) -> list[int]:
    """Tokens of each group of ``size`` consecutive rows."""
    return [sum(lengths[i : i + size]) for i in range(0, len(lengths), size)]


def round_up(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def refusal_words(batch, kwargs, fault) -> tuple[set[str], set[str]]:
    """``(must, may)``: what the answer must refuse over (any one named suffices) and what it
    may; each word is what the message must then contain."""
    must: set[str] = set()
    may: set[str] = set()
    if fault is not None:
        must.add("attention_mask" if fault[0] == "mask_value" else f"batch[{fault[1]!r}]")
    lengths = reference_lengths(batch) if fault is None or fault[0] != "mask_value" else None
    if lengths is None:
        return must, may
    cap, size = kwargs["max_token_len"], kwargs.get("force_group_size", 1)
    source = "attention_mask" if "attention_mask" in batch else "input_ids"
    if lengths and not any(lengths):
        must.add(f"{source} holds no real token")
        return must, may
    if len(lengths) % size:
        must.add("force_group_size")
        return must, may
    lengths = group_lengths(lengths, size)
    n = len(lengths)
    if n and max(lengths) > cap:
        must.add("max_token_len")
        return must, may
    least = kwargs.get("min_num_micro_batch") or 0
    multiple = kwargs.get("num_batches_divided_by") or 1
    lower = max(least, fewest_bins(lengths, cap)) if n else least
    if round_up(lower, multiple) > n:
        must.add("min_num_micro_batch")
    elif round_up(max(least, n), multiple) > n:
        may.add("min_num_micro_batch")  # the planner's count decides
    return must, may


def check_rearrange(batch, kwargs, fault) -> str:
    """One call against the contract; ``"ok"`` or ``"refused"``."""
    must, may = refusal_words(batch, kwargs, fault)
    try:
        micro_batches, indices = rearrange_micro_batches(batch, **kwargs)
    except SeqpackError as exc:
        message = str(exc)
        assert must or may, f"refused a valid batch: {message}"
        assert any(word in message for word in must | may), (must | may, message)
        return "refused"
    assert not must, f"accepted what must be refused for {must}"
    lengths = reference_lengths(batch)
    n, cap, size = len(lengths), kwargs["max_token_len"], kwargs.get("force_group_size", 1)
    assert sorted(itertools.chain.from_iterable(indices)) == list(range(n))  # every row exactly once
    assert all(rows and rows == sorted(rows) for rows in indices)
    assert all(sum(lengths[i] for i in rows) <= cap for rows in indices)
    for rows in indices:  # whole groups of consecutive rows
        assert rows == [g * size + j for g in sorted({r // size for r in rows}) for j in range(size)]
    count = len(indices)
    assert count == len(micro_batches) and count <= n // size
    assert count % (kwargs.get("num_batches_divided_by") or 1) == 0
    if n:
        groups = group_lengths(lengths, size)
        assert count >= max(kwargs.get("min_num_micro_batch") or 0, fewest_bins(groups, cap))
    for mb, rows in zip(micro_batches, indices, strict=True):
        assert set(mb) == set(batch)
        for key, value in batch.items():
            assert same_rows(mb[key], reference_rows(value, rows)), key
        if "attention_mask" in batch:
            assert int(mb["attention_mask"].to(torch.int64).sum()) <= cap
    return "ok"


@pytest.mark.slow
def test_rearrange_micro_batches_keeps_every_row_once_within_the_cap_or_names_the_value():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=150, deadline=None)
    @given(case=verl_batches())
    def run(case):
        batch, kwargs, fault = case
        outcomes[check_rearrange(batch, kwargs, fault)] += 1
        outcomes["fault" if fault else "clean"] += 1
        outcomes["nested" if batch["input_ids"].is_nested else "mask"] += 1
        outcomes["grouped" if kwargs.get("force_group_size", 1) > 1 else "rows"] += 1

    run()
    # Not vacuous: both answers, planted faults and clean batches, both input forms.
    kinds = ("ok", "refused", "fault", "clean", "nested", "mask", "grouped", "rows")
    assert min(outcomes[k] for k in kinds) > 0, outcomes


# --- get_group_balanced_partitions ------------------------------------------------------------


def uid_of(kind: str, value: int) -> Any:
    """The uid ``value`` spelt as ``kind``: each spelling of one value is one group."""
    return {
        "str": f"uid-{value}",
        "np.str_": np.str_(f"uid-{value}"),
        "int": value,
        "np.int64": np.int64(value),
        "tensor": torch.tensor(value),
        "tensor[1]": torch.tensor([value]),
        "array[1]": np.array([value]),
        "tuple": ("prompt", value),
    }[kind]


UID_KINDS = ("str", "np.str_", "int", "np.int64", "tensor", "tensor[1]", "array[1]", "tuple")
SAME_VALUE = ({"str", "np.str_"}, {"int", "np.int64", "tensor", "tensor[1]", "array[1]"}, {"tuple"})


def group_key(kind: str, value: int) -> tuple[int, int]:
    """Which reference group a uid belongs to: spellings that compare equal share it."""
    family = next(i for i, kinds in enumerate(SAME_VALUE) if kind in kinds)
    return family, value


def check_group_partitions(spelled, seqlens, k, fault, where) -> str:
    """One call against the contract; ``"ok"`` or ``"refused"``."""
    uids = [uid_of(kind, value) for kind, value in spelled]
    n = len(uids)
    lengths = seqlens[:n]
    if fault is not None:
        uids[where] = {"list": [1], "array[2]": np.array([1, 2]), "nan": float("nan"), "dict": {}}[fault]
    # The slow reference: groups by equality of the reference keys, pair by pair.
    keys = [group_key(kind, value) for kind, value in spelled]
    groups = {key: [i for i in range(n) if keys[i] == key] for key in keys}
    try:
        parts = get_group_balanced_partitions(lengths, uids, k)
    except SeqpackError as exc:
        message = str(exc)
        if fault is not None:
            assert f"uid_list[{where}]" in message, message
        else:
            assert len(groups) < k or len(groups) % k, f"refused a valid split: {message}"
            assert "k_partitions" in message, message
        return "refused"
    assert fault is None, f"accepted uid {uids[where]!r}"
    assert len(groups) >= k and len(groups) % k == 0
    assert len(parts) == k and sorted(itertools.chain.from_iterable(parts)) == list(range(n))
    assert all(p == sorted(p) for p in parts)
    where_of = {i: p for p, part in enumerate(parts) for i in part}
    for members in groups.values():
        assert len({where_of[i] for i in members}) == 1, f"group {members} split over partitions"
    assert [len({keys[i] for i in part}) for part in parts] == [len(groups) // k] * k
    return "ok"


@pytest.mark.slow
def test_group_partitions_keep_groups_whole_or_name_the_uid():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=150, deadline=None)
    @given(
        spelled=st.lists(st.tuples(st.sampled_from(UID_KINDS), st.integers(0, 5)), min_size=1, max_size=16),
        seqlens=st.lists(st.integers(0, 400), min_size=16, max_size=16),
        k=st.integers(1, 4),
        fault=st.sampled_from([None, None, None, "list", "array[2]", "nan", "dict"]),
        where=st.integers(0, 15),
    )
    def run(spelled, seqlens, k, fault, where):
        outcomes[check_group_partitions(spelled, seqlens, k, fault, where % len(spelled))] += 1
        outcomes["mixed spellings"] += len({kind for kind, _ in spelled}) > 1

    run()
    assert min(outcomes[k] for k in ("ok", "refused", "mixed spellings")) > 0, outcomes
