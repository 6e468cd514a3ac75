import numpy as np
import pytest
from sched_reference import megatron_groups_reference

from seqpack.schedulers import get_scheduler
from seqpack.schedulers.dp_balanced import megatron_groups


def test_next_fit_in_dataloader_order_then_replica_major_interleave():
    # capacity 10: groups [0,1] [2] [3,4] [5] -> 4 groups, dp=2 -> microbatch i of replica j
    # is group i*2 + j.
    lengths = np.array([4, 5, 9, 3, 7, 8])
    s = get_scheduler("dp_balanced").schedule(lengths, dp_size=2, max_tokens_per_rank=10)
    s.validate()
    assert [[ids.tolist() for ids in row] for row in s.assignment] == [[[0, 1], [2]], [[3, 4], [5]]]


def test_split_from_the_back_to_a_multiple_of_dp():
    # 3 groups [0,1,2] [3,4] [5,6,7] with dp=4 -> 1 more: pop 7 off the last group.
    lengths = np.array([3, 3, 3, 5, 4, 2, 2, 2])
    groups = [g.tolist() for row in megatron_groups(lengths, 10, 4) for g in row]
    assert groups == [[0, 1, 2], [3, 4], [5, 6], [7]]
    # dp=8 needs 5 more: last group gives 7 and 6 (down to one), then the middle gives 4,
    # then the walk reaches group 0, which Megatron would refuse (assert i > 0).
    groups = [g.tolist() for row in megatron_groups(lengths, 10, 8) for g in row]
    assert groups == [[0], [3], [5], [7], [6], [4], [2], [1]]
    assert groups == megatron_groups_reference(lengths.tolist(), 10, 8)


def test_fewer_sequences_than_replicas_get_empty_microbatches():
    s = get_scheduler("dp_balanced").schedule([5, 6, 7], dp_size=4, max_tokens_per_rank=32)
    s.validate()
    assert s.num_microbatches == 1
    assert [ids.tolist() for ids in s.assignment[0]] == [[0], [2], [1], []]


def test_uses_padded_lengths_and_cp_capacity():
    # pad_multiple 4 turns 5 into 8: with capacity 2*8=16 only two fit per group.
    lengths = np.array([5, 5, 5, 5])
    s = get_scheduler("dp_balanced").schedule(lengths, dp_size=1, cp_size=2, max_tokens_per_rank=8, pad_multiple=4)
    s.validate()
    assert [row[0].tolist() for row in s.assignment] == [[0, 1], [2, 3]]


def test_vpp_multiple():
    lengths = np.full(10, 6)
    s = get_scheduler("dp_balanced", microbatch_multiple=4).schedule(lengths, dp_size=2, max_tokens_per_rank=12)
    s.validate()
    assert s.num_microbatches == 4  # 5 groups split to 8 = 2 replicas x 4 microbatches
    with pytest.raises(ValueError, match="microbatch_multiple must be a positive integer"):
        get_scheduler("dp_balanced", microbatch_multiple=0)
