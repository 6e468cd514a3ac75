"""Fuzz fixed-shape packing (seqpack.thd.StaticShapes): random lengths, buckets, slot counts,
tail policies and CP sizes either pack with every real token exactly once and unchanged (the
plain pack's), fields of the bucket's length and CP shards that reassemble, or are refused by
name; hostile arguments get a SeqpackError naming them (hostile.check_answer)."""

from __future__ import annotations

import pytest
import torch
from hostile import Target, spoil_one
from hypothesis import event, given, settings
from hypothesis import strategies as st

from seqpack.errors import ConfigError
from seqpack.thd import BATCH_TOKEN_FIELDS, StaticShapes, pack_sequences, shard_for_cp, unshard_from_cp
from seqpack.thd.padding import padded_lengths

TARGETS = [
    Target(
        "StaticShapes",
        StaticShapes,
        lambda: {"token_buckets": (16, 32), "max_sequences": 4, "tail_padding": "extend_last"},
        {"token_buckets": "any", "max_sequences": "int", "tail_padding": "str"},
    ),
    Target(
        "StaticShapes.bucket_for",
        lambda **kw: StaticShapes(token_buckets="capacity", max_sequences=4).bucket_for(**kw),
        lambda: {"num_tokens": 10, "capacity": 16},
        {"num_tokens": "int", "capacity": "opt_int"},
    ),
    Target(
        "StaticShapes.multiples_of",
        StaticShapes.multiples_of,
        lambda: {"step": 8, "capacity": 32, "max_sequences": 4},
        {"step": "int", "capacity": "int", "max_sequences": "int"},
    ),
    Target(
        "pack_sequences(static_shapes=)",
        pack_sequences,
        lambda: {
            "samples": [{"input_ids": torch.tensor([1, 2, 3])}],
            "static_shapes": StaticShapes(token_buckets=(8,), max_sequences=2),
        },
        {"static_shapes": "any"},
    ),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hostile_arguments_are_refused_by_name(target, data):
    spoil_one(target, data)


@st.composite
def packs(draw):
    cp_size = draw(st.sampled_from([1, 1, 2, 3, 4]))
    layout = draw(st.sampled_from(["dualchunk", "contiguous"]))
    pad_multiple = (2 * cp_size if cp_size > 1 else 1) * draw(st.sampled_from([1, 1, 2]))
    steps = draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    buckets, top = [], 0
    for step in steps:  # ascending multiples of pad_multiple (now and then one that is not)
        top += step * pad_multiple
        buckets.append(top)
    if draw(st.integers(0, 9)) == 0:
        buckets[-1] += 1
    shapes = StaticShapes(
        token_buckets=tuple(buckets),
        max_sequences=draw(st.integers(2, 8)),
        tail_padding=draw(st.sampled_from(["append_dummy_seq", "extend_last"])),
    )
    lengths = draw(st.lists(st.integers(1, 3 * pad_multiple + 7), min_size=1, max_size=9))
    seed = draw(st.integers(0, 2**16))
    return shapes, lengths, pad_multiple, cp_size, layout, seed


@settings(max_examples=150, deadline=None)
@given(case=packs())
def test_static_packs_keep_every_real_token_or_are_refused_by_name(case):
    shapes, lengths, pad_multiple, cp_size, layout, seed = case
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 100, (n,), generator=g)} for n in lengths]
    sample_ids = torch.randint(0, 1000, (len(lengths),), generator=g)
    try:
        static = pack_sequences(samples, pad_multiple=pad_multiple, static_shapes=shapes, sample_ids=sample_ids)
    except ConfigError as exc:
        message = str(exc)
        event("refused")
        padded = int(padded_lengths(lengths, pad_multiple).sum())
        if "pad_multiple" in message:
            assert any(b % pad_multiple for b in shapes.token_buckets)
        elif "max_sequences" in message:
            assert len(lengths) > shapes.max_real_sequences
        else:
            assert "largest token bucket" in message and padded > shapes.token_buckets[-1]
        return
    plain = pack_sequences(samples, pad_multiple=pad_multiple, sample_ids=sample_ids)
    event(f"packed, cp_size>1: {cp_size > 1}, tail: {static.num_tokens > plain.num_tokens}")
    n, total, bucket = len(lengths), plain.num_tokens, static.num_tokens
    # Shapes: the smallest bucket that holds the pack, max_sequences + 1 offsets.
    assert bucket in shapes.token_buckets and static.max_seqlen == bucket
    assert all(b < total for b in shapes.token_buckets if b < bucket) and total <= bucket
    assert static.cu_seqlens.shape == static.cu_seqlens_padded.shape == (shapes.max_sequences + 1,)
    assert static.sample_ids.shape == (shapes.max_sequences,)
    # Every real token once and unchanged: the plain pack is the static pack's prefix.
    for name in BATCH_TOKEN_FIELDS:
        assert getattr(static, name).shape == (bucket,)
        assert torch.equal(getattr(static, name)[:total], getattr(plain, name)), name
    assert static.padding_mask[total:].all() and (static.loss_mask[total:] == 0).all()
    assert (static.labels[total:] == -100).all() and static.num_loss_tokens == plain.num_loss_tokens
    assert torch.equal(static.sample_ids[:n], sample_ids) and (static.sample_ids[n:] == -1).all()
    assert int(static.cu_seqlens_padded[-1]) == bucket  # the tail belongs to a sequence
    # CP: every shard has bucket / cp_size tokens, and the shards reassemble the pack.
    if cp_size > 1:
        shards = [shard_for_cp(static, cp_size, rank, layout=layout) for rank in range(cp_size)]
        assert all(shard.num_tokens == bucket // cp_size for shard in shards)
        for name in BATCH_TOKEN_FIELDS:
            parts = [getattr(shard, name) for shard in shards]
            assert torch.equal(unshard_from_cp(parts, static.cu_seqlens_padded, cp_size, layout=layout),
                               getattr(static, name))  # fmt: skip
