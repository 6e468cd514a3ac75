"""seqpack.interop.hf.to_hf's arguments, without a model: ``num_items_in_batch`` is a positive
count (an int or an integer scalar tensor, as Hugging Face's Trainer passes it) or refused
with one error naming the value."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.interop.hf import to_hf
from seqpack.thd import pack_sequences


def _batch():
    return pack_sequences([{"input_ids": torch.arange(1, 6)}, {"input_ids": torch.arange(1, 4)}], pad_multiple=4)


@pytest.mark.parametrize(
    "value, error, shown",
    [
        (0, ConfigError, "0"),
        (-3, ConfigError, "-3"),
        ("12", SeqpackTypeError, "'12'"),
        (12.0, SeqpackTypeError, "12.0"),
        (True, SeqpackTypeError, "True"),
        ([12], SeqpackTypeError, "[12]"),
        (np.float64(12.0), SeqpackTypeError, "12.0"),
        (torch.tensor(12.0), SeqpackTypeError, "torch.float32"),
        (torch.tensor(True), SeqpackTypeError, "torch.bool"),
        (torch.tensor([12]), SeqpackTypeError, "shape (1,)"),
        (torch.tensor(0), ConfigError, "tensor(0)"),
        (torch.tensor(-5), ConfigError, "tensor(-5)"),
    ],
)
def test_num_items_in_batch_must_be_a_positive_count(value, error, shown):
    with pytest.raises(error, match=rf"^to_hf: num_items_in_batch must be .*{re.escape(shown)}"):
        to_hf(_batch(), num_items_in_batch=value)


def test_positive_counts_pass_through_and_a_tensor_is_read_only_with_check():
    batch = _batch()
    assert to_hf(batch, num_items_in_batch=7)["num_items_in_batch"] == 7
    assert type(to_hf(batch, num_items_in_batch=np.int64(7))["num_items_in_batch"]) is int
    count = torch.tensor(7)
    assert to_hf(batch, num_items_in_batch=count)["num_items_in_batch"] is count  # the Trainer's, on its device
    # check=False reads no tensor value (no host sync); its type and shape are still checked.
    zero = torch.tensor(0)
    assert to_hf(batch, num_items_in_batch=zero, check=False)["num_items_in_batch"] is zero
    with pytest.raises(SeqpackTypeError, match="num_items_in_batch"):
        to_hf(batch, num_items_in_batch=torch.tensor([1, 2]), check=False)
    with pytest.raises(ConfigError, match=r"num_items_in_batch must be .*got 0"):
        to_hf(batch, num_items_in_batch=0, check=False)
    assert "num_items_in_batch" not in to_hf(batch)
