"""The loss contract on one rank: label_format through the wrapper, the per-sample loss-token
counts that ride the length gather (fast counts against the packer and a slow reference),
Step.num_loss_tokens, the copied-labels guard per sample and per step, the wire fields that
carry the counts, and the collate friction message."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from wrapper_data import repeating_items

from seqpack.collective import gather_lengths
from seqpack.collective.fields import Header
from seqpack.collective.wire import STEP_FIELDS, StepOk, decode_step, encode_step
from seqpack.cost import default_cost_model
from seqpack.errors import ResumeError, SampleError, SeqpackTypeError, StepFailed, WireError
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.loader.labels import loss_token_counts, misaligned_step_message, prepare_labels
from seqpack.loader.resume import StateKey
from seqpack.options import LABEL_COPY_MIN_TOKENS, LabelFormat
from seqpack.schedulers import get_scheduler
from seqpack.thd import IGNORE_INDEX, SAMPLES_NOT_BATCHES, count_loss_tokens, pack_sequences
from seqpack.topology import Topology

FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask", "cu_seqlens")


def _sample(rng: np.random.Generator, n: int, *, labels: bool, mask: bool, hf: bool = False) -> dict:
    ids = torch.from_numpy(rng.integers(0, 50, n))
    out = {"input_ids": ids}
    if labels:
        lab = ids.clone() if hf else torch.from_numpy(rng.integers(0, 50, n))
        lab[torch.from_numpy(rng.random(n) < 0.3)] = IGNORE_INDEX
        out["labels"] = lab
    if mask:
        out["loss_mask"] = torch.from_numpy(rng.choice([0.0, 0.5, 1.0], n).astype(np.float32))
    return out


# --- per-sample counts: fast against the packer and the slow reference ---------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
    st.none() | st.integers(1, 20),
    st.integers(0, 2**32 - 1),
)
@pytest.mark.slow
def test_loss_token_counts_equal_the_packed_count_of_each_truncated_sequence(lengths, labels, mask, cut, seed):
    rng = np.random.default_rng(seed)
    pool = [_sample(rng, n, labels=labels, mask=mask) for n in lengths]
    got = loss_token_counts(pool, cut)
    truncated = [{k: v[: cut or n] for k, v in s.items()} for s, n in zip(pool, lengths, strict=True)]
    slow = [count_loss_tokens(s) for s in truncated]  # the slow reference, one sequence at a time
    packed = [pack_sequences([s]).num_loss_tokens for s in truncated]
    assert got.dtype == np.int64 and got.tolist() == slow == packed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 25), min_size=1, max_size=6), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
@pytest.mark.slow
def test_unshifted_labels_converted_at_read_pack_like_pack_sequences_unshifted(lengths, labels, mask, seed):
    rng = np.random.default_rng(seed)
    samples = [_sample(rng, n, labels=labels, mask=mask, hf=True) for n in lengths]
    converted, checked, misaligned = prepare_labels(samples, ["s"] * len(samples), LabelFormat.UNSHIFTED)
    assert misaligned == 0 and checked <= sum(int((s["labels"] != IGNORE_INDEX).sum()) for s in samples if labels)
    added = {"labels"} if labels or mask else set()
    assert all(set(c) == set(s) | added for c, s in zip(converted, samples, strict=True))
    want = pack_sequences(samples, pad_multiple=4, label_format="unshifted")
    got = pack_sequences(converted, pad_multiple=4)  # seqpack's form: shifted
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.num_loss_tokens == want.num_loss_tokens == int(loss_token_counts(converted).sum())


def test_shifted_labels_that_copy_input_ids_are_refused_naming_the_sample_and_label_format():
    rng = np.random.default_rng(0)
    fine = _sample(rng, 20, labels=True, mask=False)
    hf = {"input_ids": torch.arange(30), "labels": torch.arange(30)}
    hf["labels"][:10] = IGNORE_INDEX
    with pytest.raises(
        SampleError,
        match=r"sample 7 of this rank's data: labels equal input_ids on 20 of 20 .*label_format='unshifted'",
    ):
        prepare_labels([fine, hf], ["sample 3", "sample 7 of this rank's data"], LabelFormat.SHIFTED)
    samples, supervised, copied = prepare_labels([fine], ["sample 3"], LabelFormat.SHIFTED)
    assert samples == [fine] and supervised == int((fine["labels"] != IGNORE_INDEX).sum()) > 0 and copied == 0
    assert prepare_labels([hf], ["x"], LabelFormat.UNSHIFTED)[1:] == (20, 0)  # never refused as declared


@pytest.mark.parametrize("label_format", [LabelFormat.SHIFTED, LabelFormat.UNSHIFTED])
def test_the_step_guard_sums_short_answers_the_per_sample_check_lets_through(label_format):
    few = LABEL_COPY_MIN_TOKENS - 1
    assert misaligned_step_message(4, few, few, label_format) is None  # too few to judge
    assert misaligned_step_message(4, 100, 89, label_format) is None
    message = misaligned_step_message(4, 100, 90, label_format)
    assert message is not None and "step 4" in message and f"label_format='{label_format}'" in message


# --- the length gather's per-sample columns and the wire fields ----------------------------


def test_gather_lengths_returns_the_sample_columns_in_global_order():
    got = gather_lengths([3, 1], None, columns=np.array([[7, 1], [9, 2]]))
    assert got.columns.tolist() == [[7, 1], [9, 2]] and got.columns.dtype == np.int64
    assert gather_lengths([3, 1], None).columns.shape == (2, 0)
    with pytest.raises(SeqpackTypeError, match=r"columns must be a \[2, c\] table"):
        gather_lengths([3, 1], None, columns=np.array([1, 2]))
    with pytest.raises(SeqpackTypeError, match="columns must be integers"):
        gather_lengths([3], None, columns=np.array([[0.5]]))
    table = Header("t", (("a", ""), ("b", ""))).rows(2, a=np.array([1, 2]), b=np.array([3, 4]))
    assert table.tolist() == [[1, 3], [2, 4]]
    with pytest.raises(KeyError, match="expected"):
        Header("t", (("a", ""),)).rows(1, b=np.array([1]))


def _message(counted: bool) -> StepOk:
    samples = [{"input_ids": torch.arange(n)} for n in (5, 3, 7)]
    plan = get_scheduler("empty").schedule(np.array([5, 3, 7]), dp_size=1, max_tokens_per_rank=8)
    batches = [
        pack_sequences([samples[i] for i in ids.tolist()], sample_ids=ids) for ids in (r[0] for r in plan.assignment)
    ]
    return StepOk(0, plan, batches, num_loss_tokens=12 if counted else None)


def test_the_wire_carries_the_step_and_microbatch_counts_only_when_the_step_has_them():
    msg = _message(True)
    for kind in (1, 2):  # TP (tokens) and PP (layout only) receivers get them alike
        got = decode_step(encode_step(msg, kind=kind))
        assert got.num_loss_tokens == 12
        assert [b.num_loss_tokens for b in got.microbatches] == [b.num_loss_tokens for b in msg.microbatches]
    assert sum(b.num_loss_tokens for b in msg.microbatches) == 12
    plain = decode_step(encode_step(_message(False)))
    assert plain.num_loss_tokens is None and all(b.num_loss_tokens is None for b in plain.microbatches)
    broken = dataclasses.replace(
        msg, microbatches=[dataclasses.replace(msg.microbatches[0], num_loss_tokens=None)] + msg.microbatches[1:]
    )
    with pytest.raises(WireError, match="microbatch 0 has no num_loss_tokens"):
        encode_step(broken)
    wire = encode_step(msg)
    ints = wire.ints.clone()
    ints[[name for name, _ in STEP_FIELDS].index("num_loss_tokens")] = -5  # the step header's count
    with pytest.raises(WireError, match="num_loss_tokens -5 of the step: corrupted"):
        decode_step(dataclasses.replace(wire, ints=ints))


# --- through the wrapper ------------------------------------------------------------------


def _hf_items(count: int, answer: int, seed: int = 0):
    """HF-style samples: labels copy input_ids, -100 on a prompt; answers of ``answer`` tokens."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        prompt = int(rng.integers(1, 12))
        ids = torch.from_numpy(rng.integers(0, 97, prompt + answer))
        labels = ids.clone()
        labels[:prompt] = IGNORE_INDEX
        yield {"input_ids": ids, "labels": labels}


def _shifted(item: dict) -> dict:
    """The same sample with next-token labels (what "unshifted" must turn it into)."""
    labels = torch.full_like(item["labels"], IGNORE_INDEX)
    labels[:-1] = item["labels"][1:]
    return {"input_ids": item["input_ids"], "labels": labels}


def _wrap(data, **kwargs):
    kwargs = {"samples_per_rank": 6, "max_tokens_per_rank": 48, "scheduler": "balanced", "pad_multiple": 4, **kwargs}
    return wrap_data_iterator(data, Topology.single(), **kwargs)


def test_unshifted_through_the_wrapper_equals_the_shifted_data_and_counts_every_supervised_token():
    hf = list(_hf_items(24, answer=9))
    a = list(_wrap(iter(hf), label_format="unshifted"))
    b = list(_wrap(iter([_shifted(s) for s in hf])))
    assert len(a) == len(b) == 4
    # HF's count: every label but the first of each sequence (which nothing predicts).
    expected_total = sum(int((s["labels"][1:] != IGNORE_INDEX).sum()) for s in hf)
    assert sum(step.num_loss_tokens for step in a) == expected_total == 24 * 9
    for x, y in zip(a, b, strict=True):
        assert x.num_loss_tokens == y.num_loss_tokens == sum(mb.num_loss_tokens for mb in x.microbatches)
        for p, q in zip(x.microbatches, y.microbatches, strict=True):
            assert p.num_loss_tokens == int(((p.labels != IGNORE_INDEX) & (p.loss_mask > 0)).sum())
            for name in FIELDS:
                assert torch.equal(getattr(p, name), getattr(q, name)), name


def test_trl_rows_with_a_completion_mask_equal_hf_labels_under_unshifted():
    # TRL's tokenized rows carry input_ids and a completion_mask aligned with them; its collator
    # makes HF labels (-100 where the mask is 0). Given as loss_mask, seqpack shifts it alike.
    hf = list(_hf_items(12, answer=9))
    trl = [
        {"input_ids": s["input_ids"], "loss_mask": (s["labels"] != IGNORE_INDEX).to(torch.int64).tolist()} for s in hf
    ]
    a = list(_wrap(iter(hf), label_format="unshifted"))
    b = list(_wrap(iter(trl), label_format="unshifted"))
    assert [s.num_loss_tokens for s in a] == [s.num_loss_tokens for s in b] == [54, 54]
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.microbatches, y.microbatches, strict=True):
            assert torch.equal(p.input_ids, q.input_ids) and torch.equal(p.loss_mask, q.loss_mask)
            supervised = p.loss_mask > 0
            assert torch.equal(p.labels[supervised], q.labels[supervised])


@pytest.mark.parametrize("on_oversize", ["truncate", "drop"])
def test_oversize_sequences_count_as_trained(on_oversize):
    rng = np.random.default_rng(1)
    data = [_sample(rng, n, labels=True, mask=True) for n in (10, 70, 30, 5, 90, 12)]  # capacity 48
    (step,) = _wrap(iter(data), on_oversize=on_oversize)
    cut = 48 if on_oversize == "truncate" else 0
    want = sum(
        count_loss_tokens({k: v[: cut if n > 48 else n] for k, v in s.items()}) if n <= 48 or cut else 0
        for s, n in zip(data, (10, 70, 30, 5, 90, 12), strict=True)
    )
    assert step.num_loss_tokens == want == sum(mb.num_loss_tokens for mb in step.microbatches)
    assert step.stats.truncated_sequences + step.stats.dropped_sequences == 2


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
@pytest.mark.slow
def test_deferred_samples_are_counted_in_the_step_that_trains_them_also_after_resume(label_format):
    from wrapper_data import ScatterScheduler

    rng = np.random.default_rng(2)
    hf = label_format == "unshifted"  # deferred samples are saved converted, never shifted twice
    data = [_sample(rng, int(n), labels=True, mask=True, hf=hf) for n in rng.integers(1, 40, 18)]

    def wrap():
        return _wrap(
            iter(data), scheduler=ScatterScheduler(defer_longest=True), drop_last=False, label_format=label_format
        )

    full = list(wrap())
    assert any(step.schedule.deferred.size for step in full)
    totals = [step.num_loss_tokens for step in full]
    assert sum(totals) == sum(count_loss_tokens(s, label_format) for s in data)  # every sample once
    it = wrap()
    next(it)
    state = it.state_dict()
    assert state[StateKey.DEFERRED_SAMPLES]
    resumed = wrap()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert [step.num_loss_tokens for step in again] == totals[1:]
    for x, y in zip(again, full[1:], strict=True):
        for p, q in zip(x.microbatches, y.microbatches, strict=True):
            assert torch.equal(p.labels, q.labels) and torch.equal(p.loss_mask, q.loss_mask)


def test_label_format_is_in_the_fingerprint():
    base = PackingConfig(samples_per_rank=6, max_tokens_per_rank=48)
    assert base.summary()["label_format"] == "shifted"
    assert base.replace(label_format="shifted").fingerprint() == base.fingerprint()
    unshifted = base.replace(label_format=LabelFormat.UNSHIFTED)
    assert unshifted.summary()["label_format"] == "unshifted" and unshifted.fingerprint() != base.fingerprint()
    with pytest.raises(
        ValueError, match=r"label_format must be one of \('shifted', 'unshifted', 'position_aligned'\), got 'hf'"
    ):
        base.replace(label_format="hf")
    data = [{"input_ids": torch.arange(n)} for n in range(1, 13)]
    it = _wrap(iter(data))
    next(it)
    state = it.state_dict()
    with pytest.raises(ResumeError, match="label_format: 'shifted' \\(saved\\) vs 'unshifted' \\(here\\)"):
        _wrap(iter(data), label_format="unshifted").load_state_dict(state)
    again = _wrap(iter(data), label_format="shifted")  # the default, spelled out: the same data
    again.load_state_dict(state)
    assert next(again).step == 1


def test_hf_labels_under_shifted_are_refused_per_sample_and_per_step():
    # Long answers: the sample itself is refused (SampleError behind the StepFailed).
    with pytest.raises(StepFailed, match=r"sample 0 of this rank's data.*label_format='unshifted'") as failed:
        next(_wrap(_hf_items(6, answer=12)))
    assert isinstance(failed.value.__cause__, SampleError)
    # Answers of 3 tokens pass the per-sample check; the step's sums do not.
    with pytest.raises(
        StepFailed, match=r"step 0 \(the samples of every DP rank\): labels equal input_ids .*label_format"
    ) as failed:
        next(_wrap(_hf_items(6, answer=3)))
    assert isinstance(failed.value.__cause__, SampleError)
    assert next(_wrap(_hf_items(6, answer=3), label_format="unshifted")).num_loss_tokens == 6 * 3


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
def test_labels_in_the_other_alignment_are_refused_per_sample_and_per_step_whatever_repeats(label_format):
    wrong = label_format == "unshifted"  # next-token labels declared unshifted, or HF labels declared shifted
    said = "the next token of input_ids" if wrong else "input_ids"
    # Answers of 20 tokens, 3 repeats (85% copies of all supervised tokens): the sample is refused.
    with pytest.raises(StepFailed, match=rf"sample 0 of this rank's data.*: labels equal {said} on 17 of 17") as failed:
        next(_wrap(repeating_items(6, 20, 3, next_token=wrong), label_format=label_format))
    assert isinstance(failed.value.__cause__, SampleError)
    # Answers of 6 tokens, 1 repeat: 5 checked tokens pass each sample; the step's 6 x 5 do not.
    with pytest.raises(
        StepFailed, match=rf"step 0 \(the samples of every DP rank\): labels equal {said} on 30 of 30 .*label_format"
    ) as failed:
        next(_wrap(repeating_items(6, 6, 1, next_token=wrong), label_format=label_format))
    assert isinstance(failed.value.__cause__, SampleError)
    right = "shifted" if wrong else "unshifted"
    assert next(_wrap(repeating_items(6, 6, 1, next_token=wrong), label_format=right)).num_loss_tokens == 6 * 6


@pytest.mark.parametrize("dynamic_cp", [False, True])
def test_position_aligned_labels_through_the_wrapper_are_trained_as_given(dynamic_cp):
    items = list(repeating_items(6, 20, 3, next_token=False))
    dynamic = (
        {
            "dynamic_cp": True,
            "cost": dataclasses.replace(default_cost_model(), ring_step=2e-4, ring_token=5e-8, reference_size=1),
        }
        if dynamic_cp
        else {}
    )
    (step,) = _wrap(iter(items), label_format="position_aligned", max_tokens_per_rank=128, **dynamic)
    assert step.num_loss_tokens == 6 * 20 == sum(mb.num_loss_tokens for mb in step.microbatches)
    got = sorted(
        mb.labels[start : start + end - begin].tolist()
        for mb in step.microbatches
        for start, (begin, end) in zip(
            mb.cu_seqlens_padded.tolist(), itertools.pairwise(mb.cu_seqlens.tolist()), strict=False
        )
    )
    assert got == sorted(s["labels"].tolist() for s in items)


@pytest.mark.parametrize("bad, shown", [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_a_negative_or_non_finite_loss_mask_fails_the_step_naming_it(bad, shown):
    rng = np.random.default_rng(3)
    data = [_sample(rng, 12, labels=True, mask=True) for _ in range(6)]
    data[4]["loss_mask"][7] = bad
    with pytest.raises(
        StepFailed, match=rf"sample 4 of this rank's data.*'loss_mask' must be .*got {shown} at token 7"
    ):
        next(_wrap(iter(data)))


def test_a_collated_batch_of_unequal_samples_names_samples_not_batches():
    loader = torch.utils.data.DataLoader([{"input_ids": torch.arange(n)} for n in (3, 5, 4, 6)], batch_size=2)
    with pytest.raises(
        StepFailed, match=r"stack expects each tensor to be equal size.*DataLoader\(batch_size=None\)"
    ) as failed:
        next(_wrap(loader))
    assert SAMPLES_NOT_BATCHES in str(failed.value) and isinstance(failed.value.__cause__, RuntimeError)
