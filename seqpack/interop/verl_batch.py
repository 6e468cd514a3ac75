"""A verl batch's rows: their real tokens (:func:`row_lengths`), the check that every value
has one row per sample, and a batch at some rows (:func:`select_rows`), for a TensorDict or a
mapping of tensors, arrays and lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seqpack.errors import ConfigError, SeqpackTypeError

__all__ = ["check_rows", "row_lengths", "select_rows"]


def row_lengths(batch: Any) -> tuple[str, np.ndarray]:
    """``(key, lengths)``: the real tokens of every row and the key they were read from.

    Raises:
        SeqpackTypeError: ``batch`` not a mapping, or an ``attention_mask`` that is no
            ``[B, S]`` tensor.
        ConfigError: No ``attention_mask`` nor nested ``input_ids``, or a mask row holding
            values other than 0 and 1.
    """
    if not hasattr(batch, "keys") or not hasattr(batch, "__getitem__"):
        raise SeqpackTypeError(f"batch must be a TensorDict or a mapping of tensors, got {type(batch).__name__}")
    keys = set(batch.keys())
    ids = batch["input_ids"] if "input_ids" in keys else None
    if isinstance(ids, torch.Tensor) and ids.is_nested:
        # A sequence's first dimension is its length, in either layout (a strided nested
        # tensor has no offsets); unbinding a jagged one reads its offsets once.
        return "input_ids", np.array([piece.shape[0] for piece in ids.unbind()], dtype=np.int64)
    if "attention_mask" not in keys:
        raise ConfigError(f"batch needs 'attention_mask' (or nested 'input_ids'); it holds {sorted(map(str, keys))}")
    mask = batch["attention_mask"]
    if not isinstance(mask, torch.Tensor) or mask.is_nested or mask.dim() != 2:
        what = "a nested tensor" if isinstance(mask, torch.Tensor) and mask.is_nested else getattr(mask, "shape", None)
        raise SeqpackTypeError(f"attention_mask must be a [B, S] tensor, got {what or type(mask).__name__}")
    # Per row, the entries equal to 1 and those not 0: they differ on a row holding anything
    # else (a 2 would count as two tokens, a 0.5 as none).
    counts = torch.stack(((mask == 1).sum(dim=1), (mask != 0).sum(dim=1))).cpu().numpy()  # the one host copy
    bad = np.flatnonzero(counts[0] != counts[1])
    if bad.size:
        row = int(bad[0])
        odd = mask[row][(mask[row] != 0) & (mask[row] != 1)][:3].tolist()
        raise ConfigError(
            f"attention_mask row {row} holds values other than 0 and 1 ({odd}): a mask marks real tokens with 1 "
            "and padding with 0"
        )
    return "attention_mask", counts[0].astype(np.int64)


def check_rows(batch: Any, rows: int, source: str) -> None:
    """Every value of a mapping ``batch`` has ``rows`` rows, ``source``'s (a TensorDict
    holds its own batch size)."""
    if _indexed_whole(batch):
        return
    for key in batch.keys():
        value = batch[key]
        if isinstance(value, (torch.Tensor, np.ndarray)) and not getattr(value, "is_nested", False) and value.ndim == 0:
            raise ConfigError(
                f"batch[{key!r}] is a 0-d {'tensor' if isinstance(value, torch.Tensor) else 'array'}: every value "
                f"needs one row per sample ({rows}, {source}'s rows)"
            )
        if isinstance(value, torch.Tensor):
            count = value.size(0)
        elif isinstance(value, np.ndarray):
            count = value.shape[0]
        elif isinstance(value, (list, tuple)):
            count = len(value)
        else:
            raise SeqpackTypeError(
                f"batch[{key!r}] is a {type(value).__name__}: values must be tensors, arrays or lists"
            )
        if count != rows:
            raise ConfigError(
                f"batch[{key!r}] has {count} rows but the batch has {rows} ({source}'s rows): every value is "
                "indexed on its first dimension, one row per sample"
            )


def select_rows(batch: Any, rows: Sequence[int]) -> Any:
    """``batch`` at ``rows`` (first dimension): a TensorDict (anything with ``batch_size``
    that is indexed as a whole) by its own indexing, a mapping value by value into a dict."""
    index = torch.tensor(list(rows), dtype=torch.int64)
    if _indexed_whole(batch):
        # A nested tensor has no row indexing (aten.index.Tensor; tensordict before 0.15 does not
        # work around it): its rows are rebuilt, the rest is indexed by the TensorDict itself.
        nested = [key for key in batch.keys() if _is_nested(batch[key])]
        selected = (batch.exclude(*nested) if nested else batch)[index]
        for key in nested:
            selected[key] = _nested_rows(batch[key], rows)
        return selected
    out: dict[Any, Any] = {}
    for key in batch.keys():
        value = batch[key]
        if _is_nested(value):
            out[key] = _nested_rows(value, rows)
        elif isinstance(value, torch.Tensor):
            out[key] = value[index.to(value.device)]
        elif isinstance(value, np.ndarray):
            out[key] = value[index.numpy()]
        elif isinstance(value, (list, tuple)):
            out[key] = [value[i] for i in rows]
        else:
            raise SeqpackTypeError(
                f"batch[{key!r}] is a {type(value).__name__}: values must be tensors, arrays or lists"
            )
    return out


def _is_nested(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _nested_rows(value: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """A nested tensor of ``value``'s ``rows``, in its layout."""
    pieces = value.unbind()
    return torch.nested.as_nested_tensor([pieces[i] for i in rows], layout=value.layout)


def _indexed_whole(batch: Any) -> bool:
    """A TensorDict (anything with ``batch_size`` that is not a dict): indexed as a whole."""
    return hasattr(batch, "batch_size") and not isinstance(batch, dict)
