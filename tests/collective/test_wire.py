"""Wire format and layout rebuilding: pure, no processes."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from wrapper_data import FIELDS  # the batch fields the wire carries

from seqpack.collective import (
    FORMAT_VERSION,
    Status,
    StepEnd,
    StepError,
    StepOk,
    WireBuffers,
    agree,
    decode_prefix,
    decode_step,
    encode_step,
    gather_lengths,
)
from seqpack.collective.wire import MB_WORDS, MICROBATCH_FIELDS, PREFIX_WORDS, STEP_WORDS, Kind
from seqpack.schedulers import get_scheduler
from seqpack.stats import StepStats
from seqpack.thd import batch_from_layout, pack_sequences, pad_multiple_for, padding_only_batch, shard_for_cp


def _message(cp=2, cp_rank=1, dp=2, lengths=(5, 3, 9, 1, 12, 7, 2, 13), positions=False, seed=0):
    """A real step: schedule over dp replicas, replica 0's microbatches packed and CP-sharded."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for n in lengths:
        s = {"input_ids": torch.randint(1, 1000, (n,), generator=g)}
        if positions:
            s["position_ids"] = torch.arange(n) + 3
        samples.append(s)
    pm = pad_multiple_for(cp)
    # Replica 0 holds three samples (two microbatches), replica 1 the rest (three): replica 0
    # gets an empty cell in the last round.
    origin = np.array([0] * 3 + [1] * (len(lengths) - 3))
    sched = get_scheduler("empty").schedule(
        np.array(lengths), dp_size=dp, cp_size=cp, max_tokens_per_rank=8, pad_multiple=pm, origin=origin
    )
    batches = []
    for m in range(sched.num_microbatches):
        ids = sched.assignment[m][0]
        b = (
            padding_only_batch(pm)
            if ids.size == 0
            else pack_sequences([samples[i] for i in ids], pad_multiple=pm, sample_ids=ids)
        )
        batches.append(shard_for_cp(b, cp, cp_rank))
    return StepOk(step=7, schedule=sched, microbatches=batches, empty_samples=2, position_ids=positions)


def _same_batch(a, b, tokens=True):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if not tokens and name in ("input_ids", "labels", "loss_mask"):
            assert y is None
            continue
        assert x.dtype == y.dtype, name
        assert torch.equal(x, y), name
    assert (a.max_seqlen, a.cp_size, a.cp_rank, a.cp_layout) == (b.max_seqlen, b.cp_size, b.cp_rank, b.cp_layout)
    assert (a.cu_seqlens is a.cu_seqlens_padded) == (b.cu_seqlens is b.cu_seqlens_padded)


@pytest.mark.parametrize("positions", [False, True])
def test_batch_round_trip_is_exact(positions):
    msg = _message(positions=positions)
    sched = msg.schedule
    assert sched.num_microbatches > 1  # not vacuous: several microbatches ...
    assert any(b.sample_ids.tolist() == [-1] for b in msg.microbatches)  # ... one a padding filler ...
    assert any(b.num_sequences > 1 for b in msg.microbatches)  # ... one with several sequences
    assert any(bool(b.padding_mask.any()) for b in msg.microbatches if b.sample_ids[0] >= 0)
    wire = encode_step(msg, kind=Kind.BATCH)
    assert wire.prefix.dtype == torch.int64 and wire.ints.dtype == torch.int64
    assert wire.prefix.shape == (PREFIX_WORDS,) and int(wire.prefix[0]) == FORMAT_VERSION
    assert wire.floats.dtype == torch.float32  # loss_mask only
    assert wire.floats.numel() == sum(b.num_tokens for b in msg.microbatches)
    got = decode_step(wire)
    assert got.status == Status.OK and got.step == 7 and got.empty_samples == 2 and got.position_ids == positions
    assert got.schedule.fingerprint() == sched.fingerprint()
    for name in ("lengths", "original_lengths", "deferred", "dropped", "truncated"):
        assert np.array_equal(getattr(got.schedule, name), getattr(sched, name))
    assert StepStats.from_schedule(got.schedule) == StepStats.from_schedule(sched)
    assert len(got.microbatches) == len(msg.microbatches)
    for a, b in zip(msg.microbatches, got.microbatches, strict=True):
        _same_batch(a, b)


def test_schedule_and_shards_keep_their_own_cp_size():
    msg = _message(cp=2, cp_rank=0)
    sched = msg.schedule
    # The same shards under a schedule made for cp=1: both sizes survive, the fingerprint too.
    plain = get_scheduler("empty").schedule(
        sched.original_lengths, dp_size=2, max_tokens_per_rank=16, pad_multiple=4, origin=np.array([0] * 3 + [1] * 5)
    )
    assert plain.num_microbatches == sched.num_microbatches and plain.cp_size == 1
    got = decode_step(encode_step(dataclasses.replace(msg, schedule=plain)))
    assert got.schedule.cp_size == 1 and got.microbatches[0].cp_size == 2


def test_layout_round_trip_has_no_tokens():
    msg = _message(cp=4, cp_rank=2)
    wire = encode_step(msg, kind=Kind.LAYOUT)
    assert wire.floats.numel() == 0
    batch_wire = encode_step(msg, kind=Kind.BATCH)
    assert wire.ints.numel() < batch_wire.ints.numel()
    got = decode_step(wire)
    for a, b in zip(msg.microbatches, got.microbatches, strict=True):
        _same_batch(a, b, tokens=False)


def test_counts_stay_exact_beyond_float32():
    # Sums of squares far above 2**24 (float32's exact range) survive the wire exactly.
    lengths = np.array([40_000, 65_537, 3, 100_003], dtype=np.int64)
    sched = get_scheduler("empty").schedule(lengths, dp_size=1, max_tokens_per_rank=200_000)
    batches = [
        batch_from_layout(
            np.r_[0, np.cumsum(lengths[ids])], np.r_[0, np.cumsum(lengths[ids])], int(lengths[ids].max()), ids
        )
        for ids in (row[0] for row in sched.assignment)
    ]
    msg = StepOk(0, schedule=sched, microbatches=batches)
    stats = StepStats.from_schedule(decode_step(encode_step(msg, kind=Kind.LAYOUT)).schedule)
    assert stats.seqlen_sq_sum == sum(int(v) ** 2 for v in lengths) > 2**24
    assert stats.seqlen_sum == int(lengths.sum())


@pytest.mark.parametrize("status", [Status.END, Status.ERROR])
def test_status_messages_round_trip(status):
    if status == Status.END:
        msg = StepEnd(3, dropped_at_end=11, empty_samples=2)
    else:
        msg = StepError(3, "bad input on DP rank 1: naïve", rank=5)
    wire = encode_step(msg)
    assert int(wire.prefix[2]) == status
    got = decode_step(wire)
    assert got == msg and got.status == status


def test_an_error_without_a_rank_round_trips():
    msg = StepError(4, "ranks of the cp group disagree on schedules")
    assert decode_step(encode_step(msg)) == msg


def test_version_mismatch_is_an_error():
    wire = encode_step(_message())
    prefix = wire.prefix.clone()
    prefix[0] = FORMAT_VERSION + 1
    with pytest.raises(
        ValueError, match=rf"wire format version {FORMAT_VERSION + 1} received.*version {FORMAT_VERSION}"
    ):
        decode_prefix(prefix)
    with pytest.raises(ValueError, match="version"):
        decode_step(dataclasses.replace(wire, prefix=prefix))


def test_truncated_and_oversized_buffers_are_errors():
    wire = encode_step(_message())
    with pytest.raises(ValueError, match=r"truncated int64 buffer: the wire prefix declares \d+ words, got \d+"):
        decode_step(dataclasses.replace(wire, ints=wire.ints[:-1]))
    with pytest.raises(ValueError, match="truncated float32 buffer"):
        decode_step(dataclasses.replace(wire, floats=wire.floats[:-3]))
    with pytest.raises(ValueError, match="oversized int64 buffer"):
        decode_step(dataclasses.replace(wire, ints=torch.cat([wire.ints, torch.zeros(2, dtype=torch.int64)])))
    with pytest.raises(ValueError, match=r"wire prefix has 5 words, expected 8"):
        decode_prefix(wire.prefix[:5])
    # A prefix that lies about the header: the arithmetic is in the message.
    prefix = wire.prefix.clone()
    prefix[3] += 1
    with pytest.raises(
        ValueError, match=rf"header_len=\d+ but \d+ microbatches need 8 \+ {STEP_WORDS} \+ {MB_WORDS}\*\d+ = \d+"
    ):
        decode_prefix(prefix)


def test_corrupted_payload_fails_the_fingerprint():
    msg = _message()
    wire = encode_step(msg)
    ints = wire.ints.clone()
    body = STEP_WORDS + MB_WORDS * int(wire.prefix[7])
    ints[body + msg.schedule.num_sequences] += 1  # first scheduled length
    with pytest.raises(ValueError, match="fingerprint"):
        decode_step(dataclasses.replace(wire, ints=ints))


def test_encode_rejects_bad_messages():
    msg = _message()
    with pytest.raises(ValueError, match="kind must be"):
        encode_step(msg, kind=3)
    with pytest.raises(ValueError, match="needs its schedule"):
        encode_step(StepOk(0, None, []))
    stripped = dataclasses.replace(msg, microbatches=[dataclasses.replace(b, input_ids=None) for b in msg.microbatches])
    with pytest.raises(ValueError, match="microbatch 0 has no tokens"):
        encode_step(stripped, kind=Kind.BATCH)
    encode_step(stripped, kind=Kind.LAYOUT)  # fine: layout only


@given(
    cp=st.sampled_from([1, 2, 4]),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    positions=st.booleans(),
    seed=st.integers(0, 100),
)
@pytest.mark.slow
def test_layout_rebuild_equals_pack_and_shard(cp, lengths, positions, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 50, (n,), generator=g)} for n in lengths]
    if positions:
        for s in samples:
            s["position_ids"] = torch.randint(0, 99, (s["input_ids"].numel(),), generator=g)
    full = pack_sequences(samples, pad_multiple=pad_multiple_for(cp), sample_ids=np.arange(len(lengths)) + 10)
    for r in range(cp):
        shard = shard_for_cp(full, cp, r)
        rebuilt = batch_from_layout(
            full.cu_seqlens,
            full.cu_seqlens_padded,
            full.max_seqlen,
            full.sample_ids,
            cp,
            r,
            input_ids=shard.input_ids,
            labels=shard.labels,
            loss_mask=shard.loss_mask,
            position_ids=shard.position_ids if positions else None,
        )
        _same_batch(shard, rebuilt)


def test_layout_rebuild_of_filler_equals_padding_only_batch():
    for cp in (1, 2, 4):
        pm = pad_multiple_for(cp)
        ref = shard_for_cp(padding_only_batch(pm), cp, cp - 1)
        got = batch_from_layout([0, 0], [0, pm], pm, [-1], cp, cp - 1)
        _same_batch(ref, got, tokens=False)


def test_batch_from_layout_checks_token_counts():
    with pytest.raises(ValueError, match="input_ids has 3 tokens but the layout gives 4 to CP rank 0"):
        batch_from_layout([0, 5], [0, 8], 8, [0], 2, 0, input_ids=torch.zeros(3, dtype=torch.int64))


def test_single_rank_collectives_need_no_process_group():
    got = gather_lengths([3, 1, 4], None, extras=[7, 8])
    assert got.lengths.tolist() == [3, 1, 4] and got.counts.tolist() == [3] and got.extras.tolist() == [[7, 8]]
    assert got.origin().tolist() == [0, 0, 0] and got.offsets.tolist() == [0, 3]
    with pytest.raises(ValueError, match="sample 2 is bad"):
        gather_lengths([3], None, error="sample 2 is bad")
    ended, failed = agree(Status.END, None, None), agree(Status.ERROR, "boom", None)
    assert (ended.status, failed.status, failed.message) == (Status.END, Status.ERROR, "boom")
    with pytest.raises(ValueError, match="status must be one of"):
        agree(5, None, None)


def test_wire_buffers_report_their_size():
    wire = encode_step(_message())
    assert isinstance(wire, WireBuffers)
    assert wire.nbytes == 8 * (wire.prefix.numel() + wire.ints.numel()) + 4 * wire.floats.numel()


def test_docs_wire_tables_are_generated_from_the_header_declaration():
    from pathlib import Path

    from seqpack.collective.fields import Header, headers_markdown
    from seqpack.collective.wire import MICROBATCH_FIELDS, PREFIX_FIELDS, STEP_FIELDS

    tables = headers_markdown(
        (
            Header("prefix (int64, fixed size)", PREFIX_FIELDS),
            Header("step header (int64, after the prefix)", STEP_FIELDS),
            Header("per microbatch (int64, after the step header)", MICROBATCH_FIELDS),
        )
    )
    text = (Path(__file__).resolve().parents[2] / "docs" / "wrapper.md").read_text()
    begin, end = "<!-- wire-format:begin -->\n", "<!-- wire-format:end -->"
    assert text[text.index(begin) + len(begin) : text.index(end)] == tables


def test_docs_gather_tables_are_generated_from_their_declarations():
    from pathlib import Path

    from seqpack.collective.agree import AGREEMENT
    from seqpack.collective.fields import headers_markdown
    from seqpack.collective.length_gather import GATHER_HEADER
    from seqpack.loader.gather_fields import SAMPLE_COLUMNS, STEP_GATHER_FIELDS

    tables = headers_markdown((GATHER_HEADER, STEP_GATHER_FIELDS, SAMPLE_COLUMNS, AGREEMENT))
    text = (Path(__file__).resolve().parents[2] / "docs" / "wrapper.md").read_text()
    begin, end = "<!-- gather-format:begin -->\n", "<!-- gather-format:end -->"
    assert "key_mask" in tables and "fingerprint_complement" in tables
    assert text[text.index(begin) + len(begin) : text.index(end)] == tables


@pytest.mark.parametrize("kind", ["batch", "layout"])
def test_the_cp_layout_travels_on_the_wire(kind):
    msg = _message(cp=2, cp_rank=1)
    contiguous = [
        shard_for_cp(
            pack_sequences([{"input_ids": torch.arange(n) + 1} for n in (5, 9)], pad_multiple=4, sample_ids=[0, 1]),
            2,
            1,
            layout="contiguous",
        )
        for _ in msg.microbatches
    ]
    msg = dataclasses.replace(msg, microbatches=contiguous)
    got = decode_step(encode_step(msg, kind=Kind.BATCH if kind == "batch" else Kind.LAYOUT))
    assert all(b.cp_layout == "contiguous" for b in got.microbatches)
    for a, b in zip(msg.microbatches, got.microbatches, strict=True):
        _same_batch(a, b, tokens=kind == "batch")
    mixed = dataclasses.replace(msg, microbatches=[*contiguous[:-1], _message(cp=2, cp_rank=1).microbatches[-1]])
    with pytest.raises(ValueError, match=r"\(contiguous\), microbatch 0|\(dualchunk\), microbatch 0"):
        encode_step(mixed)


def test_minibatch_bounds_and_counts_round_trip():
    msg = _message()
    m = len(msg.microbatches)
    assert m >= 3
    for bounds, counts, expected in [
        ((0, 1, m), (11, 22), {"minibatch_bounds": (0, 1, m), "minibatch_loss_tokens": (11, 22)}),
        ((0, m), None, {"minibatch_bounds": None, "minibatch_loss_tokens": None}),  # one mini-batch: nothing
    ]:
        counted = [dataclasses.replace(b, num_loss_tokens=1) for b in msg.microbatches]
        sent = dataclasses.replace(
            msg, microbatches=counted, num_loss_tokens=33, minibatch_bounds=bounds, minibatch_loss_tokens=counts
        )
        got = decode_step(encode_step(sent))
        assert {k: getattr(got, k) for k in expected} == expected
    # Uncounted: the bounds travel, the counts do not.
    got = decode_step(encode_step(dataclasses.replace(msg, minibatch_bounds=(0, 2, m))))
    assert (got.minibatch_bounds, got.minibatch_loss_tokens) == ((0, 2, m), None)


def test_bad_minibatch_bounds_are_refused():
    msg = _message()
    m = len(msg.microbatches)
    for bounds in [(1, m), (0, 2, 1, m), (0, m + 1)]:
        with pytest.raises(ValueError, match="minibatch_bounds"):
            encode_step(dataclasses.replace(msg, minibatch_bounds=bounds))
    with pytest.raises(ValueError, match="2 minibatch_loss_tokens for 3 mini-batches"):
        encode_step(
            dataclasses.replace(msg, num_loss_tokens=0, minibatch_bounds=(0, 1, 2, m), minibatch_loss_tokens=(1, 2))
        )
    wire = encode_step(dataclasses.replace(msg, minibatch_bounds=(0, 1, m)))
    ints = wire.ints.clone()
    field = [name for name, _ in MICROBATCH_FIELDS].index("minibatch")
    ints[STEP_WORDS + MB_WORDS * 1 + field] = 2  # microbatch 1 claims mini-batch 2: a skipped number
    with pytest.raises(ValueError, match="do not run 0, 1"):
        decode_step(dataclasses.replace(wire, ints=ints))


@pytest.mark.parametrize("kind", [Kind.BATCH, Kind.LAYOUT])
def test_where_zero_length_sequences_were_read_travels_and_is_checked(kind):
    from seqpack.errors import WireError

    msg = dataclasses.replace(_message(), empty_at=(0, 2, 2, 5))
    assert decode_step(encode_step(msg, kind=kind)).empty_at == (0, 2, 2, 5)
    assert decode_step(encode_step(_message(), kind=kind)).empty_at == ()
    n = msg.schedule.num_sequences
    for bad in [(3, 1), (-1,), (n + 1,)]:
        wire = encode_step(dataclasses.replace(msg, empty_at=bad), kind=kind)
        with pytest.raises(WireError, match=r"empty_at \[.*\] is not ascending within 0\.\." + str(n)):
            decode_step(wire)
