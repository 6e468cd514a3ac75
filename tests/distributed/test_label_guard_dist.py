"""The label-alignment guard and the loss-mask check on 2 gloo DP ranks: labels in the other
alignment than ``label_format`` (Hugging Face-style labels as ``"shifted"``, next-token labels
as ``"unshifted"``), with repeated tokens in every answer, fail the step with the same
``StepFailed`` on every rank: per sample on long answers, per step on short ones, from sums
equal to the one-process counts. A negative ``loss_mask`` on one rank fails the step alike."""

from __future__ import annotations

import pytest
import torch
from wrapper_data import mesh_topology, repeating_items

from seqpack.loader import wrap_data_iterator
from seqpack.thd import IGNORE_INDEX, pack_sequences

SPR = 4  # samples per DP rank
LONG, SHORT = (20, 3), (6, 1)  # (answer tokens, repeats): 17 checked tokens a sample, or 5


def _items(dp_rank: int, answer: tuple[int, int], next_token: bool) -> list[dict[str, torch.Tensor]]:
    return list(repeating_items(SPR, *answer, next_token=next_token, seed=dp_rank))


def run_step(label_format: str, answer: tuple[int, int], next_token: bool, negative_mask_on: int | None) -> dict:
    from seqpack.errors import SampleError, StepFailed

    topo = mesh_topology((("dp", 2),))
    items = _items(topo.dp_rank, answer, next_token)
    if negative_mask_on == topo.dp_rank:
        items[2]["loss_mask"] = torch.ones(items[2]["input_ids"].shape[0])
        items[2]["loss_mask"][5] = -1.0
    for item in items if negative_mask_on is not None else ():
        item.setdefault("loss_mask", torch.ones(item["input_ids"].shape[0]))  # the same keys on every rank
    steps = wrap_data_iterator(
        iter(items), topo, samples_per_rank=SPR, max_tokens_per_rank=64, scheduler="empty", label_format=label_format
    )
    try:
        step = next(steps)
    except StepFailed as exc:
        return {"error": str(exc), "sample_error": isinstance(exc.__cause__, SampleError)}
    return {"error": None, "num_loss_tokens": step.num_loss_tokens}


def _one_process_counts(answer, next_token, label_format) -> tuple[int, int]:
    """The step's (checked, misaligned) sums, counted token by token in this process over both
    ranks' samples: a supervised label is checked unless it equals both its own and the next
    token; misaligned when it equals its own token (as "shifted") or the next one (as "unshifted")."""
    checked = misaligned = 0
    for sample in (s for r in range(2) for s in _items(r, answer, next_token)):
        ids, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
        for t, label in enumerate(labels):
            own, ahead = label == ids[t], t + 1 < len(ids) and label == ids[t + 1]
            if label == IGNORE_INDEX or (own and ahead):
                continue
            checked += 1
            misaligned += own if label_format == "shifted" else ahead
    return checked, misaligned


@pytest.mark.parametrize("label_format", ["shifted", "unshifted"])
@pytest.mark.parametrize("answer", [LONG, SHORT], ids=["per-sample", "per-step"])
def test_labels_in_the_other_alignment_fail_the_step_on_every_rank(dist_pools, label_format, answer):
    wrong = label_format == "unshifted"
    results = dist_pools.get(2).run(run_step, label_format, answer, wrong, None)
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors, results  # the same error on every rank
    (error,) = errors
    said = "the next token of input_ids" if wrong else "input_ids"
    assert f"labels equal {said} on" in error and f"label_format='{label_format}'" in error
    checked, misaligned = _one_process_counts(answer, wrong, label_format)
    if answer == LONG:  # a sample's own check: its rank holds the SampleError
        assert "of this rank's data" in error and any(r["sample_error"] for r in results)
        assert f"on {answer[0] - answer[1]} of {answer[0] - answer[1]} supervised" in error
    else:  # 5 checked tokens a sample pass it; the step's sums over both ranks do not
        assert checked == misaligned == 2 * SPR * (answer[0] - answer[1])
        assert f"step 0 (the samples of every DP rank): labels equal {said} on {misaligned} of {checked} " in error
        assert all(r["sample_error"] for r in results)
    # Declared right, the same data trains: the count of a one-process pack.
    right = "shifted" if wrong else "unshifted"
    fine = dist_pools.get(2).run(run_step, right, answer, wrong, None)
    samples = [s for r in range(2) for s in _items(r, answer, wrong)]
    expected = pack_sequences(samples, label_format=right).num_loss_tokens
    assert [r["num_loss_tokens"] for r in fine] == [expected, expected] and expected == 2 * SPR * answer[0]


def test_a_negative_loss_mask_on_one_rank_fails_the_step_on_every_rank(dist_pools):
    results = dist_pools.get(2).run(run_step, "unshifted", LONG, False, 1)
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors, results
    (error,) = errors
    assert "bad input on DP rank 1" in error and "sample 2 of this rank's data" in error
    assert "'loss_mask' must be >= 0" in error and "got -1.0 at token 5" in error
