import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from naive import dualchunk_reference, te_partition_reference

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import CpLayout
from seqpack.thd import pack_sequences, pad_multiple_for
from seqpack.thd.cp import (
    chunk_ids_after_attention,
    chunk_ids_before_attention,
    dualchunk_to_sequential,
    gather_order,
    held_runs,
    partition_indices,
    reorder_seq_chunks,
    run_indices,
    sequential_to_dualchunk,
    shard_for_cp,
    unshard_from_cp,
)
from seqpack.thd.padding import cp_pad_multiple, layout_multiple


def test_reference_example():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert partition_indices(cu, 12, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert partition_indices(cu, 12, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]


def test_cp1_is_identity():
    assert partition_indices(torch.tensor([0, 4, 6, 12]), 12, 1, 0).tolist() == list(range(12))
    assert partition_indices(torch.tensor([0, 3, 5, 11]), 11, 1, 0).tolist() == list(range(11))
    b = pack_sequences([{"input_ids": torch.arange(1, n + 1)} for n in (3, 2, 7)])
    assert shard_for_cp(b, 1, 0) is b


cu_strategy = st.tuples(
    st.sampled_from([1, 2, 3, 4, 8]),
    st.lists(st.integers(1, 6), min_size=1, max_size=8),
)


@given(cu_strategy)
@pytest.mark.slow
def test_partition_equals_te_kernel_and_definition(case):
    cp, chunks = case
    lengths = [2 * cp * c for c in chunks]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    total = cu[-1]
    covered = []
    for r in range(cp):
        fast = partition_indices(torch.tensor(cu, dtype=torch.int32), total, cp, r)
        assert fast.dtype == torch.int64 and fast.numel() == total // cp
        assert torch.equal(fast, te_partition_reference(cu, total, cp, r))
        assert torch.equal(fast, dualchunk_reference(cu, cp, r))
        covered.append(fast)
    assert sorted(torch.cat(covered).tolist()) == list(range(total))


def test_partition_errors():
    with pytest.raises(ValueError, match=r"cu_seqlens_padded\[1\]=6 is not divisible by 2\*cp_size=4"):
        partition_indices(torch.tensor([0, 6, 8]), 8, 2, 0)
    with pytest.raises(ValueError, match="cp_rank=2 is out of range for cp_size=2"):
        partition_indices(torch.tensor([0, 8]), 8, 2, 2)
    with pytest.raises(ValueError, match="cp_rank=-1"):
        partition_indices(torch.tensor([0, 8]), 8, 2, -1)
    with pytest.raises(ValueError, match="total_tokens=12 differs"):
        partition_indices(torch.tensor([0, 8]), 12, 2, 0)
    with pytest.raises(ValueError, match="cp_size must be a positive integer"):
        partition_indices(torch.tensor([0, 8]), 8, 0, 0)


@given(
    cp=st.sampled_from([2, 4, 8]),
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=10),
    seed=st.integers(0, 1000),
)
@pytest.mark.slow
def test_shard_unshard_roundtrip(cp, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 100, (n,), generator=g)} for n in lengths]
    batch = pack_sequences(samples, pad_multiple=pad_multiple_for(cp))
    shards = [shard_for_cp(batch, cp, r) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert shard.cp_size == cp and shard.cp_rank == r
        assert shard.num_tokens == batch.num_tokens // cp
        assert shard.cu_seqlens is batch.cu_seqlens and shard.max_seqlen == batch.max_seqlen
    assert sum(s.num_real_tokens for s in shards) == sum(lengths)
    for field in ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask"):
        back = unshard_from_cp([getattr(s, field) for s in shards], batch.cu_seqlens_padded, cp)
        assert torch.equal(back, getattr(batch, field)), field
    # Hidden states (token axis first, more dims) round-trip too.
    hidden = torch.randn(batch.num_tokens, 3, 2, generator=g)
    parts = [hidden[partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, r)] for r in range(cp)]
    assert torch.equal(unshard_from_cp(parts, batch.cu_seqlens_padded, cp), hidden)


def test_shard_errors():
    batch = pack_sequences([{"input_ids": torch.arange(1, 6)}], pad_multiple=2)
    with pytest.raises(ValueError, match="not divisible by 2\\*cp_size=4"):
        shard_for_cp(batch, 2, 0)
    good = pack_sequences([{"input_ids": torch.arange(1, 6)}], pad_multiple=4)
    shard = shard_for_cp(good, 2, 1)
    with pytest.raises(ValueError, match="already sharded"):
        shard_for_cp(shard, 2, 0)
    with pytest.raises(ValueError, match="cp_rank=5"):
        shard_for_cp(good, 2, 5)
    with pytest.raises(ValueError, match="expected 2 parts"):
        unshard_from_cp([shard.input_ids], good.cu_seqlens_padded, 2)


def test_shard_metadata_only_batch():
    batch = pack_sequences([{"input_ids": torch.arange(1, 6)}], pad_multiple=4)
    batch.input_ids = batch.labels = batch.loss_mask = None
    shard = shard_for_cp(batch, 2, 0)
    assert shard.input_ids is None and shard.position_ids.tolist() == [0, 1, 6, 7]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_chunk_ids(cp):
    before = chunk_ids_before_attention(cp)
    after = chunk_ids_after_attention(cp)
    for r in range(cp):
        assert before[r] == 2 * r and before[r + cp] == 2 * cp - 2 * r - 1
        assert after[2 * r] == r and after[2 * r + 1] == 2 * cp - r - 1
    # They are inverse permutations.
    assert torch.equal(after[before], torch.arange(2 * cp))
    assert torch.equal(before[after], torch.arange(2 * cp))


def test_chunk_ids_example_cp2():
    assert chunk_ids_before_attention(2).tolist() == [0, 2, 3, 1]
    assert chunk_ids_after_attention(2).tolist() == [0, 3, 1, 2]


@given(cp=st.sampled_from([1, 2, 4]), chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6))
@pytest.mark.slow
def test_dualchunk_sequential_and_gather_order(cp, chunks):
    lengths = [2 * cp * c for c in chunks]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    total = int(cu[-1])
    x = torch.arange(total)
    # Rank-major concatenation of shards, per sequence re-interleaved, is DualChunkSwap
    # order; dualchunk_to_sequential must undo it.
    shards = [x[partition_indices(cu, total, cp, r)] for r in range(cp)]
    rank_major = torch.cat(shards)
    order = gather_order(cu, total, cp)
    restored = torch.empty_like(rank_major)
    restored[order] = rank_major
    assert torch.equal(restored, x)
    assert torch.equal(x[order], rank_major)
    seq_major = torch.cat(
        [
            torch.cat([shards[r][int(cu[i]) // cp : int(cu[i + 1]) // cp] for r in range(cp)])
            for i in range(len(lengths))
        ]
    )
    assert torch.equal(dualchunk_to_sequential(seq_major, cu, cp), x)
    assert torch.equal(sequential_to_dualchunk(x, cu, cp), seq_major)


def test_reorder_seq_chunks_single_sequence_and_errors():
    x = torch.arange(8).reshape(8, 1).float()
    out = reorder_seq_chunks(x, torch.tensor([1, 0]))
    assert out.flatten().tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="divisible by 3 chunks"):
        reorder_seq_chunks(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="ends at 6"):
        reorder_seq_chunks(x, torch.tensor([1, 0]), torch.tensor([0, 6]))


def test_partition_on_dim_other_tensors_keep_device_and_dtype():
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    idx = partition_indices(cu, 16, 4, 3)
    assert idx.device == cu.device and idx.dtype == torch.int64


def test_unshard_cp1_is_identity_for_odd_lengths():
    x = torch.arange(7)
    assert unshard_from_cp([x], torch.tensor([0, 3, 7]), 1) is x


def test_float_offsets_and_sizes_are_errors_not_truncated():
    cu = torch.tensor([0.0, 8.0, 12.0])
    for call in (
        lambda: partition_indices(cu, 12, 2, 0),
        lambda: gather_order(cu, 12, 2),
        lambda: unshard_from_cp([torch.zeros(6), torch.zeros(6)], cu, 2),
        lambda: reorder_seq_chunks(torch.zeros(12), chunk_ids_before_attention(2), cu),
    ):
        with pytest.raises(SeqpackTypeError, match="cu_seqlens_padded must hold integers, got dtype torch.float32"):
            call()
    with pytest.raises(SeqpackTypeError, match="cp_size must be a positive integer, got 2.0"):
        partition_indices(torch.tensor([0, 8]), 8, 2.0, 0)
    with pytest.raises(SeqpackTypeError, match="total_tokens must be an integer"):
        partition_indices(torch.tensor([0, 8]), 8.0, 2, 0)
    with pytest.raises(ConfigError, match="at least 2 entries"):
        partition_indices(torch.tensor([0]), 0, 2, 0)


def test_shard_for_cp_accepts_numpy_integer_sizes():
    b = pack_sequences([{"input_ids": torch.arange(1, n + 1)} for n in (3, 5)], pad_multiple=4)
    assert torch.equal(shard_for_cp(b, np.int64(2), np.int32(1)).input_ids, shard_for_cp(b, 2, 1).input_ids)


# --- the contiguous layout ---------------------------------------------------------------------


def contiguous_reference(cu_seqlens_padded, cp_size, cp_rank):
    """The contiguous layout from its definition: rank r holds chunk r of cp of every sequence."""
    out = []
    for start, end in zip(cu_seqlens_padded[:-1], cu_seqlens_padded[1:], strict=True):
        chunk = (end - start) // cp_size
        out.extend(range(start + cp_rank * chunk, start + (cp_rank + 1) * chunk))
    return torch.tensor(out, dtype=torch.int64)


def test_contiguous_example():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert partition_indices(cu, 12, 2, 0, layout="contiguous").tolist() == [0, 1, 2, 3, 8, 9]
    assert partition_indices(cu, 12, 2, 1, layout="contiguous").tolist() == [4, 5, 6, 7, 10, 11]
    assert partition_indices(cu, 12, 2, 0, layout="dualchunk").tolist() == [0, 1, 6, 7, 8, 11]  # the default's


@given(cp=st.sampled_from([1, 2, 3, 4, 8]), chunks=st.lists(st.integers(0, 6), min_size=1, max_size=8))
@pytest.mark.slow
def test_contiguous_partition_equals_definition(cp, chunks):
    cu = np.concatenate([[0], np.cumsum([cp * c for c in chunks])]).tolist()  # padded lengths: multiples of cp
    total = cu[-1]
    covered = []
    for r in range(cp):
        fast = partition_indices(torch.tensor(cu), total, cp, r, layout=CpLayout.CONTIGUOUS)
        assert torch.equal(fast, contiguous_reference(cu, cp, r))
        covered.append(fast)
    assert torch.equal(torch.cat(covered).sort().values, torch.arange(total))
    assert torch.equal(gather_order(cu, total, cp, layout="contiguous"), torch.cat(covered))


@given(
    cp=st.sampled_from([2, 3, 4]),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    layout=st.sampled_from(list(CpLayout)),
    seed=st.integers(0, 1000),
)
@pytest.mark.slow
def test_shard_unshard_roundtrip_both_layouts(cp, lengths, layout, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 100, (n,), generator=g)} for n in lengths]
    batch = pack_sequences(samples, pad_multiple=cp_pad_multiple(cp, layout))
    shards = [shard_for_cp(batch, cp, r, layout=layout) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert (shard.cp_size, shard.cp_rank, shard.cp_layout) == (cp, r, layout)
        index = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, r, layout=layout)
        assert torch.equal(shard.position_ids, batch.position_ids[index])
    for field in ("input_ids", "position_ids", "seq_idx", "padding_mask"):
        back = unshard_from_cp([getattr(s, field) for s in shards], batch.cu_seqlens_padded, cp, layout=layout)
        assert torch.equal(back, getattr(batch, field)), field


def test_layouts_differ_and_are_named_in_errors():
    batch = pack_sequences([{"input_ids": torch.arange(1, 7)}], pad_multiple=2)  # padded 6: cp=2 contiguous only
    shard = shard_for_cp(batch, 2, 1, layout="contiguous")
    assert shard.position_ids.tolist() == [3, 4, 5] and shard.cp_layout == "contiguous"
    with pytest.raises(ConfigError, match=r"cu_seqlens_padded\[1\]=6 is not divisible by 2\*cp_size=4"):
        shard_for_cp(batch, 2, 1)  # dualchunk needs 2*cp
    with pytest.raises(ConfigError, match=r"not divisible by cp_size=4 \(layout='contiguous'\)"):
        shard_for_cp(batch, 4, 1, layout="contiguous")
    with pytest.raises(ConfigError, match=r"layout must be one of \('dualchunk', 'contiguous'\), got 'zigzag'"):
        partition_indices([0, 8], 8, 2, 0, layout="zigzag")
    parts = [shard_for_cp(batch, 2, r, layout="contiguous").position_ids for r in range(2)]
    assert unshard_from_cp(parts, batch.cu_seqlens_padded, 2, layout="contiguous").tolist() == list(range(6))
    assert cp_pad_multiple(4) == 8 and cp_pad_multiple(4, "contiguous") == 4 and cp_pad_multiple(1) == 1


def test_cp1_shard_records_the_layout_and_keeps_the_tokens():
    b = pack_sequences([{"input_ids": torch.arange(1, 4)}])
    assert shard_for_cp(b, 1, 0, layout="dualchunk") is b
    c = shard_for_cp(b, 1, 0, layout="contiguous")
    assert c.cp_layout == "contiguous" and c.input_ids is b.input_ids


def test_packed_batch_refuses_an_unknown_layout():
    b = pack_sequences([{"input_ids": torch.arange(1, 4)}])
    with pytest.raises(ConfigError, match=r"PackedBatch.cp_layout must be one of"):
        dataclasses.replace(b, cp_layout="ring")


# --- unshard_from_cp: parts of the wrong lengths (issue 24, item 6) -----------------------------


@pytest.mark.parametrize("layout", list(CpLayout))
def test_unshard_refuses_parts_of_the_wrong_lengths(layout):
    # 3 + 1 tokens for cu [0, 4]: the right total, the wrong split; it used to come back scrambled.
    expected = r"parts\[0\] has 3 tokens, expected 2 \(cu_seqlens_padded\[-1\]=4 / cp_size=2\)"
    with pytest.raises(ConfigError, match=expected):
        unshard_from_cp([torch.arange(3), torch.arange(1)], torch.tensor([0, 4]), 2, layout=layout)
    with pytest.raises(ConfigError, match=r"parts\[1\] has 3 tokens, expected 2"):
        unshard_from_cp([torch.arange(2), torch.arange(3)], [0, 4], 2, layout=layout)
    with pytest.raises(ConfigError, match=r"parts\[0\] has 5 tokens, expected 4 \(.*=4 / cp_size=1\)"):
        unshard_from_cp([torch.arange(5)], [0, 4], 1, layout=layout)


def test_unshard_refuses_parts_of_different_dtypes_or_trailing_shapes():
    # torch.cat raised a RuntimeError for the shapes and promoted int64 + float32 to float32.
    with pytest.raises(ConfigError, match=r"parts\[1\] is torch.float32 of shape \(2, 2\).*parts\[0\] is torch.float32 "
                       r"of shape \(2, 3\)"):  # fmt: skip
        unshard_from_cp([torch.zeros(2, 3), torch.zeros(2, 2)], [0, 4], 2)
    with pytest.raises(ConfigError, match=r"parts\[1\] is torch.float32 .* parts\[0\] is torch.int64"):
        unshard_from_cp([torch.arange(2), torch.zeros(2)], [0, 4], 2)


def test_unshard_messages_name_only_its_arguments():
    messages = []
    for call in (
        lambda: unshard_from_cp([torch.arange(4), torch.arange(4)], [0, 4], 2),  # 8 tokens for 4
        lambda: unshard_from_cp([torch.arange(3), torch.arange(3)], [0, 6], 2),  # 6 not divisible by 4
        lambda: unshard_from_cp([torch.arange(2), torch.arange(2)], [0, 8, 4], 2),  # decreasing offsets
        lambda: unshard_from_cp([torch.arange(2)], [0, 4], 2),
        lambda: unshard_from_cp([torch.arange(2), torch.tensor(1)], [0, 4], 2),
    ):
        with pytest.raises(ConfigError) as info:
            call()
        messages.append(str(info.value))
    assert len(messages) == 5
    for message in messages:
        assert "total_tokens" not in message, message  # not an argument of unshard_from_cp


# --- the one rule: held_runs, as the exchange calls it (a group size and rank per sequence) -----


@given(
    layout=st.sampled_from(list(CpLayout)),
    seqs=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8]), st.integers(0, 5), st.integers(0, 7)), max_size=8),
    data=st.data(),
)
@pytest.mark.slow
def test_held_runs_per_sequence_equal_the_definitions(layout, seqs, data):
    """Each sequence cut for its own group, by its own rank, equals the one-sequence definition
    (``dualchunk_reference`` / ``contiguous_reference``); a group of one holds its whole
    sequence whatever its length (odd too)."""
    starts, lengths, sizes, ranks, expected = [], [], [], [], []
    at = 0
    for size, chunks, odd in seqs:
        length = odd if size == 1 else chunks * layout_multiple(size, layout)
        rank = data.draw(st.integers(0, size - 1))
        if size == 1:
            expected.extend(range(at, at + length))
        elif layout == CpLayout.DUALCHUNK:
            expected.extend(dualchunk_reference([at, at + length], size, rank).tolist())
        else:
            expected.extend(contiguous_reference([at, at + length], size, rank).tolist())
        starts.append(at)
        lengths.append(length)
        sizes.append(size)
        ranks.append(rank)
        at += length + 3  # sequences need not touch
    runs = held_runs(np.array(starts), np.array(lengths), np.array(sizes), np.array(ranks), layout)
    assert run_indices(*runs).tolist() == expected
