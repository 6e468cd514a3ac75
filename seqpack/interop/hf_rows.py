"""The rows of a Hugging Face ``Trainer``'s training set as seqpack samples, the way TRL turns
them into labels (:class:`seqpack.interop.hf.SeqpackTrainerMixin` reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["SAMPLE_COLUMNS", "sample_of"]

SAMPLE_COLUMNS: tuple[str, ...] = ("input_ids", "labels", "loss_mask", "completion_mask", "assistant_masks")
"""The dataset columns :class:`SeqpackTrainerMixin` reads from each training row (the others are
dropped): ``input_ids``; HF-style ``labels``, else TRL's ``completion_mask`` /
``assistant_masks`` (1 on the tokens to learn); a seqpack ``loss_mask``."""


def sample_of(row: Mapping[str, Any], use_completion_mask: bool) -> dict[str, Any]:
    """A seqpack sample from a training row: ``input_ids``, its ``labels`` and ``loss_mask``
    when given, else the product of TRL's masks (``completion_mask`` when
    ``use_completion_mask``, ``assistant_masks``) as ``loss_mask``, as TRL builds labels."""
    sample = {"input_ids": _host(row["input_ids"])}
    for key in ("labels", "loss_mask"):
        if row.get(key) is not None:
            sample[key] = _host(row[key])
    if "labels" in sample:
        return sample
    masks = [key for key in ("completion_mask", "assistant_masks") if row.get(key) is not None]
    if not use_completion_mask and "completion_mask" in masks:
        masks.remove("completion_mask")
    for key in masks:
        mask = torch.as_tensor(_host(row[key]))
        sample["loss_mask"] = mask if "loss_mask" not in sample else torch.as_tensor(sample["loss_mask"]) * mask
    return sample


def _host(value: Any) -> Any:
    """A row's field as seqpack reads it: lists as they are, tensors on the CPU."""
    return value.cpu() if isinstance(value, torch.Tensor) else value
