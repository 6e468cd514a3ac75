"""Fuzz what SeqpackTrainerMixin makes of a Trainer's rows and of its ``seqpack_config``.

Rows: random token ids with or without HF ``labels``, TRL's ``completion_mask`` /
``assistant_masks`` and a seqpack ``loss_mask``, packed the way the mixin packs them
(``label_format="unshifted"``): the targets HF's loss reads (``to_hf``'s ``shift_labels``) must
equal a slow reference of what TRL trains on (its dataset preparation's labels, -100 where an
applicable mask is 0, shifted by its model within each sequence). ``seqpack_config``: hostile
values keep the error contract (:func:`hostile.check_answer`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hostile import Target, check_answer, hostile_values
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.interop.hf import to_hf
from seqpack.interop.hf_rows import packing_config, sample_of
from seqpack.thd import IGNORE_INDEX, pack_sequences


def slow_targets(row: dict[str, Any], use_completion_mask: bool) -> list[int]:
    """TRL's targets for one row, token by token: its labels (given, else ``input_ids`` with
    -100 where a mask that applies is 0), each position's target the next label, the last
    none; a seqpack ``loss_mask`` of 0 also removes the target it is aligned with."""
    ids = row["input_ids"]
    if "labels" in row:
        labels = list(row["labels"])
    else:
        keys = [k for k in ("completion_mask", "assistant_masks") if k in row]
        if not use_completion_mask and "completion_mask" in keys:
            keys.remove("completion_mask")
        labels = [tok if all(row[k][t] for k in keys) else IGNORE_INDEX for t, tok in enumerate(ids)]
    if "loss_mask" in row:
        labels = [lab if row["loss_mask"][t] else IGNORE_INDEX for t, lab in enumerate(labels)]
    return [*labels[1:], IGNORE_INDEX]


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    row: dict[str, Any] = {"input_ids": ids}
    bits = st.lists(st.integers(0, 1), min_size=n, max_size=n)
    if draw(st.booleans()):
        # HF-style labels: the ids, some -100 (never next-token labels, which the guard refuses)
        row["labels"] = [tok if keep else IGNORE_INDEX for tok, keep in zip(ids, draw(bits), strict=True)]
    for key in ("completion_mask", "assistant_masks", "loss_mask"):
        if draw(st.booleans()):
            row[key] = draw(bits)
    if draw(st.booleans()):  # tensors, as a dataset in torch format gives them
        row = {k: torch.tensor(v) for k, v in row.items()}
    return row


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in row.items()}


@settings(max_examples=150, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=5), st.booleans())
@pytest.mark.slow
def test_mixin_samples_train_on_trls_targets(batch: list[dict[str, Any]], use_completion_mask: bool) -> None:
    samples = [sample_of(row, use_completion_mask) for row in batch]
    packed = pack_sequences(samples, label_format="unshifted")
    got = to_hf(packed)["shift_labels"][0].tolist()
    expected = [t for row in batch for t in slow_targets(_listed(row), use_completion_mask)]
    assert got == expected


def test_masks_remove_targets_where_trl_does() -> None:
    row = {"input_ids": [3, 4, 5, 6], "completion_mask": [0, 0, 1, 1], "assistant_masks": [1, 1, 1, 0]}
    packed = pack_sequences([sample_of(row, True)], label_format="unshifted")
    assert to_hf(packed)["shift_labels"][0].tolist() == [IGNORE_INDEX, 5, IGNORE_INDEX, IGNORE_INDEX]
    packed = pack_sequences([sample_of(row, False)], label_format="unshifted")  # completion_only_loss=False
    assert to_hf(packed)["shift_labels"][0].tolist() == [4, 5, IGNORE_INDEX, IGNORE_INDEX]


CONFIG = Target(
    name="SeqpackTrainerMixin(seqpack_config=...)",
    call=lambda seqpack_config, max_tokens_per_rank: packing_config(
        seqpack_config if seqpack_config is not None else {"max_tokens_per_rank": max_tokens_per_rank}, 4
    ),
    valid=lambda: {"seqpack_config": None, "max_tokens_per_rank": 64},
    args={"seqpack_config": "any", "max_tokens_per_rank": "int"},
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["seqpack_config", "max_tokens_per_rank"]), hostile_values)
def test_seqpack_config_keeps_the_error_contract(arg: str, value: Any) -> None:
    kwargs = CONFIG.valid()
    kwargs[arg] = value
    if arg == "seqpack_config" and value is None:
        return  # None is the valid spelling here (the mapping is built from max_tokens_per_rank)
    check_answer(CONFIG, arg, value, kwargs)
