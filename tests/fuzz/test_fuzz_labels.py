"""Fuzz the label and loss surfaces (issue 29): random token streams from small vocabularies
(so tokens repeat, in runs too), labels in every alignment (next-token, Hugging Face-style,
noise, either with a few tokens changed), -100 on a prompt and here and there, loss masks with
odd weights (0.5, 2, 1e-30, -0.0, and the refused -1, -1e-30, NaN, +-inf), every
``label_format`` and some that are not one, through :func:`~seqpack.thd.pack_sequences`, the
wrapper's read (:func:`~seqpack.loader.labels.prepare_labels` and the step's sums), the
wrapper on one rank, and :func:`~seqpack.interop.hf.to_hf`.

Every answer is either one SeqpackError naming the bad value (the sample and token, the
alignment counts and ``label_format``, the weight, the argument), exactly where the slow
token-by-token reference below says so, or a result equal to that reference: packed targets
and weights, ``num_loss_tokens`` (tokens with a target and a weight > 0) and HF's labels."""

from __future__ import annotations

import collections
import math
import numbers
import re
from typing import Any

import numpy as np
import pytest
import torch
from hostile import HOSTILE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqpack.errors import SampleError, SeqpackError, SeqpackTypeError, StepFailed
from seqpack.interop.hf import to_hf
from seqpack.loader import wrap_data_iterator
from seqpack.loader.labels import loss_token_counts, misaligned_step_message, prepare_labels
from seqpack.options import INT64_MAX, LABEL_COPY_FRACTION, LABEL_COPY_MIN_TOKENS
from seqpack.thd import IGNORE_INDEX, normalize_sample, pack_sequences
from seqpack.topology import Topology

FORMATS = ("shifted", "unshifted", "position_aligned")
NOT_FORMATS = ("hf", "Shifted", "position-aligned", "", None, 1)
KINDS = ("next", "hf", "noise", "next_noisy", "hf_noisy")
VALID_WEIGHTS = (0.0, 1.0, 0.5, 2.0, 1e-30, -0.0, 3)
BAD_WEIGHTS = (-1.0, -1e-30, math.nan, math.inf, -math.inf)


# --- the slow reference, one token at a time ---------------------------------------------------


def slow_alignment(ids: list[int], labels: list[int], mask: list[float] | None, fmt: str) -> tuple[int, int]:
    """(checked, misaligned) of one sequence: a supervised label is checked unless it equals
    both its own and the next token; misaligned when it equals its own token under "shifted",
    the next one under "unshifted" (never under "position_aligned")."""
    checked = misaligned = 0
    for t, label in enumerate(labels):
        if label == IGNORE_INDEX or (mask is not None and not mask[t] > 0):
            continue
        own, ahead = label == ids[t], t + 1 < len(ids) and label == ids[t + 1]
        if own and ahead:
            continue
        checked += 1
        misaligned += {"shifted": own, "unshifted": ahead}.get(fmt, False)
    return checked, misaligned


def looks_misaligned(checked: int, misaligned: int) -> bool:
    return checked >= LABEL_COPY_MIN_TOKENS and misaligned >= LABEL_COPY_FRACTION * checked


def slow_targets(ids: list[int], labels: list[int] | None, mask: list[float] | None, fmt: str):
    """The packed targets and weights of one sequence (weight 0 where the target is -100)."""
    n = len(ids)
    targets, weights = [], []
    for t in range(n):
        if fmt == "unshifted":  # token t predicts what is aligned with token t + 1
            target = (labels[t + 1] if labels is not None else ids[t + 1]) if t + 1 < n else IGNORE_INDEX
            weight = (mask[t + 1] if mask is not None else 1.0) if t + 1 < n else 0.0
        else:
            target = labels[t] if labels is not None else (ids[t + 1] if t + 1 < n else IGNORE_INDEX)
            weight = mask[t] if mask is not None else 1.0
        targets.append(target)
        weights.append(float(np.float32(weight)) if target != IGNORE_INDEX else 0.0)  # float32, as packed
    return targets, weights


def bad_weight(mask: list[float] | None) -> tuple[int, float] | None:
    """The first weight the contract refuses (negative, NaN or infinite), with its token."""
    for t, weight in enumerate(mask or ()):
        if not (weight >= 0 and weight < math.inf):
            return t, weight
    return None


def expected_refusal(samples: list[dict[str, Any]], fmt: str) -> tuple[str, ...] | None:
    """What a pack of ``samples`` must be refused for: the pieces its message holds, or None."""
    for i, s in enumerate(samples):
        bad = bad_weight(s.get("loss_mask"))
        if bad is not None:
            what = "must be finite" if not math.isfinite(bad[1]) else "must be >= 0"
            return (f"sample {i}", "'loss_mask'", what, f"got {bad[1]} at token {bad[0]}")
    for i, s in enumerate(samples):
        if "labels" in s:
            checked, misaligned = slow_alignment(s["input_ids"], s["labels"], s.get("loss_mask"), fmt)
            if looks_misaligned(checked, misaligned):
                return (f"sample {i}", f"on {misaligned} of {checked} supervised tokens", f"label_format='{fmt}'")
    return None


# --- strategies ----------------------------------------------------------------------------------


@st.composite
def sequence(
    draw, *, labelled: bool, masked: str, kind: str | None, short: bool, vocab: int | None = None
) -> dict[str, Any]:
    n = draw(st.integers(1, 40))
    vocab = vocab or draw(st.sampled_from([2, 3, 8, 1000]))  # small vocabularies repeat tokens, in runs too
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    sample: dict[str, Any] = {"input_ids": ids}
    if labelled:
        kind = kind or draw(st.sampled_from(KINDS))
        prompt = draw(st.integers(max(n - 6, 0) if short else 0, n))  # short: answers of at most 6 tokens
        if kind.startswith("next"):
            labels = ids[1:] + [IGNORE_INDEX]
            prompt = max(prompt - 1, 0)
        elif kind.startswith("hf"):
            labels = list(ids)
        else:
            labels = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
        for t in range(prompt):
            labels[t] = IGNORE_INDEX
        for t in draw(st.sets(st.integers(0, n - 1), max_size=n // 4)):
            labels[t] = IGNORE_INDEX if kind in ("next", "hf") else draw(st.integers(0, vocab - 1))
        sample["labels"] = labels
    if masked != "none":
        weights = VALID_WEIGHTS + (BAD_WEIGHTS if masked == "hostile" else ())
        sample["loss_mask"] = draw(st.lists(st.sampled_from(weights), min_size=n, max_size=n))
    return sample


@st.composite
def batches(draw) -> list[dict[str, Any]]:
    """1 to 5 sequences carrying the same keys (the wrapper's pool needs that); their labels of
    one kind or each its own, and sometimes short answers only (the step's guard)."""
    labelled = draw(st.booleans())
    masked = draw(st.sampled_from(["none", "valid", "hostile"]))
    kind = draw(st.none() | st.sampled_from(KINDS))
    short = draw(st.booleans())
    return draw(st.lists(sequence(labelled=labelled, masked=masked, kind=kind, short=short), min_size=1, max_size=5))


formats = st.sampled_from(FORMATS)


@st.composite
def cases(draw) -> tuple[list[dict[str, Any]], str]:
    """(samples, label_format); one in five a case for the step's guard: several short answers
    of distinct tokens, all in the other alignment than declared."""
    fmt = draw(formats)
    if fmt != "position_aligned" and draw(st.integers(0, 4)) == 0:
        kind = "hf" if fmt == "shifted" else "next"
        short = sequence(labelled=True, masked="none", kind=kind, short=True, vocab=1000)
        return draw(st.lists(short, min_size=3, max_size=5)), fmt
    return draw(batches()), fmt


def _tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample as a dataloader gives it: ids and labels int64 tensors, the mask a list."""
    out: dict[str, Any] = {"input_ids": torch.tensor(sample["input_ids"])}
    if "labels" in sample:
        out["labels"] = torch.tensor(sample["labels"])
    if "loss_mask" in sample:
        out["loss_mask"] = list(sample["loss_mask"])
    return out


def _assert_refused(exc: BaseException, pieces: tuple[str, ...]) -> None:
    message = str(exc)
    assert isinstance(exc, SeqpackError), f"{type(exc).__name__}: {message}"
    for piece in pieces:
        assert piece in message, f"{piece!r} not in {message!r}"


def _real(batch) -> tuple[list[int], list[float]]:
    real = ~batch.padding_mask
    return batch.labels[real].tolist(), batch.loss_mask[real].tolist()


def _slow_pack(samples, fmt):
    targets, weights = [], []
    for s in samples:
        t, w = slow_targets(s["input_ids"], s.get("labels"), s.get("loss_mask"), fmt)
        targets += t
        weights += w
    return targets, weights, sum(t != IGNORE_INDEX and w > 0 for t, w in zip(targets, weights, strict=True))


# --- pack_sequences and to_hf --------------------------------------------------------------------


@pytest.mark.slow
def test_pack_sequences_refuses_exactly_what_the_reference_refuses_and_packs_its_targets():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases(), pad_multiple=st.sampled_from([1, 4]))
    def pack(case, pad_multiple):
        outcomes[_pack_and_compare(*case, pad_multiple)] += 1

    pack()
    print(dict(outcomes))
    for outcome in ("refused loss_mask", "refused labels", "packed, to_hf refused", "packed, to_hf ok"):
        assert outcomes[outcome] > 0, outcomes  # not vacuous


def _pack_and_compare(samples, fmt, pad_multiple) -> str:
    refusal = expected_refusal(samples, fmt)
    try:
        batch = pack_sequences([_tensors(s) for s in samples], pad_multiple=pad_multiple, label_format=fmt)
    except Exception as exc:  # noqa: BLE001 - the point: compared with the reference
        assert refusal is not None, f"refused what the reference packs: {exc}"
        _assert_refused(exc, refusal)
        return f"refused {'loss_mask' if 'loss_mask' in refusal[1] else 'labels'}"
    assert refusal is None, f"packed what the reference refuses for {refusal}"
    targets, weights, count = _slow_pack(samples, fmt)
    assert _real(batch) == (targets, weights)
    assert batch.num_loss_tokens == count
    # to_hf: HF's targets are ours where the weight is > 0; weights other than 0/1 are refused.
    try:
        kwargs = to_hf(batch, num_items_in_batch=max(count, 1))
    except SeqpackError as exc:
        assert any(w not in (0.0, 1.0) for w in weights), str(exc)
        assert "loss_mask" in str(exc)
        return "packed, to_hf refused"
    real = ~batch.padding_mask
    hf_targets = [t if w > 0 else IGNORE_INDEX for t, w in zip(targets, weights, strict=True)]
    assert kwargs["shift_labels"][0][real].tolist() == hf_targets
    assert kwargs["labels"][0][1:].tolist() == kwargs["shift_labels"][0][:-1].tolist()
    assert int((kwargs["shift_labels"] != IGNORE_INDEX).sum()) == count
    return "packed, to_hf ok"


@settings(max_examples=40, deadline=None)
@given(samples=batches(), fmt=st.sampled_from(NOT_FORMATS))
@pytest.mark.slow
def test_a_label_format_that_is_not_one_is_refused_naming_it(samples, fmt):
    with pytest.raises(SeqpackError, match=rf"label_format must be one of .*got {re.escape(repr(fmt))}"):
        pack_sequences([_tensors(s) for s in samples], label_format=fmt)


# --- the wrapper's read: prepare_labels and the step's sums --------------------------------------


@pytest.mark.slow
def test_the_read_refuses_like_the_packer_and_sums_what_the_step_guard_needs():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def read(case):
        outcomes[_read_and_compare(*case)] += 1

    read()
    print(dict(outcomes))
    for outcome in ("refused", "read", "read, step refused"):
        assert outcomes[outcome] > 0, outcomes  # not vacuous


def _read_and_compare(samples, fmt) -> str:
    wheres = [f"sample {i} of this rank's data" for i in range(len(samples))]
    refusal = expected_refusal(samples, fmt)
    try:
        sequences = [normalize_sample(_tensors(s), where=w) for s, w in zip(samples, wheres, strict=True)]
        converted, checked, misaligned = prepare_labels(sequences, wheres, fmt)
    except Exception as exc:  # noqa: BLE001 - the point: compared with the reference
        assert refusal is not None, f"refused what the reference reads: {exc}"
        _assert_refused(exc, refusal)
        assert f"{refusal[0]} of this rank's data" in str(exc)
        return "refused"
    assert refusal is None, f"read what the reference refuses for {refusal}"
    sums = [slow_alignment(s["input_ids"], s["labels"], s.get("loss_mask"), fmt) for s in samples if "labels" in s]
    want = (sum(c for c, _ in sums), sum(m for _, m in sums)) if fmt != "position_aligned" else (0, 0)
    assert (checked, misaligned) == want
    message = misaligned_step_message(3, checked, misaligned, fmt)
    assert (message is not None) == looks_misaligned(checked, misaligned)
    if message is not None:
        assert "step 3 (the samples of every DP rank): labels equal" in message and f"'{fmt}'" in message
    # What the wrapper counts and packs (as given: already in seqpack's form) is the reference's.
    counts = [_slow_pack([s], fmt)[2] for s in samples]
    assert loss_token_counts(converted).tolist() == counts
    targets, weights, count = _slow_pack(samples, fmt)
    assert _real(pack_sequences(converted, label_format="position_aligned")) == (targets, weights)
    return "read" if message is None else "read, step refused"


@pytest.mark.slow
def test_the_wrapper_on_one_rank_fails_the_step_where_the_reference_refuses_or_trains_its_count():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def step(case):
        outcomes[_step_and_compare(*case)] += 1

    step()
    print(dict(outcomes))
    for outcome in ("failed", "trained", "failed at the step"):
        assert outcomes[outcome] > 0, outcomes  # not vacuous


def _step_and_compare(samples, fmt) -> str:
    refusal = expected_refusal(samples, fmt)
    sums = [slow_alignment(s["input_ids"], s["labels"], s.get("loss_mask"), fmt) for s in samples if "labels" in s]
    step_refused = fmt != "position_aligned" and looks_misaligned(sum(c for c, _ in sums), sum(m for _, m in sums))
    steps = wrap_data_iterator(
        iter([_tensors(s) for s in samples]),
        Topology.single(),
        samples_per_rank=len(samples),
        max_tokens_per_rank=64,
        scheduler="empty",
        label_format=fmt,
        prefetch=0,
    )
    try:
        step = next(steps)
    except StepFailed as exc:
        assert refusal is not None or step_refused, f"failed a step the reference trains: {exc}"
        assert isinstance(exc.__cause__, SampleError)
        if refusal is not None:
            _assert_refused(exc, (f"{refusal[0]} of this rank's data", *refusal[1:]))
        else:
            assert "step 0 (the samples of every DP rank): labels equal" in str(exc)
            return "failed at the step"
        return "failed"
    assert refusal is None and not step_refused
    assert step.num_loss_tokens == _slow_pack(samples, fmt)[2]
    for batch in step.microbatches:
        starts, lengths = batch.cu_seqlens_padded.tolist(), batch.seq_lens().tolist()
        for sid, start, n in zip(batch.sample_ids.tolist(), starts, lengths, strict=False):
            s = samples[sid]
            targets, weights = slow_targets(s["input_ids"], s.get("labels"), s.get("loss_mask"), fmt)
            assert batch.labels[start : start + n].tolist() == targets
            assert batch.loss_mask[start : start + n].tolist() == weights
    return "trained"


# --- to_hf's num_items_in_batch ------------------------------------------------------------------


def _accepted_count(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        integer = not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        return value.dim() == 0 and integer and int(value) > 0
    integral = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    return integral and 0 < int(value) <= INT64_MAX


COUNTS = [
    *(value for _, value in ((name, make()) for name, make in HOSTILE)),
    torch.tensor(7),
    torch.tensor(0),
    torch.tensor(-2, dtype=torch.int32),
    torch.tensor(3.0),
    torch.tensor([3]),
    np.int64(5),
    np.uint8(0),
]


@pytest.mark.parametrize("check", [True, False])
def test_num_items_in_batch_is_a_positive_count_or_one_error_naming_it(check):
    batch = pack_sequences([{"input_ids": torch.arange(1, 6)}, {"input_ids": torch.arange(1, 4)}], pad_multiple=4)
    answers = {"ok": 0, "refused": 0}
    for value in COUNTS:
        try:
            kwargs = to_hf(batch, num_items_in_batch=value, check=check)
        except SeqpackError as exc:
            message = str(exc)
            assert message.startswith("to_hf: num_items_in_batch"), message
            if isinstance(value, torch.Tensor):
                assert "tensor" in message, message
            else:
                assert repr(value) in message or str(value) in message, message
            assert not _accepted_count(value), f"refused {value!r}: {message}"
            assert not isinstance(value, str) or isinstance(exc, SeqpackTypeError)
            answers["refused"] += 1
            continue
        if value is None:  # left out: HF's loss is the batch's token mean
            assert "num_items_in_batch" not in kwargs
            continue
        given_count = kwargs["num_items_in_batch"]
        if isinstance(value, torch.Tensor):
            assert given_count is value  # passed on as the Trainer gave it
            assert _accepted_count(value) or not check  # without check a tensor's value is not read
            assert value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
        else:
            assert _accepted_count(value) and type(given_count) is int and given_count == int(value)
        answers["ok"] += 1
    assert answers["ok"] >= 4 and answers["refused"] >= 30, answers  # not vacuous


@settings(max_examples=60, deadline=None)
@given(st.integers(-(2**70), 2**70))
def test_any_integer_count_is_taken_when_positive_and_within_int64(value):
    batch = pack_sequences([{"input_ids": torch.arange(1, 6)}])
    if 0 < value <= INT64_MAX:
        assert to_hf(batch, num_items_in_batch=value)["num_items_in_batch"] == value
    else:
        with pytest.raises(SeqpackError, match=rf"num_items_in_batch.*{value}"):
            to_hf(batch, num_items_in_batch=value)
