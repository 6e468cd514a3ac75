"""The sample contract (seqpack.thd.sample): accepted keys, dtypes and the errors for the rest."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX
from seqpack.thd import SAMPLE_DTYPES, normalize_sample, pack_sequences, sample_sequences

WHERE = "sample 4 of this rank's data"
INT_TORCH = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64]
INT_NUMPY = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def test_dtypes_of_the_contract():
    assert dict(SAMPLE_DTYPES) == {
        "input_ids": torch.int64,
        "labels": torch.int64,
        "loss_mask": torch.float32,
        "position_ids": torch.int64,
    }


@pytest.mark.parametrize("key", ["input_ids", "labels", "position_ids"])
@pytest.mark.parametrize("dtype", INT_TORCH + INT_NUMPY + ["list", "tuple"])
@pytest.mark.slow
def test_integer_fields_accept_every_integer_dtype(key, dtype):
    values = [0, 7, 100, 65535 if dtype not in (torch.int8, torch.int16, np.int8, np.int16) else 9]
    if dtype in (torch.uint8, np.uint8, torch.int8, np.int8):
        values[-1] = 9
    if dtype == "list":
        value = list(values)
    elif dtype == "tuple":
        value = tuple(values)
    elif isinstance(dtype, torch.dtype):
        value = torch.tensor(values, dtype=dtype)
    else:
        value = np.array(values, dtype=dtype)
    sample = {"input_ids": torch.arange(4), key: value}
    out = normalize_sample(sample, where=WHERE)
    assert out[key].dtype == torch.int64 and out[key].tolist() == values


def test_int64_tensors_pass_uncopied_and_other_keys_are_dropped():
    ids = torch.arange(5)
    out = normalize_sample({"input_ids": ids, "attention_mask": "ignored", "labels": None})
    assert out["input_ids"] is ids and list(out) == ["input_ids"]


@pytest.mark.parametrize(
    "make", [lambda v: np.array(v, dtype=np.uint64), lambda v: torch.tensor(v, dtype=torch.uint64)]
)
def test_uint64_past_int64_is_an_error(make):
    fits = normalize_sample({"input_ids": make([1, INT64_MAX])})
    assert fits["input_ids"].tolist() == [1, INT64_MAX]
    with pytest.raises(
        SampleError, match=rf"{WHERE}: 'labels' holds {INT64_MAX + 1} at token 1, which does not fit int64"
    ):
        normalize_sample({"input_ids": torch.arange(2), "labels": make([3, INT64_MAX + 1])}, where=WHERE)


def test_python_ints_past_int64_in_a_list_are_an_error():
    for values, bad in (([1, 2**63], 2**63), ([2**64, 1], 2**64), ([3, -(2**63) - 1], -(2**63) - 1)):
        with pytest.raises(
            SampleError, match=rf"{WHERE}: 'input_ids' holds {bad} at token \d, which does not fit int64"
        ):
            normalize_sample({"input_ids": values}, where=WHERE)
    # A list that is really fractional stays a dtype error, never truncated.
    floats = r"'labels' must hold integers, got a list of Python floats \(0.5 at token 1\)"
    with pytest.raises(SeqpackTypeError, match=floats):
        normalize_sample({"input_ids": [1, 2], "labels": [1, 0.5]}, where=WHERE)


@pytest.mark.parametrize("key", ["input_ids", "labels", "position_ids"])
@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([1.0, 2.0, 3.0]),  # integral floats too: the dtype is the mistake
        torch.tensor([0.7, 1.5, 2.0]),  # fractional labels must never be truncated
        np.array([1.0, 2.0, 3.0]),
        [0.7, 1.0, 2.0],
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.tensor([1, 2, 3], dtype=torch.complex64),
    ],
)
@pytest.mark.slow
def test_integer_fields_refuse_floats_bools_and_complex(key, value):
    sample = {"input_ids": torch.arange(3), key: value}
    message = rf"{WHERE}: '{key}' must hold integers, got (dtype|a list of Python floats)"
    with pytest.raises(SeqpackTypeError, match=message):
        normalize_sample(sample, where=WHERE)


@pytest.mark.parametrize(
    "value, expected",
    [
        (torch.tensor([True, False, True]), [1.0, 0.0, 1.0]),
        (torch.tensor([1, 0, 1], dtype=torch.uint8), [1.0, 0.0, 1.0]),
        (np.array([0.5, 1.0, 0.0], dtype=np.float16), [0.5, 1.0, 0.0]),
        (torch.tensor([0.25, 1.0, 0.0], dtype=torch.bfloat16), [0.25, 1.0, 0.0]),
        (np.array([1, 0, 2], dtype=np.uint32), [1.0, 0.0, 2.0]),
        ([0.5, 0.5, 1], [0.5, 0.5, 1.0]),
    ],
)
def test_loss_mask_accepts_real_dtypes(value, expected):
    out = normalize_sample({"input_ids": torch.arange(3), "loss_mask": value})
    assert out["loss_mask"].dtype == torch.float32 and out["loss_mask"].tolist() == expected


@pytest.mark.parametrize(
    "value, match",
    [
        (torch.tensor([1.0, float("nan"), 0.0]), r"'loss_mask' must be finite, got nan at token 1"),
        (np.array([1.0, 0.0, np.inf]), r"'loss_mask' must be finite, got inf at token 2"),
        (
            np.array([1e300, 0.0, 1.0]),
            r"'loss_mask' must be finite, got 1e\+300 at token 0 \(dtype torch.float64\)",
        ),  # inf as float32
    ],
)
def test_loss_mask_must_be_finite(value, match):
    with pytest.raises(SampleError, match=rf"{WHERE}: {match}"):
        normalize_sample({"input_ids": torch.arange(3), "loss_mask": value}, where=WHERE)


def test_loss_mask_refuses_non_numbers():
    with pytest.raises(SeqpackTypeError, match="'loss_mask' must hold real numbers, got dtype torch.complex64"):
        normalize_sample({"input_ids": torch.arange(2), "loss_mask": torch.ones(2, dtype=torch.complex64)})
    with pytest.raises(SeqpackTypeError, match="'loss_mask' must hold numbers, got dtype <U1"):
        normalize_sample({"input_ids": torch.arange(2), "loss_mask": ["a", "b"]})


@pytest.mark.parametrize(
    "sample, error, match",
    [
        ([1, 2], SeqpackTypeError, rf"{WHERE} must be a mapping of 1-D tensors, got list"),
        (
            {"tokens": [1], "loss_mask": [1]},
            SampleError,
            rf"{WHERE} has no 'input_ids' \(keys: \['loss_mask', 'tokens'\]\)",
        ),
        (
            {"input_ids": None},
            SampleError,
            rf"{WHERE} has 'input_ids' set to None \(a 1-D tensor of token ids is needed\)",
        ),
        ({"input_ids": 5}, SeqpackTypeError, r"'input_ids' must be a 1-D tensor, numpy array or list, got int"),
        ({"input_ids": "abc"}, SeqpackTypeError, r"got str"),
        (
            {"input_ids": torch.ones(2, 2, dtype=torch.long)},
            SampleError,
            r"'input_ids' must be 1-D, got shape \(2, 2\)",
        ),
        ({"input_ids": np.array(3)}, SampleError, r"must be 1-D, got shape \(\)"),
        (
            {"input_ids": torch.arange(3), "labels": torch.arange(2)},
            SampleError,
            rf"{WHERE}: 'labels' has 2 tokens but 'input_ids' has 3",
        ),
        (
            {"input_ids": torch.arange(3), "loss_mask": [1.0] * 4},
            SampleError,
            "'loss_mask' has 4 tokens but 'input_ids' has 3",
        ),
    ],
)
def test_bad_samples_name_the_sample_and_key(sample, error, match):
    with pytest.raises(error, match=match):
        normalize_sample(sample, where=WHERE)


def test_errors_are_value_and_type_errors():
    # Old callers catch ValueError (the wrapper) or TypeError (pack_sequences): both still work.
    with pytest.raises(ValueError):
        normalize_sample({"input_ids": torch.tensor([1.0])})
    with pytest.raises(TypeError):
        normalize_sample({"input_ids": torch.tensor([1.0])})


def test_zero_length_is_valid_here_but_not_for_packing():
    assert normalize_sample({"input_ids": []})["input_ids"].dtype == torch.int64
    with pytest.raises(SampleError, match="sample 1 has a zero-length sequence"):
        pack_sequences([{"input_ids": [1]}, {"input_ids": []}])


@given(
    values=st.lists(st.integers(0, 65535), min_size=1, max_size=20),
    dtype=st.sampled_from([np.uint16, np.uint32, np.int32, np.int64, torch.int32, torch.uint16, "list"]),
)
@pytest.mark.slow
def test_packing_tokenizer_dtypes_gives_the_same_batch_as_int64(values, dtype):
    if dtype == "list":
        ids = values
    elif isinstance(dtype, torch.dtype):
        ids = torch.tensor(values, dtype=dtype)
    else:
        ids = np.array(values, dtype=dtype)
    got = pack_sequences([{"input_ids": ids}, {"input_ids": torch.tensor([5, 6])}], pad_multiple=4)
    ref = pack_sequences([{"input_ids": torch.tensor(values)}, {"input_ids": torch.tensor([5, 6])}], pad_multiple=4)
    assert torch.equal(got.input_ids, ref.input_ids) and torch.equal(got.labels, ref.labels)


def test_pack_sequences_applies_the_contract():
    with pytest.raises(SeqpackTypeError, match=r"sample 1: 'labels' must hold integers, got dtype torch.float32"):
        pack_sequences([{"input_ids": [1, 2]}, {"input_ids": [3, 4], "labels": torch.tensor([0.7, 1.0])}])
    with pytest.raises(SampleError, match=r"sample 0: 'loss_mask' must be finite, got nan at token 1"):
        pack_sequences([{"input_ids": [1, 2], "loss_mask": [1.0, float("nan")]}])
    batch = pack_sequences([{"input_ids": np.array([3, 4], dtype=np.uint16), "loss_mask": [True, False]}])
    assert batch.input_ids.tolist() == [3, 4] and batch.loss_mask.tolist() == [1.0, 0.0]


def test_sample_sequences_splits_pre_packed_samples_after_normalising():
    packed = {
        "input_ids": np.array([1, 2, 3, 0, 4, 5], dtype=np.uint32),
        "loss_mask": torch.tensor([1, 1, 0, 0, 1, 1]),
        "cu_seqlens": torch.tensor([0, 3, 5]),
        "cu_seqlens_padded": torch.tensor([0, 4, 6]),
    }
    parts = sample_sequences(packed, where=WHERE)
    assert [p["input_ids"].tolist() for p in parts] == [[1, 2, 3], [4, 5]]
    assert all(p["input_ids"].dtype == torch.int64 and p["loss_mask"].dtype == torch.float32 for p in parts)
    assert sample_sequences({"input_ids": [7, 8]})[0]["input_ids"].tolist() == [7, 8]
    bad = {**packed, "cu_seqlens": torch.tensor([0.0, 3.0, 5.0])}
    with pytest.raises(SampleError, match=rf"{WHERE} is pre-packed with a bad layout: cu_seqlens must hold integers"):
        sample_sequences(bad, where=WHERE)
    with pytest.raises(SampleError, match=r"pre-packed with a bad layout: cu_seqlens_padded ends at 9"):
        sample_sequences({**packed, "cu_seqlens_padded": torch.tensor([0, 4, 9])}, where=WHERE)


# --- friction: batches where samples belong, dtypes named as given -----------------------------


def test_a_collated_batch_says_give_samples_not_batches():
    from seqpack.thd.sample import SAMPLES_NOT_BATCHES

    assert SAMPLES_NOT_BATCHES == "give seqpack samples, not batches: DataLoader(batch_size=None)"
    with pytest.raises(SampleError) as info:
        normalize_sample({"input_ids": torch.zeros(8, 527, dtype=torch.long)}, where=WHERE)
    assert str(info.value) == (
        f"{WHERE}: 'input_ids' must be 1-D, got shape (8, 527) (a collated batch of 8 rows? {SAMPLES_NOT_BATCHES})"
    )
    with pytest.raises(SampleError, match=r"got shape \(1, 5\) \(one row with a batch dim, .*take row \[0\]\)"):
        normalize_sample({"input_ids": torch.zeros(1, 5, dtype=torch.long)}, where=WHERE)
    batched = rf"'labels' must be 1-D, got shape \(4, 3\) .*{re.escape(SAMPLES_NOT_BATCHES)}"
    with pytest.raises(SampleError, match=batched):
        pack_sequences([{"input_ids": torch.arange(3), "labels": torch.zeros(4, 3, dtype=torch.long)}])


def test_a_float32_labels_column_is_reported_as_what_arrives():
    datasets = pytest.importorskip("datasets")
    column = [np.array([1.0, 2.0, 3.0], dtype=np.float32)]
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": column})
    assert ds.features["labels"].feature.dtype == "float32"
    # The default format gives Python floats: say so, never the float64 numpy would make of them.
    with pytest.raises(SeqpackTypeError) as info:
        normalize_sample(ds[0], where=WHERE)
    assert "got a list of Python floats (1.0 at token 0)" in str(info.value) and "float64" not in str(info.value)
    # numpy and torch formats keep the column's own dtype, and the message names it.
    for fmt in ("numpy", "torch"):
        with pytest.raises(SeqpackTypeError, match=r"'labels' must hold integers, got dtype torch.float32$"):
            normalize_sample(ds.with_format(fmt)[0], where=WHERE)


# --- labels: alignment, the copied-labels guard, loss tokens -----------------------------------


def _hf_sample(length, prompt, seed=0):
    """An HF-style sample: labels are input_ids with -100 on the prompt (no token repeats)."""
    ids = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))[:length] + 1
    labels = ids.clone()
    labels[:prompt] = -100
    return {"input_ids": ids, "labels": labels}


def test_next_token_targets_moves_unshifted_labels_and_masks_left_within_each_sequence():
    from seqpack.thd.sample import default_labels, next_token_targets

    ids = torch.tensor([5, 6, 7, 8, 9])  # two sequences: [5, 6, 7] and [8, 9]
    last = torch.tensor([2, 4])
    assert default_labels(ids, last, "shifted").tolist() == [6, 7, -100, 9, -100]
    assert default_labels(ids, last, "unshifted").tolist() == [5, 6, 7, 8, 9]
    hf = torch.tensor([-100, 6, 7, -100, 9])
    mask = torch.tensor([1.0, 0.5, 1.0, 1.0, 0.25])
    labels, loss_mask = next_token_targets(hf, mask, last, "unshifted")
    assert labels.tolist() == [6, 7, -100, 9, -100]
    assert loss_mask.tolist() == [0.5, 1.0, 0.0, 0.25, 0.0]
    labels, loss_mask = next_token_targets(labels, None, last, "shifted")
    assert labels.tolist() == [6, 7, -100, 9, -100] and loss_mask.tolist() == [1, 1, 0, 1, 0]
    # A mask is 0 wherever the label is -100, whatever it said.
    _, loss_mask = next_token_targets(torch.tensor([1, -100, 3]), torch.ones(3), torch.tensor([2]), "shifted")
    assert loss_mask.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(
        ValueError, match=r"label_format must be one of \('shifted', 'unshifted', 'position_aligned'\), got 'hf'"
    ):
        next_token_targets(hf, None, last, "hf")


def test_shifted_labels_that_copy_input_ids_are_refused_naming_label_format():
    from seqpack.thd.sample import check_label_format

    sample = normalize_sample(_hf_sample(40, prompt=10))
    with pytest.raises(SampleError) as info:
        check_label_format(sample, "shifted", where=WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: labels equal input_ids on 30 of 30 supervised tokens")
    assert "label_format='shifted'" in message and "pass label_format='unshifted'" in message
    check_label_format(sample, "unshifted", where=WHERE)  # declared: fine
    with pytest.raises(SampleError, match=r"sample 1: labels equal input_ids on 30 of 30 .*label_format="):
        pack_sequences([{"input_ids": torch.arange(1, 9)}, sample])
    pack_sequences([{"input_ids": torch.arange(1, 9)}, sample], label_format="unshifted")


@pytest.mark.parametrize("token", [3, 0])
def test_next_token_labels_are_never_copies_even_on_a_run_of_one_token(token):
    from seqpack.thd.sample import check_label_format, label_alignment_counts

    ids = torch.full((64,), token)
    labels = torch.cat([ids[1:], torch.tensor([-100])])  # next-token labels equal input_ids everywhere
    checked, misaligned = label_alignment_counts(ids, labels, None, np.array([0, 64]))
    assert (checked.tolist(), misaligned.tolist()) == ([0], [0])  # each label fits either alignment
    check_label_format({"input_ids": ids, "labels": labels}, "shifted")
    pack_sequences([{"input_ids": ids, "labels": labels}])


def test_count_loss_tokens_is_what_the_sample_adds_to_a_pack():
    from seqpack.thd.sample import count_loss_tokens

    samples = [
        {"input_ids": torch.arange(1, 6)},
        _hf_sample(12, prompt=4, seed=1),
        {**_hf_sample(9, prompt=0, seed=2), "loss_mask": torch.tensor([1.0, 1, 0, 1, 1, 0.5, 1, 1, 0])},
    ]
    for fmt in ("shifted", "unshifted"):
        counts = [count_loss_tokens(normalize_sample(s), fmt) for s in samples[:1]]
        assert counts == [4]
    counts = [count_loss_tokens(normalize_sample(s), "unshifted") for s in samples]
    # 5 tokens: 4 targets; 12 with a 4-token prompt: 8 (the first answer token is predicted
    # from the last prompt token); 9 tokens: 8 targets, of which the mask zeroes tokens 2 and 8.
    assert counts == [4, 8, 6]
    assert sum(counts) == pack_sequences(samples, pad_multiple=4, label_format="unshifted").num_loss_tokens
    assert count_loss_tokens(normalize_sample({"input_ids": []})) == 0
