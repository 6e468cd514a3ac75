import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from naive import pack_reference

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.thd import (
    BATCH_TOKEN_FIELDS,
    IGNORE_INDEX,
    batch_from_layout,
    pack_sequences,
    pad_multiple_for,
    padded_lengths,
    padding_only_batch,
    sample_sequences,
    shard_for_cp,
    split_packed_sample,
)


def _samples(lengths, seed=0, with_labels=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        s = {"input_ids": torch.randint(1, 1000, (n,), generator=g)}
        if with_labels:
            s["labels"] = torch.randint(0, 1000, (n,), generator=g)
            s["position_ids"] = torch.arange(n) + int(torch.randint(0, 9, (1,), generator=g))
        out.append(s)
    return out


# --- pack_sequences -------------------------------------------------------------------


def test_pack_basic_layout():
    b = pack_sequences(
        [{"input_ids": torch.tensor([1, 2, 3, 4, 5])}, {"input_ids": torch.tensor([7, 8, 9])}], pad_multiple=4
    )
    assert b.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 7, 8, 9, 0]
    assert b.labels.tolist() == [2, 3, 4, 5, -100, -100, -100, -100, 8, 9, -100, -100]
    assert b.loss_mask.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
    assert b.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert b.seq_idx.tolist() == [0] * 8 + [1] * 4
    assert b.padding_mask.tolist() == [False] * 5 + [True] * 3 + [False] * 3 + [True]
    assert b.cu_seqlens.tolist() == [0, 5, 8] and b.cu_seqlens.dtype == torch.int32
    assert b.cu_seqlens_padded.tolist() == [0, 8, 12] and b.cu_seqlens_padded.dtype == torch.int32
    assert b.max_seqlen == 8
    assert b.sample_ids.tolist() == [0, 1]
    assert (b.num_tokens, b.num_real_tokens, b.num_sequences) == (12, 8, 2)
    assert b.input_ids.dtype == torch.int64 and b.labels.dtype == torch.int64
    assert b.loss_mask.dtype == torch.float32 and b.seq_idx.dtype == torch.int32
    assert b.padding_mask.dtype == torch.bool and b.position_ids.dtype == torch.int64


def test_pack_no_padding_shares_cu_seqlens_object():
    b = pack_sequences(_samples([3, 5]))
    assert b.cu_seqlens_padded is b.cu_seqlens
    kw = b.te_kwargs()
    assert kw["cu_seqlens_q"] is kw["cu_seqlens_q_padded"]
    assert kw["pad_between_seqs"] is False
    moved = b.to("cpu")
    assert moved.cu_seqlens_padded is moved.cu_seqlens


def test_pack_pad_to_absorbed_into_last_sequence():
    b = pack_sequences(_samples([3, 5]), pad_multiple=2, pad_to=16, pad_token_id=7)
    assert b.num_tokens == 16
    assert b.cu_seqlens_padded.tolist() == [0, 4, 16]
    assert b.cu_seqlens.tolist() == [0, 3, 8]
    assert b.position_ids[4:].tolist() == list(range(12))
    assert b.input_ids[9:].tolist() == [7] * 7
    assert b.seq_idx[4:].tolist() == [1] * 12
    assert b.max_seqlen == 12
    # Only the tail differs from the real layout? No: the first sequence is padded too.
    assert b.te_kwargs()["pad_between_seqs"] is True


def test_pack_keeps_given_labels_mask_positions():
    s = [
        {
            "input_ids": torch.tensor([5, 6, 7]),
            "labels": torch.tensor([-100, 7, 8]),
            "loss_mask": torch.tensor([0.0, 1.0, 0.5]),
            "position_ids": torch.tensor([10, 11, 12]),
        },
        {"input_ids": torch.tensor([1, 2])},
    ]
    b = pack_sequences(s, pad_multiple=4)
    assert b.labels.tolist() == [-100, 7, 8, -100, 2, -100, -100, -100]
    assert b.loss_mask.tolist() == [0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert b.position_ids.tolist() == [10, 11, 12, 13, 0, 1, 2, 3]


def test_pack_sample_ids_and_lists():
    b = pack_sequences([{"input_ids": [1, 2]}, {"input_ids": np.array([3])}], sample_ids=[40, 7])
    assert b.sample_ids.tolist() == [40, 7]
    assert b.input_ids.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "samples, kwargs, error, match",
    [
        ([], {}, ValueError, "empty"),
        (
            [{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([], dtype=torch.long)}],
            {},
            ValueError,
            "sample 1 has a zero-length",
        ),
        (
            [{"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1])}],
            {},
            ValueError,
            "sample 0: 'labels' has 1 tokens but 'input_ids' has 2",
        ),
        ([{"input_ids": torch.tensor([1.0, 2.0])}], {}, TypeError, "sample 0: 'input_ids' must hold integers"),
        ([{"labels": torch.tensor([1])}], {}, ValueError, "sample 0 has no 'input_ids'"),
        ([{"input_ids": torch.ones(2, 2, dtype=torch.long)}], {}, ValueError, "must be 1-D"),
        ([{"input_ids": torch.tensor([1, 2, 3])}], {"pad_to": 2}, ValueError, "pad_to=2"),
        ([{"input_ids": torch.tensor([1, 2, 3])}], {"pad_multiple": 0}, ValueError, "pad_multiple"),
        (
            [{"input_ids": torch.tensor([1, 2, 3])}],
            {"pad_multiple": 4, "pad_to": 6},
            ValueError,
            "multiple of pad_multiple",
        ),
        (["abc"], {}, TypeError, "sample 0 must be a mapping"),
    ],
)
def test_pack_bad_input(samples, kwargs, error, match):
    with pytest.raises(error, match=match):
        pack_sequences(samples, **kwargs)


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    pad_multiple=st.sampled_from([1, 2, 3, 4, 8, 16]),
    extra=st.integers(0, 3),
    with_labels=st.booleans(),
    seed=st.integers(0, 2**16),
)
@pytest.mark.slow
def test_pack_matches_reference(lengths, pad_multiple, extra, with_labels, seed):
    samples = _samples(lengths, seed, with_labels)
    padded = int(padded_lengths(lengths, pad_multiple).sum())
    pad_to = padded + extra * pad_multiple if extra else None
    b = pack_sequences(samples, pad_multiple=pad_multiple, pad_to=pad_to, pad_token_id=3)
    ref, cu, cu_padded = pack_reference(samples, pad_multiple, pad_to, pad_token_id=3)
    for key, values in ref.items():
        assert getattr(b, key).tolist() == values, key
    assert b.cu_seqlens.tolist() == cu
    assert b.cu_seqlens_padded.tolist() == cu_padded
    # Invariants: tokens come back in order, lengths are real, padding minimal.
    real = b.input_ids[~b.padding_mask]
    assert real.tolist() == torch.cat([s["input_ids"] for s in samples]).tolist()
    assert b.seq_lens().tolist() == list(lengths)
    pl = b.seq_lens_padded().tolist()
    if pad_to is None:
        assert pl == [-(-n // pad_multiple) * pad_multiple for n in lengths]
    assert all(
        p % pad_multiple == 0 and p >= n and p - n < pad_multiple for p, n in zip(pl[:-1], lengths[:-1], strict=True)
    )
    assert b.max_seqlen == max(pl)
    assert b.labels[b.padding_mask].eq(IGNORE_INDEX).all() and b.loss_mask[b.padding_mask].eq(0).all()


# --- pad_multiple_for, filler, split ----------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        ((1,), 1),
        ((2,), 4),
        ((4,), 8),
        ((4, 2, True), 16),
        ((4, 2, False), 8),
        ((1, 4, True), 4),
        ((1, 1, False, True), 16),
        ((3, 1, False, True), 48),
        ((2, 2, True, True), 16),
        ((4, 3, True, True), 48),
    ],
)
def test_pad_multiple_for(args, expected):
    assert pad_multiple_for(*args) == expected


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_pad_multiple_for_rejects(bad):
    with pytest.raises(ValueError, match="cp_size"):
        pad_multiple_for(bad)


def test_split_packed_sample_roundtrip():
    b = pack_sequences(_samples([3, 6, 1], seed=4), pad_multiple=4)
    parts = split_packed_sample(
        {
            "input_ids": b.input_ids,
            "labels": b.labels,
            "cu_seqlens": b.cu_seqlens,
            "cu_seqlens_padded": b.cu_seqlens_padded,
        }
    )
    assert [p["input_ids"].numel() for p in parts] == [3, 6, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), b.input_ids[~b.padding_mask])
    with pytest.raises(ValueError, match="cu_seqlens"):
        split_packed_sample({"input_ids": b.input_ids})


def test_pack_errors_are_seqpack_types():
    with pytest.raises(ConfigError, match="pack_sequences needs at least one sample"):
        pack_sequences([])
    with pytest.raises(SeqpackTypeError, match="pad_multiple must be a positive integer, got 2.0"):
        pack_sequences(_samples([3]), pad_multiple=2.0)
    with pytest.raises(ConfigError, match="pad_to must be an integer >= 0, got -4"):
        pack_sequences(_samples([3]), pad_to=-4)
    with pytest.raises(ConfigError, match="sample_ids has 1 entries for 2 samples"):
        pack_sequences(_samples([3, 2]), sample_ids=[7])
    with pytest.raises(ConfigError, match="sample_ids must hold integers"):
        pack_sequences(_samples([3]), sample_ids=[1.5])
    with pytest.raises(ConfigError, match="pad_multiple must be a positive integer, got 0"):
        padded_lengths([3, 4], 0)


def test_pack_positions_keep_counting_through_pads_with_mixed_presence():
    samples = [
        {"input_ids": torch.tensor([5, 6, 7]), "position_ids": torch.tensor([10, 11, 12])},
        {"input_ids": torch.tensor([1, 2])},
        {"input_ids": torch.tensor([3]), "position_ids": [4]},
    ]
    b = pack_sequences(samples, pad_multiple=4, pad_to=16)
    assert b.position_ids.tolist() == [10, 11, 12, 13, 0, 1, 2, 3] + [4, 5, 6, 7, 8, 9, 10, 11]
    assert b.seq_idx.tolist() == [0] * 4 + [1] * 4 + [2] * 8


# --- split_packed_sample ------------------------------------------------------------------


def test_split_packed_sample_offsets_must_be_integers_and_consistent():
    ids = torch.arange(1, 9)
    with pytest.raises(SeqpackTypeError, match="cu_seqlens must hold integers, got dtype torch.float32"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": torch.tensor([0.0, 3.0, 5.0])})
    with pytest.raises(SeqpackTypeError, match="cu_seqlens_padded must hold integers, got dtype float64"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": [0, 3, 5], "cu_seqlens_padded": [0.0, 4.0, 8.0]})
    with pytest.raises(SampleError, match=r"real length 4 in slot \[3, 6\)"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": [0, 3, 7], "cu_seqlens_padded": [0, 3, 6]})
    with pytest.raises(SampleError, match="cu_seqlens has 3 entries but cu_seqlens_padded has 2"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": [0, 3, 5], "cu_seqlens_padded": [0, 8]})
    # A collate's [1, N+1] offsets are still read as one pack.
    parts = split_packed_sample({"input_ids": ids, "cu_seqlens": torch.tensor([[0, 3, 8]])})
    assert [p["input_ids"].tolist() for p in parts] == [[1, 2, 3], [4, 5, 6, 7, 8]]


def test_split_packed_sample_refuses_offsets_not_starting_at_0():
    # Issue 24 item 5: [2, 4] on 4 tokens used to keep 2 and drop the leading 2 silently.
    ids = torch.arange(1, 5)
    with pytest.raises(SampleError, match=r"cu_seqlens must start at 0, got \[2, 4\]"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": [2, 4]})
    with pytest.raises(SampleError, match=r"cu_seqlens_padded must start at 0, got \[1, 4\]"):
        split_packed_sample({"input_ids": ids, "cu_seqlens": [0, 3], "cu_seqlens_padded": [1, 4]})
    # The wrapper's path names the sample.
    with pytest.raises(SampleError, match=r"sample 7 is pre-packed.*cu_seqlens must start at 0, got \[2, 4\]"):
        sample_sequences({"input_ids": ids, "cu_seqlens": [2, 4]}, where="sample 7")


# --- batch_from_layout ----------------------------------------------------------------------


def _same_batch(a, b, tokens=True):
    for name in (*BATCH_TOKEN_FIELDS, "cu_seqlens", "cu_seqlens_padded", "sample_ids"):
        x, y = getattr(a, name), getattr(b, name)
        if not tokens and name in ("input_ids", "labels", "loss_mask"):
            assert y is None
            continue
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.max_seqlen, a.cp_size, a.cp_rank) == (b.max_seqlen, b.cp_size, b.cp_rank)
    assert (a.cu_seqlens is a.cu_seqlens_padded) == (b.cu_seqlens is b.cu_seqlens_padded)


@given(
    cp=st.sampled_from([1, 2, 4]),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    positions=st.booleans(),
    tokens=st.booleans(),
    seed=st.integers(0, 100),
)
@pytest.mark.slow
def test_batch_from_layout_equals_pack_and_shard(cp, lengths, positions, tokens, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 50, (n,), generator=g)} for n in lengths]
    if positions:
        for s in samples:
            s["position_ids"] = torch.randint(0, 99, (s["input_ids"].numel(),), generator=g)
    full = pack_sequences(samples, pad_multiple=pad_multiple_for(cp), sample_ids=np.arange(len(lengths)) + 10)
    for r in range(cp):
        shard = shard_for_cp(full, cp, r)
        given_tokens = {"input_ids": shard.input_ids, "labels": shard.labels, "loss_mask": shard.loss_mask}
        rebuilt = batch_from_layout(
            full.cu_seqlens.numpy(),  # numpy offsets, as the wire decoder may hand them over
            full.cu_seqlens_padded,
            full.max_seqlen,
            full.sample_ids,
            cp,
            r,
            **(given_tokens if tokens else {}),
            position_ids=shard.position_ids if positions else None,
        )
        _same_batch(shard, rebuilt, tokens=tokens)


def test_batch_from_layout_of_a_filler_equals_padding_only_batch():
    for cp in (1, 2, 4):
        pm = pad_multiple_for(cp)
        ref = shard_for_cp(padding_only_batch(pm), cp, cp - 1)
        got = batch_from_layout([0, 0], [0, pm], pm, [-1], cp, cp - 1)
        _same_batch(ref, got, tokens=False)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (
            ([0, 5], [0, 8], 8, [0], 2, 0),
            {"input_ids": torch.zeros(3, dtype=torch.int64)},
            ConfigError,
            "input_ids has 3 tokens but the layout gives 4 to CP rank 0",
        ),
        (([0, 5], [0, 8], 8, [0, 1]), {}, ConfigError, "sample_ids has 2 entries for 1 samples"),
        (([0, 5.0], [0, 8], 8, [0]), {}, SeqpackTypeError, "cu_seqlens must hold integers"),
        (([0, 9], [0, 8], 8, [0]), {}, ConfigError, r"every real length must be in \[0, padded length\]"),
        (([0, 5], [0, 6], 6, [0], 2, 0), {}, ConfigError, "not divisible by 2\\*cp_size=4"),
        (([0, 5], [0, 8], 8, [0], 2, 2), {}, ConfigError, "cp_rank=2 is out of range for cp_size=2"),
    ],
)
def test_batch_from_layout_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        batch_from_layout(*args, **kwargs)


# --- label_format and num_loss_tokens -----------------------------------------------------------


def _targets_reference(sample, label_format):
    """Token by token: a sample's next-token labels and loss mask (mask 0 where label is -100)."""
    ids = [int(v) for v in sample["input_ids"]]
    n = len(ids)
    given = sample.get("labels")
    mask_given = sample.get("loss_mask")
    labels, mask = [], []
    for t in range(n):
        if label_format == "unshifted":  # token t predicts the label aligned with token t + 1
            label = (int(given[t + 1]) if given is not None else ids[t + 1]) if t + 1 < n else IGNORE_INDEX
            weight = (float(mask_given[t + 1]) if mask_given is not None else 1.0) if t + 1 < n else 0.0
        else:
            label = int(given[t]) if given is not None else (ids[t + 1] if t + 1 < n else IGNORE_INDEX)
            weight = float(mask_given[t]) if mask_given is not None else 1.0
        labels.append(label)
        mask.append(weight if label != IGNORE_INDEX else 0.0)
    return labels, mask


@st.composite
def _labelled_samples(draw):
    samples = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 12))
        # ids apart from the label values: random labels never look like copies of input_ids
        sample = {"input_ids": torch.tensor(draw(st.lists(st.integers(50, 80), min_size=n, max_size=n)))}
        if draw(st.booleans()):
            labels = draw(st.lists(st.sampled_from([IGNORE_INDEX, 1, 2, 3, 40]), min_size=n, max_size=n))
            sample["labels"] = torch.tensor(labels)
        if draw(st.booleans()):
            sample["loss_mask"] = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))
        samples.append(sample)
    return samples


@given(samples=_labelled_samples(), pad_multiple=st.sampled_from([1, 4]), fmt=st.sampled_from(["shifted", "unshifted"]))
@pytest.mark.slow
def test_packed_targets_follow_label_format_token_by_token(samples, pad_multiple, fmt):
    batch = pack_sequences(samples, pad_multiple=pad_multiple, label_format=fmt)
    real = ~batch.padding_mask
    labels, mask = [], []
    for sample in samples:
        sample_labels, sample_mask = _targets_reference(sample, fmt)
        labels += sample_labels
        mask += sample_mask
    assert batch.labels[real].tolist() == labels and batch.loss_mask[real].tolist() == mask
    assert (batch.labels[~real] == IGNORE_INDEX).all() and (batch.loss_mask[~real] == 0).all()
    supervised = [label != IGNORE_INDEX and weight > 0 for label, weight in zip(labels, mask, strict=True)]
    assert batch.num_loss_tokens == sum(supervised)


@given(samples=_labelled_samples())
@pytest.mark.slow
def test_unshifted_and_shifted_labels_give_the_same_pack(samples):
    """HF-aligned labels and the same targets given as next-token labels pack identically."""
    shifted = []
    for sample in samples:
        labels, mask = _targets_reference(sample, "unshifted")
        shifted.append(
            {"input_ids": sample["input_ids"], "labels": torch.tensor(labels), "loss_mask": torch.tensor(mask)}
        )
    a = pack_sequences(samples, pad_multiple=4, label_format="unshifted")
    b = pack_sequences(shifted, pad_multiple=4, label_format="shifted")
    for name in BATCH_TOKEN_FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.num_loss_tokens == b.num_loss_tokens


def test_num_loss_tokens_is_the_whole_microbatchs_and_survives_sharding_and_copies():
    samples = [
        {"input_ids": torch.arange(1, 8)},
        {"input_ids": torch.arange(1, 4), "labels": torch.tensor([-100, 2, 3])},
    ]
    batch = pack_sequences(samples, pad_multiple=4)
    assert batch.num_loss_tokens == 6 + 2 == int(((batch.labels != IGNORE_INDEX) & (batch.loss_mask > 0)).sum())
    shards = [shard_for_cp(batch, 2, r) for r in range(2)]
    assert [s.num_loss_tokens for s in shards] == [8, 8]  # the microbatch's, not the shard's
    assert sum(int((s.loss_mask > 0).sum()) for s in shards) == 8
    assert batch.to("cpu").num_loss_tokens == 8 and padding_only_batch(4).num_loss_tokens == 0
    unknown = batch_from_layout(batch.cu_seqlens, batch.cu_seqlens_padded, batch.max_seqlen, [0, 1])
    assert unknown.num_loss_tokens is None  # the layout alone does not know it


def test_label_format_is_checked():
    with pytest.raises(
        ConfigError, match=r"label_format must be one of \('shifted', 'unshifted', 'position_aligned'\), got 'HF'"
    ):
        pack_sequences([{"input_ids": torch.arange(3)}], label_format="HF")


@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 6)), max_size=20))
def test_ranges_lays_spans_end_to_end(spans):
    from seqpack.thd.padding import ranges

    starts = np.array([s for s, _ in spans], dtype=np.int64)
    counts = np.array([c for _, c in spans], dtype=np.int64)
    got = ranges(starts, counts)
    assert got.dtype == np.int64
    assert got.tolist() == [s + k for s, c in spans for k in range(c)]
