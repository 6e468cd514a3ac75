"""Fixed-shape packs (seqpack.thd.StaticShapes): token buckets, a fixed number of sequence
slots, the tail's place; the real tokens are those of the pack without buckets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import seqpack
from seqpack import validation
from seqpack.compute.attention.reference import thd_attention
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.thd import (
    BATCH_TOKEN_FIELDS,
    IGNORE_INDEX,
    StaticShapes,
    batch_from_layout,
    pack_sequences,
    pad_multiple_for,
    partition_indices,
    shard_for_cp,
    unshard_from_cp,
)

POLICIES = ("append_dummy_seq", "extend_last")


def _samples(lengths, seed=0, positions=False):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for n in lengths:
        sample = {"input_ids": torch.randint(1, 200, (n,), generator=g)}
        if positions:
            sample["position_ids"] = torch.arange(n) + int(torch.randint(0, 50, (1,), generator=g))
        samples.append(sample)
    return samples


def check_static_pack(static, plain, shapes, capacity=None):
    """``static`` is ``plain`` with the tail and slots of ``shapes``: every real token, label,
    loss weight and position is the same; the tail is pads that carry no loss."""
    n, total = plain.num_sequences, plain.num_tokens
    bucket = shapes.bucket_for(total, capacity)
    assert static.num_tokens == bucket and static.max_seqlen == bucket
    assert static.cu_seqlens.shape == static.cu_seqlens_padded.shape == (shapes.max_sequences + 1,)
    assert static.cu_seqlens.dtype == static.cu_seqlens_padded.dtype == torch.int32
    for name in BATCH_TOKEN_FIELDS:
        assert torch.equal(getattr(static, name)[:total], getattr(plain, name)), name
    tail = slice(total, bucket)
    assert static.padding_mask[tail].all()
    assert (static.labels[tail] == IGNORE_INDEX).all() and (static.loss_mask[tail] == 0).all()
    assert static.num_loss_tokens == plain.num_loss_tokens == int((static.loss_mask > 0).sum())
    assert static.num_real_tokens == plain.num_real_tokens
    assert torch.equal(static.cu_seqlens[: n + 1], plain.cu_seqlens)
    assert (static.cu_seqlens[n:] == plain.cu_seqlens[-1]).all()  # no real token past the samples
    assert torch.equal(static.cu_seqlens_padded[:n], plain.cu_seqlens_padded[:n])
    assert (static.cu_seqlens_padded[n + 1 :] == bucket).all()
    assert torch.equal(static.sample_ids[:n], plain.sample_ids) and (static.sample_ids[n:] == -1).all()
    if shapes.tail_padding == "append_dummy_seq":
        assert int(static.cu_seqlens_padded[n]) == total  # the real sequences' slots are unchanged
        assert (static.seq_idx[tail] == n).all()
        assert torch.equal(static.position_ids[tail], torch.arange(bucket - total))
    else:
        assert (static.seq_idx[tail] == n - 1).all()  # the last sequence's padding
        last = int(plain.position_ids[-1])
        assert torch.equal(static.position_ids[tail], torch.arange(last + 1, last + 1 + bucket - total))


@pytest.mark.parametrize("tail_padding", POLICIES)
@pytest.mark.parametrize("positions", [False, True])
def test_real_tokens_are_those_of_the_plain_pack(tail_padding, positions):
    shapes = StaticShapes(token_buckets=(32, 64, 96), max_sequences=6, tail_padding=tail_padding)
    for lengths in ([5, 9, 1, 12], [13], [7, 8, 2, 3, 4], [31, 1]):
        samples = _samples(lengths, seed=len(lengths), positions=positions)
        plain = pack_sequences(samples, pad_multiple=2)
        static = pack_sequences(samples, pad_multiple=2, static_shapes=shapes)
        assert plain.num_tokens < static.num_tokens  # not vacuous: there is a tail
        check_static_pack(static, plain, shapes)


def test_a_pack_that_fills_its_bucket_has_no_tail():
    shapes = StaticShapes(token_buckets=(8, 16), max_sequences=3)
    plain = pack_sequences(_samples([8, 8]), pad_multiple=8)
    static = pack_sequences(_samples([8, 8]), pad_multiple=8, static_shapes=shapes)
    check_static_pack(static, plain, shapes)
    assert static.cu_seqlens.tolist() == static.cu_seqlens_padded.tolist() == [0, 8, 16, 16]
    assert static.cu_seqlens_padded is static.cu_seqlens  # TE #3487: one object when nothing is padded


def test_capacity_bucket_takes_pad_to():
    shapes = StaticShapes(token_buckets="capacity", max_sequences=4)
    samples = _samples([5, 3])
    static = pack_sequences(samples, pad_multiple=4, pad_to=24, static_shapes=shapes)
    check_static_pack(static, pack_sequences(samples, pad_multiple=4), shapes, capacity=24)
    with pytest.raises(ConfigError, match="token_buckets='capacity' needs"):
        pack_sequences(samples, pad_multiple=4, static_shapes=shapes)


def test_multiples_of_is_megatron_alignment():
    shapes = StaticShapes.multiples_of(128, 512, max_sequences=8, tail_padding="extend_last")
    assert shapes.token_buckets == (128, 256, 384, 512) and shapes.tail_padding == "extend_last"
    assert [shapes.bucket_for(t) for t in (0, 1, 128, 129, 512)] == [128, 128, 128, 256, 512]
    with pytest.raises(ConfigError, match="capacity=500 is not a multiple of step=128"):
        StaticShapes.multiples_of(128, 500, max_sequences=8)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"token_buckets": (), "max_sequences": 4}, "token_buckets is empty"),
        ({"token_buckets": (64, 32), "max_sequences": 4}, r"strictly ascending, got \(64, 32\).*\(32, 64\)"),
        ({"token_buckets": (32, 32), "max_sequences": 4}, r"token_buckets\[1\]=32 after 32"),
        ({"token_buckets": (0, 32), "max_sequences": 4}, r"token_buckets\[0\]"),
        ({"token_buckets": (2**31,), "max_sequences": 4}, r"token_buckets\[0\]"),
        ({"token_buckets": "max", "max_sequences": 4}, "'capacity' or a tuple of token counts, got 'max'"),
        ({"token_buckets": (32,), "max_sequences": 0}, "max_sequences"),
        ({"token_buckets": (32,), "max_sequences": 1}, "max_sequences=1 leaves no slot"),
        ({"token_buckets": (32,), "max_sequences": 2, "tail_padding": "zero"}, "tail_padding"),
    ],
)
def test_bad_static_shapes_are_refused_by_name(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        StaticShapes(**kwargs)


def test_shapes_larger_than_memory_are_refused_by_name_before_any_allocation(monkeypatch):
    # A 2 GiB machine: every request below is a pack of more than that, refused with the field,
    # its value and the memory; multiples_of before it builds 2**31 - 1 buckets.
    monkeypatch.setattr(validation, "memory_limit", lambda: 2 * 2**30)
    big = 2**31 - 1
    with pytest.raises(ConfigError, match=rf"max_sequences={big} slots and 64 tokens .* needs at least 8\d\.\d GiB"):
        StaticShapes(token_buckets=(64,), max_sequences=big)
    with pytest.raises(ConfigError, match=rf"max_sequences=4 slots and {big} tokens \(the largest token bucket\) is"):
        StaticShapes(token_buckets=(big,), max_sequences=4)
    with pytest.raises(ConfigError, match=rf"{big} tokens \(the largest token bucket of {big:,}\) is too large"):
        StaticShapes.multiples_of(1, big, max_sequences=4)
    capacity = StaticShapes(max_sequences=4)  # "capacity": sized when the pack is laid out
    with pytest.raises(ConfigError, match=rf"max_sequences=4 slots and {big} tokens .* needs at least"):
        pack_sequences(_samples([3]), pad_to=big, static_shapes=capacity)


def test_bad_types_are_refused():
    with pytest.raises(SeqpackTypeError, match="token_buckets"):
        StaticShapes(token_buckets=32, max_sequences=4)
    with pytest.raises(SeqpackTypeError, match=r"token_buckets\[0\]"):
        StaticShapes(token_buckets=(32.5,), max_sequences=4)
    with pytest.raises(SeqpackTypeError, match="static_shapes must be a seqpack.StaticShapes"):
        pack_sequences(_samples([3]), static_shapes={"token_buckets": (8,)})
    assert StaticShapes(token_buckets=[8, 16], max_sequences=1, tail_padding="extend_last").token_buckets == (8, 16)
    assert seqpack.StaticShapes is StaticShapes


def test_packs_that_do_not_fit_are_refused_by_name():
    shapes = StaticShapes(token_buckets=(16, 32), max_sequences=3)
    with pytest.raises(ConfigError, match="num_tokens=40 padded tokens is larger than the largest token bucket 32"):
        pack_sequences(_samples([20, 20]), static_shapes=shapes)
    # append_dummy_seq: one of the 3 slots is the tail's.
    with pytest.raises(ConfigError, match=r"3 sequences does not fit max_sequences=3 slots \(one of them is the tail"):
        pack_sequences(_samples([2, 2, 2]), static_shapes=shapes)
    extend = StaticShapes(token_buckets=(16, 32), max_sequences=3, tail_padding="extend_last")
    assert pack_sequences(_samples([2, 2, 2]), static_shapes=extend).num_sequences == 3
    with pytest.raises(ConfigError, match="4 sequences does not fit max_sequences=3 slots: at most 3"):
        pack_sequences(_samples([2, 2, 2, 2]), static_shapes=extend)
    with pytest.raises(ConfigError, match=r"token bucket 30 is not a multiple of pad_multiple=4.*use 28 or 32"):
        pack_sequences(
            _samples([2]), pad_multiple=4, static_shapes=StaticShapes(token_buckets=(16, 30), max_sequences=3)
        )
    with pytest.raises(ConfigError, match="pad_to=32 and token_buckets=.* both fix"):
        pack_sequences(_samples([2]), pad_to=32, static_shapes=shapes)


@pytest.mark.parametrize("tail_padding", POLICIES)
@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
@pytest.mark.parametrize("cp_size", [2, 3])
def test_cp_shards_have_fixed_length_and_reassemble(tail_padding, layout, cp_size):
    multiple = pad_multiple_for(cp_size)
    shapes = StaticShapes(token_buckets=(8 * multiple, 16 * multiple), max_sequences=5, tail_padding=tail_padding)
    samples = _samples([7, 1, 12, 5])
    static = pack_sequences(samples, pad_multiple=multiple, static_shapes=shapes)
    plain = pack_sequences(samples, pad_multiple=multiple)
    check_static_pack(static, plain, shapes)
    shards = [shard_for_cp(static, cp_size, rank, layout=layout) for rank in range(cp_size)]
    for shard in shards:
        assert shard.num_tokens == static.num_tokens // cp_size  # fixed by the bucket alone
        assert torch.equal(shard.cu_seqlens_padded, static.cu_seqlens_padded) and shard.max_seqlen == static.max_seqlen
    assert sum(int((s.loss_mask > 0).sum()) for s in shards) == static.num_loss_tokens
    for name in BATCH_TOKEN_FIELDS:
        parts = [getattr(shard, name) for shard in shards]
        whole = unshard_from_cp(parts, static.cu_seqlens_padded, cp_size, layout=layout)
        assert torch.equal(whole, getattr(static, name)), name


@pytest.mark.parametrize("tail_padding", POLICIES)
@pytest.mark.parametrize("cp_size", [1, 2])
def test_reference_attention_on_real_tokens_is_unchanged(tail_padding, cp_size):
    """Zero-length slots and the tail (a dummy sequence or the last one's padding) change no
    real token's attention output, also on every CP shard."""
    multiple = pad_multiple_for(cp_size)
    shapes = StaticShapes(token_buckets=(16 * multiple, 32 * multiple), max_sequences=6, tail_padding=tail_padding)
    samples = _samples([9, 3, 14, 1])
    plain = pack_sequences(samples, pad_multiple=multiple)
    static = pack_sequences(samples, pad_multiple=multiple, static_shapes=shapes)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(static.num_tokens, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    total = plain.num_tokens
    expected = thd_attention(q[:total], k[:total], v[:total], plain.cu_seqlens, plain.cu_seqlens_padded)
    got = thd_attention(q, k, v, static.cu_seqlens, static.cu_seqlens_padded)
    real = ~plain.padding_mask
    torch.testing.assert_close(got[:total][real], expected[real], rtol=0, atol=1e-12)
    assert (got[static.padding_mask] == 0).all()
    for rank in range(cp_size):  # this rank's queries (its shard) against the whole pack
        mine = partition_indices(static.cu_seqlens_padded, static.num_tokens, cp_size, rank)
        out = thd_attention(q[mine], k, v, static.cu_seqlens, static.cu_seqlens_padded, cp_size=cp_size, cp_rank=rank)
        torch.testing.assert_close(out, got[mine], rtol=0, atol=1e-12)


@pytest.mark.parametrize("tail_padding", POLICIES)
def test_tiny_lm_logits_and_loss_on_real_tokens_are_unchanged(tail_padding):
    torch.manual_seed(0)
    model = TinyHybridLM(
        TinyConfig(d_model=32, pattern="AM", num_heads=2, num_kv_heads=1, d_state=8, mamba_headdim=8)
    ).double()
    shapes = StaticShapes(token_buckets=(48, 96), max_sequences=8, tail_padding=tail_padding)
    samples = _samples([9, 1, 14, 5])
    plain = pack_sequences(samples, pad_multiple=4)
    static = pack_sequences(samples, pad_multiple=4, static_shapes=shapes)
    assert static.num_tokens == 48 > plain.num_tokens
    with torch.no_grad():
        expected, got = model(plain), model(static)
        loss_plain, count_plain = model.loss_sum(plain)
        loss_static, count_static = model.loss_sum(static)
    real = ~plain.padding_mask
    torch.testing.assert_close(got[: plain.num_tokens][real], expected[real], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_static, loss_plain, rtol=1e-12, atol=1e-12)
    assert count_static == count_plain > 0


def test_offsets_are_the_documented_layout():
    lengths, padded = np.array([5, 3]), np.array([8, 4])
    dummy = StaticShapes(token_buckets=(16,), max_sequences=4)
    assert [a.tolist() for a in dummy.offsets(lengths, padded, 16)] == [[0, 5, 8, 8, 8], [0, 8, 12, 16, 16]]
    extend = StaticShapes(token_buckets=(16,), max_sequences=4, tail_padding="extend_last")
    assert [a.tolist() for a in extend.offsets(lengths, padded, 16)] == [[0, 5, 8, 8, 8], [0, 8, 16, 16, 16]]


@pytest.mark.parametrize("tail_padding", POLICIES)
@pytest.mark.parametrize("cp_size", [1, 2])
def test_layout_alone_rebuilds_a_static_pack(tail_padding, cp_size):
    """What the wire decoder and middle pipeline stages rebuild from the offsets alone
    (batch_from_layout) is the packed batch's layout, slots and tail included."""
    shapes = StaticShapes(token_buckets=(32, 64), max_sequences=6, tail_padding=tail_padding)
    static = pack_sequences(_samples([7, 1, 12]), pad_multiple=4, static_shapes=shapes)
    for rank in range(cp_size):
        shard = shard_for_cp(static, cp_size, rank)
        rebuilt = batch_from_layout(
            static.cu_seqlens, static.cu_seqlens_padded, static.max_seqlen, static.sample_ids, cp_size, rank
        )
        for name in ("position_ids", "seq_idx", "padding_mask", "cu_seqlens", "cu_seqlens_padded", "sample_ids"):
            assert torch.equal(getattr(rebuilt, name), getattr(shard, name)), name
        assert rebuilt.max_seqlen == 32 and rebuilt.num_tokens == 32 // cp_size
