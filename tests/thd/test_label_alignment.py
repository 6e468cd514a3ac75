"""The label-alignment guard of the sample contract (seqpack.thd.sample): labels that fit the
other convention than the declared ``label_format`` are refused per sample, however often the
tokens repeat; ``label_format="position_aligned"`` takes labels as given; ``loss_mask``
weights are finite and >= 0.

Measured on real text: the standard library's source, byte-tokenised as the demo reads it
(``TokenDataset(stdlib_corpus(max_len=1024))``: 27,271 documents, 12.7M tokens, 22% of
tokens equal to the next one, indentation mostly), a random prompt of up to half of each
document masked with -100. False positives, i.e. labels in the declared alignment refused:
0 of 27,271 documents under either format (next-token labels as ``"shifted"``, Hugging
Face-style labels as ``"unshifted"``; on such labels the guard counts no misaligned token at
all, by construction). Caught in the wrong alignment: every document with at least 8 checked
supervised tokens, 27,219 of 27,219 Hugging Face-style as ``"shifted"`` and 27,218 of 27,218
next-token as ``"unshifted"``; the rest are left to the step's sums. Before tokens equal to
the next one were left out of the count, Hugging Face-style labels as ``"shifted"`` were
refused on 4,058 of those 27,219 documents (15%). The test below repeats the measurement on
the first files of the corpus.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.errors import SampleError
from seqpack.loader import PackingConfig
from seqpack.options import LABEL_COPY_FRACTION, LABEL_COPY_MIN_TOKENS
from seqpack.thd import (
    IGNORE_INDEX,
    count_loss_tokens,
    label_alignment_counts,
    looks_misaligned,
    next_token_targets,
    normalize_sample,
    pack_sequences,
)
from seqpack.thd.sample import check_label_format

WHERE = "sample 4 of this rank's data"
# 20 distinct-ish tokens, 3 of them equal to the next one (positions 0, 3 and 7).
REPEATING = torch.tensor([10, 10, 11, 12, 12, 13, 14, 15, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26])


def _next_tokens(ids: torch.Tensor) -> torch.Tensor:
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:-1] = ids[1:]
    return labels


# --- HF-style labels under "shifted": repeats no longer dilute the count ------------------------


def test_hf_labels_whose_tokens_repeat_are_refused_as_shifted():
    hf = {"input_ids": REPEATING, "labels": REPEATING.clone()}
    # 20 supervised tokens, 3 equal to the next one (they fit either alignment): 17 of 17 copy.
    with pytest.raises(SampleError) as info:
        check_label_format(normalize_sample(hf), "shifted", where=WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: labels equal input_ids on 17 of 17 supervised tokens")
    assert "label_format='unshifted'" in message and "label_format='position_aligned'" in message
    with pytest.raises(SampleError, match=r"sample 1: labels equal input_ids on 17 of 17 .*label_format="):
        pack_sequences([{"input_ids": torch.arange(1, 9)}, hf])
    packed = pack_sequences([hf], label_format="unshifted")  # declared: shifted here, 19 targets
    assert packed.labels.tolist() == REPEATING[1:].tolist() + [IGNORE_INDEX] and packed.num_loss_tokens == 19


def test_next_token_labels_are_quiet_on_every_run_and_hf_labels_on_a_pure_run_are_not_judged():
    for ids in (REPEATING, torch.full((64,), 3), torch.tensor([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7] * 3)):
        check_label_format({"input_ids": ids, "labels": _next_tokens(ids)}, "shifted")
        pack_sequences([{"input_ids": ids, "labels": _next_tokens(ids)}])
        check_label_format({"input_ids": ids, "labels": ids.clone()}, "unshifted")
    # HF labels on a run of one token equal next-token labels but for the last: nothing to judge.
    run = torch.full((64,), 3)
    check_label_format({"input_ids": run, "labels": run.clone()}, "shifted")


# --- next-token labels under "unshifted": the reverse guard -------------------------------------


def test_next_token_labels_declared_unshifted_are_refused():
    labels = _next_tokens(REPEATING)  # 19 supervised, 3 fit either alignment: 16 of 16 are the next token
    sample = {"input_ids": REPEATING, "labels": labels}
    with pytest.raises(SampleError) as info:
        check_label_format(normalize_sample(sample), "unshifted", where=WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: labels equal the next token of input_ids on 16 of 16 supervised tokens")
    assert "label_format='unshifted'" in message and "pass label_format='shifted'" in message
    with pytest.raises(SampleError, match=r"sample 1: labels equal the next token of input_ids on 16 of 16"):
        pack_sequences([{"input_ids": torch.arange(1, 9)}, sample], label_format="unshifted")
    check_label_format(sample, "shifted")  # declared right: fine
    assert pack_sequences([sample]).labels.tolist() == labels.tolist()


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
def test_the_guard_needs_nearly_all_of_enough_checked_tokens(label_format):
    assert (LABEL_COPY_FRACTION, LABEL_COPY_MIN_TOKENS) == (0.9, 8)
    ids = torch.arange(100, 121)  # no repeats: every supervised token is checked
    wrong = ids.clone() if label_format == "shifted" else _next_tokens(ids)  # the other alignment
    right = _next_tokens(ids) if label_format == "shifted" else ids.clone()
    # 7 checked tokens, all in the wrong alignment, pass (too few to judge); 8 do not.
    for supervised, refused in ((7, False), (8, True)):
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[-supervised - 1 : -1] = wrong[-supervised - 1 : -1]
        _expect({"input_ids": ids, "labels": labels}, label_format, refused, f"on {supervised} of {supervised}")
    # 20 checked tokens: 18 wrong (90%) are refused, 17 (85%) pass.
    for count, refused in ((18, True), (17, False)):
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:20] = torch.cat([wrong[:count], right[count:20]])
        checked, misaligned = label_alignment_counts(ids, labels, None, np.array([0, 21]), label_format)
        assert (checked.tolist(), misaligned.tolist()) == ([20], [count])
        assert looks_misaligned(checked, misaligned).tolist() == [refused]
        _expect({"input_ids": ids, "labels": labels}, label_format, refused, f"on {count} of 20")
    # A loss mask of 0 takes a token out of the count.
    masked = {"input_ids": ids, "labels": wrong, "loss_mask": torch.zeros(21)}
    check_label_format(masked, label_format)


def _expect(sample, label_format, refused, counts):
    if refused:
        with pytest.raises(SampleError, match=counts):
            check_label_format(sample, label_format)
    else:
        check_label_format(sample, label_format)


# --- real text: quiet in the declared alignment, loud in the other ------------------------------


@pytest.fixture(scope="module")
def stdlib_documents():
    from seqpack.mock_data.text import TokenDataset, stdlib_corpus

    corpus = TokenDataset(stdlib_corpus(max_len=1024, max_files=15))
    return [corpus[i]["input_ids"] for i in range(len(corpus)) if corpus[i]["input_ids"].shape[0] >= 2]


def _refused(sample, label_format) -> bool:
    try:
        check_label_format(sample, label_format)
    except SampleError:
        return True
    return False


@pytest.mark.slow
def test_on_real_text_the_guard_is_quiet_in_the_declared_alignment_and_loud_in_the_other(stdlib_documents):
    rng = np.random.default_rng(0)
    quiet = loud = judged = with_repeats = 0
    for ids in stdlib_documents:
        prompt = int(rng.integers(0, ids.shape[0] // 2 + 1))
        hf = ids.clone()
        hf[:prompt] = IGNORE_INDEX
        ours = _next_tokens(ids)
        ours[: max(prompt - 1, 0)] = IGNORE_INDEX  # the same targets, next-token aligned
        quiet += _refused({"input_ids": ids, "labels": ours}, "shifted")
        quiet += _refused({"input_ids": ids, "labels": hf}, "unshifted")
        # Checked tokens: supervised ones whose token differs from the next (the last one has none).
        differs = torch.ones_like(ids, dtype=torch.bool)
        differs[:-1] = ids[:-1] != ids[1:]
        with_repeats += bool((~differs & (hf != IGNORE_INDEX)).any())
        for labels, wrong in ((hf, "shifted"), (ours, "unshifted")):
            if int(((labels != IGNORE_INDEX) & differs).sum()) >= LABEL_COPY_MIN_TOKENS:
                judged += 1
                loud += _refused({"input_ids": ids, "labels": labels}, wrong)
    print(f"{len(stdlib_documents)} documents, {judged} judged, {with_repeats} with repeats in the answer")
    assert len(stdlib_documents) > 300 and with_repeats > len(stdlib_documents) // 2  # not vacuous
    assert quiet == 0  # no false positive
    assert loud == judged > len(stdlib_documents)  # every judged document refused in the wrong alignment


# --- position-aligned targets: used as given, never refused --------------------------------------


def test_position_aligned_labels_are_used_as_given_and_never_refused():
    ids = torch.arange(1, 21)
    labels = ids.clone()
    labels[:3] = IGNORE_INDEX
    mask = torch.ones(20)
    mask[5] = 0.5
    sample = {"input_ids": ids, "labels": labels, "loss_mask": mask}
    with pytest.raises(SampleError, match="label_format='position_aligned'"):
        pack_sequences([sample])  # "shifted": copies refused, with the way out named
    check_label_format(sample, "position_aligned")
    packed = pack_sequences([sample, {"input_ids": torch.arange(5)}], label_format="position_aligned")
    assert packed.labels.tolist() == labels.tolist() + [1, 2, 3, 4, IGNORE_INDEX]  # no labels: next tokens
    assert packed.loss_mask.tolist() == [0.0] * 3 + mask[3:].tolist() + [1.0] * 4 + [0.0]
    assert packed.num_loss_tokens == 17 + 4 == count_loss_tokens(sample, "position_aligned") + 4
    assert next_token_targets(labels, None, torch.tensor([19]), "position_aligned")[0].tolist() == labels.tolist()
    config = PackingConfig(samples_per_rank=2, max_tokens_per_rank=64, label_format="position_aligned")
    assert config.summary()["label_format"] == "position_aligned"
    assert config.fingerprint() != config.replace(label_format="shifted").fingerprint()
    with pytest.raises(ValueError, match=r"\('shifted', 'unshifted', 'position_aligned'\), got 'hf'"):
        pack_sequences([sample], label_format="hf")


# --- loss_mask: a weight >= 0 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, match",
    [
        ([1.0, -1.0, 0.0], r"'loss_mask' must be >= 0 \(a weight on each token's loss\), got -1.0 at token 1"),
        (np.array([1, 0, -3], dtype=np.int8), r"'loss_mask' must be >= 0 .*, got -3 at token 2"),
        (torch.tensor([1.0, -1e-30, 1.0], dtype=torch.float64), r"'loss_mask' must be >= 0 .*, got -1e-30 at token 1"),
        ([1.0, float("nan"), 0.0], r"'loss_mask' must be finite, got nan at token 1"),
        ([float("-inf"), 1.0, 0.0], r"'loss_mask' must be finite, got -inf at token 0"),
    ],
)
def test_a_negative_or_non_finite_loss_mask_is_refused_naming_the_value(value, match):
    with pytest.raises(SampleError, match=rf"{WHERE}: {match}"):
        normalize_sample({"input_ids": torch.arange(3), "loss_mask": value}, where=WHERE)
    with pytest.raises(SampleError, match=rf"sample 1: {match}"):
        pack_sequences([{"input_ids": torch.arange(2)}, {"input_ids": torch.arange(3), "loss_mask": value}])


def test_non_binary_weights_count_each_weighted_token_once():
    mask = torch.tensor([1.0, 0.25, 2.0, 0.0, -0.0, 1.0])
    packed = pack_sequences([{"input_ids": torch.arange(1, 7), "loss_mask": mask}])
    assert packed.loss_mask.tolist() == [1.0, 0.25, 2.0, 0.0, 0.0, 0.0]  # the last token has no target
    assert packed.num_loss_tokens == 3  # tokens with a weight > 0, not the weights' sum (3.25)
