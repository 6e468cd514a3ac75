"""The group_id sample field where it is read: accepted forms, refusals named by sample, a
pool mixing grouped and ungrouped samples, and the gather columns it fills."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.errors import SampleError
from seqpack.loader.grouping import GROUP_KEY, group_columns, group_id_of
from seqpack.loader.iterator import wrap_data_iterator
from seqpack.loader.phases import Reader, key_mask
from seqpack.topology import Topology


@pytest.mark.parametrize(
    "value, expected",
    [(7, 7), (np.int32(-3), -3), (torch.tensor(5), 5), (torch.tensor([9]), 9), (np.array([2**62]), 2**62)],
)
def test_group_id_forms(value, expected):
    assert group_id_of({"input_ids": [1], "group_id": value}, "s") == expected
    assert group_id_of({"input_ids": [1]}, "s") is None


@pytest.mark.parametrize("value", [1.5, True, "a", torch.tensor([1, 2]), torch.tensor(1.0), 2**63, None])
def test_group_id_refusals_name_the_sample(value):
    with pytest.raises(SampleError, match=r"sample 4: group_id must be one integer"):
        group_id_of({"input_ids": [1], "group_id": value}, "sample 4")


def test_reader_keeps_group_id_beside_the_tokens_and_mixed_pools_are_fine():
    data = [{"input_ids": [1, 2, 3], "group_id": 11}, {"input_ids": [4, 5]}, {"input_ids": [6], "group_id": 11}]
    read = Reader(data).read(3)
    assert [GROUP_KEY in s for s in read.samples] == [True, False, True]
    key_mask(read.samples)  # group_id is not a token key: no "different keys" error
    grouped, ids = group_columns(read.samples)
    assert grouped.tolist() == [1, 0, 1] and ids.tolist() == [11, 0, 11]


def test_bad_group_id_fails_the_step_naming_the_sample():
    data = [{"input_ids": list(range(1, 6)), "group_id": i // 2} for i in range(6)]
    data[3]["group_id"] = 1.5
    it = wrap_data_iterator(iter(data), Topology.single(), samples_per_rank=6, max_tokens_per_rank=64, prefetch=0)
    with pytest.raises(ValueError, match=r"sample 3 of this rank.s data .*group_id must be one integer .*, got 1.5"):
        next(it)


def test_groups_on_one_rank_run_and_to_origin_returns_everything():
    data = [{"input_ids": list(range(1, 4 + i)), "group_id": i % 3} for i in range(9)]
    it = wrap_data_iterator(iter(data), Topology.single(), samples_per_rank=9, max_tokens_per_rank=32, prefetch=0,
                            group_microbatch=True)  # fmt: skip
    step = next(it)
    back = step.to_origin([mb.input_ids for mb in step.microbatches])
    assert [b.tolist() for b in back] == [d["input_ids"] for d in data]
    micro = step.schedule.placement()[1]
    for g in range(3):  # each group (<= 32 tokens) in one microbatch
        assert len(set(micro[[i for i in range(9) if i % 3 == g]].tolist())) == 1
