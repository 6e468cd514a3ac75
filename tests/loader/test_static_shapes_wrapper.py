"""``wrap_data_iterator(static_shapes=...)`` in one process: every microbatch of every step
has a bucket's shapes and is the plain pack of its sequences with those shapes; every
sample arrives once; a state saved with static shapes resumes only under the same ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.errors import ResumeError
from seqpack.interop.hf import to_hf
from seqpack.loader import wrap_data_iterator
from seqpack.thd import StaticShapes, pack_sequences
from seqpack.topology import Topology

SPR = 12
CAPACITY = 256
LADDER = StaticShapes(token_buckets=(64, 128, 192, 256), max_sequences=13)


def samples(steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": torch.from_numpy(rng.integers(0, 100, int(rng.integers(3, 60))))} for _ in range(steps * SPR)]


def wrapped(data, static_shapes, **kw):
    kw.setdefault("prefetch", 0)
    return wrap_data_iterator(
        iter(data), Topology.single(), samples_per_rank=SPR, max_tokens_per_rank=CAPACITY,
        static_shapes=static_shapes, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("shapes", [LADDER, StaticShapes(max_sequences=13, tail_padding="extend_last")])
def test_every_microbatch_is_its_plain_pack_with_fixed_shapes(shapes):
    data = samples(4)
    plain = list(wrapped(data, None))
    fixed = list(wrapped(data, shapes))
    assert len(fixed) == len(plain) == 4
    buckets = shapes.buckets(CAPACITY)
    for k, (a, b) in enumerate(zip(plain, fixed, strict=True)):
        assert b.num_loss_tokens == a.num_loss_tokens
        assert b.stats.real_tokens == a.stats.real_tokens
        seen = []
        for batch in b.microbatches:
            assert batch.num_tokens in buckets and batch.max_seqlen == batch.num_tokens
            assert batch.cu_seqlens.shape == (14,) and batch.sample_ids.shape == (13,)
            ids = batch.sample_ids[batch.sample_ids >= 0].numpy()
            seen.extend(ids.tolist())
            want = pack_sequences(
                [data[SPR * k + i] for i in ids],
                sample_ids=ids,
                static_shapes=shapes,
                pad_to=CAPACITY if shapes.token_buckets == "capacity" else None,
            )
            for name in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded"):
                assert torch.equal(getattr(batch, name), getattr(want, name)), (k, name)
            kwargs = to_hf(batch)  # Hugging Face's packed format keeps the fixed shapes
            assert kwargs["input_ids"].shape == (1, batch.num_tokens) and kwargs["cu_seq_lens_q"].shape == (14,)
        assert sorted(seen) == list(range(SPR))


def test_a_state_saved_with_static_shapes_resumes_only_under_them():
    data = samples(3)
    first = wrapped(data, LADDER)
    next(first)
    state = first.state_dict()
    with pytest.raises(ResumeError, match="static_shapes"):
        wrapped(data, None).load_state_dict(state)
    resumed = wrapped(data, LADDER)
    resumed.load_state_dict(state)
    a, b = next(first), next(resumed)
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a.microbatches, b.microbatches, strict=True))


@pytest.mark.parametrize("tail", ["append_dummy_seq", "extend_last"])
def test_the_scheduler_keeps_max_sequences_and_the_stats_count_the_bucket_tail(tail):
    shapes = StaticShapes(token_buckets=(64, 128, 192, 256), max_sequences=3, tail_padding=tail)
    data = samples(3, seed=1)
    for k, step in enumerate(wrapped(data, shapes)):
        real = [int((b.sample_ids >= 0).sum()) for b in step.microbatches]
        assert max(real) <= shapes.max_real_sequences and sum(real) == SPR  # more microbatches, none over
        ids = [int(i) for b in step.microbatches for i in b.sample_ids if i >= 0]
        lengths = [data[SPR * k + i]["input_ids"].numel() for i in ids]
        assert step.stats.padded_tokens == sum(lengths)  # pad_multiple 1: the plain packs' tokens
        assert step.stats.bucket_tokens == sum(b.num_tokens for b in step.microbatches) - step.stats.padded_tokens
        assert step.stats.bucket_tokens > 0
