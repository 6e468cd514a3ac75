"""pack_sequences refuses arguments of the wrong kind naming them (samples, mrope, sample_ids,
a pack past int32's cu_seqlens); a pre-packed sample's offsets as a collate nests them split as
flat ones, and its shifted sequences end without a target, loss mask included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.thd import IGNORE_INDEX, pack_sequences, sample_sequences, split_packed_sample

SAMPLES = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]


@pytest.mark.parametrize("samples", [{"input_ids": [1, 2]}, "ids", iter(SAMPLES)])
def test_samples_that_are_no_list_are_refused_naming_their_type(samples):
    with pytest.raises(
        SeqpackTypeError, match=rf"samples must be a list of sample mappings, got {type(samples).__name__}"
    ):
        pack_sequences(samples)


def test_an_mrope_that_is_no_spec_is_refused_naming_its_type():
    with pytest.raises(SeqpackTypeError, match=r"mrope must be an MRopeSpec \(MRopeSpec.from_hf\(config\)\), got dict"):
        pack_sequences(SAMPLES, mrope={"model_type": "qwen2_vl"})


@pytest.mark.parametrize(
    ("sample_ids", "error", "match"),
    [
        (torch.tensor([0.0, 1.0]), ConfigError, r"sample_ids must hold integers, got dtype torch.float32"),
        (torch.tensor([True, False]), ConfigError, r"sample_ids must hold integers, got dtype torch.bool"),
        ([[1], [1, 2]], SeqpackTypeError, r"sample_ids must hold integers \(int64\), got \[\[1\], \[1, 2\]\]"),
        (["a", "b"], SeqpackTypeError, r"sample_ids must hold integers \(int64\), got \['a', 'b'\]"),
        (np.array([1, 2**63], dtype=np.uint64), ConfigError, r"sample_ids holds 9223372036854775808, which does not"),
    ],
)  # fmt: skip
def test_sample_ids_that_are_no_int64s_are_refused_naming_them(sample_ids, error, match):
    with pytest.raises(error, match=match):
        pack_sequences(SAMPLES, sample_ids=sample_ids)


def test_sample_ids_of_any_integer_type_are_kept_as_int64():
    for ids in (torch.tensor([7, 9], dtype=torch.int32), np.array([7, 9], dtype=np.uint64), [7, 9]):
        assert pack_sequences(SAMPLES, sample_ids=ids).sample_ids.tolist() == [7, 9]


def test_a_pack_past_int32_cu_seqlens_is_refused_naming_its_size():
    with pytest.raises(
        ConfigError, match=r"a pack of 4294967294 tokens is too large: cu_seqlens are int32 .*pad_multiple"
    ):
        pack_sequences(SAMPLES, pad_multiple=2**31 - 1)


def test_offsets_nested_as_a_collate_gives_them_split_as_flat_ones():
    sample = {"input_ids": torch.arange(6)}
    nested = split_packed_sample({**sample, "cu_seqlens": [[0, 2, 6]], "cu_seqlens_padded": ([0, 2, 6],)})
    flat = split_packed_sample({**sample, "cu_seqlens": [0, 2, 6]})
    assert (
        [s["input_ids"].tolist() for s in nested] == [s["input_ids"].tolist() for s in flat] == [[0, 1], [2, 3, 4, 5]]
    )


def test_a_prepacked_sample_whose_ids_are_not_1d_is_refused():
    with pytest.raises(SampleError, match=r"needs 'input_ids' as a 1-D tensor \(normalize_sample it first\)"):
        split_packed_sample({"input_ids": torch.arange(6).view(2, 3), "cu_seqlens": [0, 3]})


def test_shifted_sequences_of_a_prepacked_sample_end_without_a_target():
    sample = {
        "input_ids": [1, 2, 3, 4, 5, 6],
        "labels": [2, 3, 4, 5, 6, 7],
        "loss_mask": [1] * 6,
        "cu_seqlens": [0, 3, 6],
    }
    shifted = sample_sequences(sample)
    assert [s["labels"].tolist() for s in shifted] == [[2, 3, IGNORE_INDEX], [5, 6, IGNORE_INDEX]]
    assert [s["loss_mask"].tolist() for s in shifted] == [[1, 1, 0], [1, 1, 0]]
    unshifted = sample_sequences(sample, label_format="unshifted")  # HF labels need no cut
    assert [s["labels"].tolist() for s in unshifted] == [[2, 3, 4], [5, 6, 7]]
    assert [s["loss_mask"].tolist() for s in unshifted] == [[1, 1, 1], [1, 1, 1]]
