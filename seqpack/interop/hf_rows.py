"""The parts of :class:`seqpack.interop.hf.SeqpackTrainerMixin` that need no trainer: a
``Trainer``'s training rows as seqpack samples (the way TRL turns them into labels), the loader
of seqpack steps the Trainer iterates, the mixin's ``PackingConfig`` and a step's counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.config import PackingConfig
from seqpack.loader.iterator import PackingIterator
from seqpack.loader.step import Step
from seqpack.thd.mrope import MROPE_MODEL_TYPES, MRopeSpec
from seqpack.thd.sample import VISION_FIELDS

__all__ = [
    "SAMPLE_COLUMNS",
    "VISION_COLUMNS",
    "StepLoader",
    "check_step",
    "packing_config",
    "sample_of",
    "step_count",
    "token_ids",
    "with_model_mrope",
]

VISION_COLUMNS: tuple[str, ...] = (*VISION_FIELDS, "second_per_grid_ts")
"""A vision-language row's fields as its processor gives them (docs/multimodal.md, "The sample
contract"), passed on to the sample as tensors; a row's ``None`` is left out."""

SAMPLE_COLUMNS: tuple[str, ...] = (
    "input_ids",
    "labels",
    "loss_mask",
    "completion_mask",
    "assistant_masks",
    *VISION_COLUMNS,
)
"""The dataset columns ``SeqpackTrainerMixin`` reads from each training row (the others are
dropped)."""


def sample_of(row: Mapping[str, Any], use_completion_mask: bool) -> dict[str, Any]:
    """A seqpack sample from a training row: ``input_ids``, its ``labels`` and ``loss_mask``
    when given, else the product of TRL's masks (``completion_mask`` when
    ``use_completion_mask``, ``assistant_masks``) as ``loss_mask``, as TRL builds labels; and
    its vision fields (:data:`VISION_COLUMNS`)."""
    sample = {"input_ids": _host(row["input_ids"])}
    for key in ("labels", "loss_mask"):
        if row.get(key) is not None:
            sample[key] = _host(row[key])
    for key in VISION_COLUMNS:
        if row.get(key) is not None:
            sample[key] = torch.as_tensor(_host(row[key]))
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


class StepLoader:
    """What the Trainer iterates: the seqpack steps of its row loader, one per batch of rows
    (``len`` and ``set_epoch`` are the row loader's)."""

    def __init__(self, rows: Any, steps_of: Callable[[Iterator[Any]], PackingIterator]) -> None:
        self.rows = rows
        self.dataset = getattr(rows, "dataset", None)  # Trainer.num_examples reads it
        self._steps_of = steps_of
        self.steps: PackingIterator | None = None  # the current epoch's (None before the first or once closed)

    def __len__(self) -> int:
        return len(self.rows)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.rows, "set_epoch"):
            self.rows.set_epoch(epoch)

    def __iter__(self) -> Iterator[Step]:
        self.close()  # the previous epoch's, if it was left early
        self.steps = self._steps_of(iter(self.rows))
        return self.steps

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()
            self.steps = None


def packing_config(given: object, batch_size: int) -> PackingConfig:
    """``seqpack_config`` as a PackingConfig, with the mixin's defaults for a mapping."""
    if isinstance(given, PackingConfig):
        return given
    if not isinstance(given, Mapping):
        raise SeqpackTypeError(
            f"seqpack_config must be a seqpack.PackingConfig or a mapping of its fields, got {type(given).__name__}"
        )
    fields = PackingConfig.field_names()
    unknown = sorted(str(key) for key in set(given) - set(fields))
    if unknown:
        raise ConfigError(f"seqpack_config: unknown field(s) {unknown}; valid: {', '.join(fields)}")
    if "max_tokens_per_rank" not in given:
        raise ConfigError("SeqpackTrainerMixin: seqpack_config needs max_tokens_per_rank (tokens per microbatch)")
    defaults = {"samples_per_rank": batch_size, "label_format": "unshifted", "drop_last": False}
    return PackingConfig(**{**defaults, **given})


def with_model_mrope(config: PackingConfig, model: Any) -> PackingConfig:
    """``config`` with ``mrope=MRopeSpec.from_hf(model.config)`` when ``model`` is a
    vision-language model whose positions seqpack knows (even text-only packs need them:
    docs/multimodal.md); other models: ``config`` as given.

    Raises:
        ConfigError: A given ``mrope`` other than the model's.
    """
    model_config = getattr(model, "config", None)
    if getattr(model_config, "model_type", None) not in MROPE_MODEL_TYPES:
        return config
    spec = MRopeSpec.from_hf(model_config)
    if config.mrope is None:
        return dataclasses.replace(config, mrope=spec)
    if config.mrope != spec:
        raise ConfigError(
            f"SeqpackTrainerMixin: seqpack_config has mrope={config.mrope!r} but the model's config gives {spec!r}: "
            "the positions and placeholders must be the model's; leave mrope out (the mixin reads it from the model)"
        )
    return config


def check_step(inputs: object) -> Step:
    if not isinstance(inputs, Step):
        raise ConfigError(
            f"SeqpackTrainerMixin: a training batch must be a whole seqpack Step, got {type(inputs).__name__}: "
            "microbatches reach the model only through the step they belong to (leave get_train_dataloader and "
            "get_batch_samples to the mixin)"
        )
    return inputs


def step_count(step: Step) -> int:
    """The step's supervised tokens over every rank; 1 for a step without any, whose
    token losses are all zero (``num_items_in_batch`` must be positive)."""
    return max(step.num_loss_tokens or 0, 1)


def token_ids(step: Step) -> list[torch.Tensor]:
    """Each microbatch's ``input_ids`` as ``[1, T]`` (what the Trainer counts FLOPs and tokens of)."""
    return [batch.input_ids[None] for batch in step.microbatches if batch.input_ids is not None]
