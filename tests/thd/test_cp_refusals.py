"""seqpack.thd.cp's refusals of arguments of the wrong kind, each naming what it got, and
reorder_seq_chunks along another dimension than the first against a loop over the sequences."""

from __future__ import annotations

import pytest
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.thd import pack_sequences, reorder_seq_chunks, shard_for_cp, unshard_from_cp


@pytest.mark.parametrize(
    ("parts", "got"),
    [
        ("ab", r"got str$"),
        ([torch.zeros(2), [1, 2]], r"got list of \['Tensor', 'list'\]$"),
        ((torch.zeros(2), None), r"got tuple of \['NoneType', 'Tensor'\]$"),
    ],
)
def test_unshard_refuses_parts_that_are_no_list_of_tensors_naming_their_kinds(parts, got):
    with pytest.raises(SeqpackTypeError, match=r"parts must be a list of tensors \(one per CP rank\), " + got):
        unshard_from_cp(parts, [0, 4], 2)


def test_shard_refuses_a_batch_that_is_no_packed_batch():
    with pytest.raises(SeqpackTypeError, match=r"batch must be a seqpack.thd.PackedBatch, got dict"):
        shard_for_cp({"input_ids": torch.arange(8)}, 2, 0)
    batch = pack_sequences([{"input_ids": torch.arange(8)}], pad_multiple=4)
    assert shard_for_cp(batch, 2, 1).input_ids.shape == (4,)  # the batch itself is sharded


@pytest.mark.parametrize("dim", [2, -3])
def test_reorder_refuses_a_dim_out_of_range_naming_it(dim):
    with pytest.raises(ConfigError, match=rf"dim={dim} is out of range for x of shape \(4, 2\)"):
        reorder_seq_chunks(torch.zeros(4, 2), torch.tensor([1, 0]), dim=dim)


@pytest.mark.parametrize("chunk_ids", [torch.tensor([1.0, 0.0]), torch.tensor([True, False])])
def test_reorder_refuses_chunk_ids_that_are_no_integers(chunk_ids):
    with pytest.raises(SeqpackTypeError, match=rf"chunk_ids must hold integers, got dtype {chunk_ids.dtype}"):
        reorder_seq_chunks(torch.zeros(4), chunk_ids)


@pytest.mark.parametrize(("chunk_ids", "shown"), [([0, 0], r"\[0, 0\]"), ([1, 2], r"\[1, 2\]"), ([], r"\[\]")])
def test_reorder_refuses_chunk_ids_that_are_no_permutation(chunk_ids, shown):
    n = len(chunk_ids)
    with pytest.raises(ConfigError, match=rf"chunk_ids must be a permutation of 0..{n - 1}, got {shown}"):
        reorder_seq_chunks(torch.zeros(4), torch.tensor(chunk_ids, dtype=torch.int64))


@pytest.mark.parametrize("dim", [1, -1])
def test_reorder_along_a_later_dim_moves_each_sequences_chunks(dim):
    cu = [0, 4, 12]  # two sequences of 4 and 8, each cut into 4 chunks
    chunk_ids = torch.tensor([2, 0, 3, 1])
    x = torch.arange(2 * 12).reshape(2, 12)
    expected = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        chunks = x[:, a:b].chunk(4, dim=1)
        expected += [chunks[j] for j in chunk_ids.tolist()]
    assert torch.equal(reorder_seq_chunks(x, chunk_ids, cu, dim=dim), torch.cat(expected, dim=1))
