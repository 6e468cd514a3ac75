"""Pre-packed samples: a dataloader sample that carries ``cu_seqlens`` holds several
sequences; :func:`split_packed_sample` cuts it into them and :func:`sample_sequences` gives
the sequences of any sample (one for an ordinary sample)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError
from seqpack.options import LabelFormat
from seqpack.thd.layout import as_offsets
from seqpack.thd.sample import IGNORE_INDEX, TOKEN_KEYS, normalize_sample
from seqpack.validation import check_choice, check_mapping

__all__ = ["sample_sequences", "split_packed_sample"]


def _flat_offsets(value: Any, name: str) -> torch.Tensor:
    """A pre-packed sample's offsets, flattened (a collate may give them as ``[1, N+1]``)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return as_offsets(value.reshape(-1), name)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        return as_offsets(np.asarray(value).reshape(-1), name)
    return as_offsets(value, name)


def split_packed_sample(
    sample: Mapping[str, Any], *, keys: Sequence[str] = TOKEN_KEYS
) -> list[dict[str, torch.Tensor]]:
    """Split a pre-packed sample (one carrying ``cu_seqlens``) into its sequences.

    ``cu_seqlens`` gives real lengths; ``cu_seqlens_padded`` (optional) the offsets. Pad
    tokens between sequences are dropped: seqpack re-pads after scheduling.

    Raises:
        SeqpackTypeError: Offsets that are not integers (never truncated).
        SampleError: No ``cu_seqlens``, offsets of unequal length or not starting at 0, a
            real length outside its slot, or a slot past the end of ``input_ids``.
    """
    check_mapping("sample", sample)
    if "cu_seqlens" not in sample:
        raise SampleError("split_packed_sample needs a 'cu_seqlens' field")
    cu = _flat_offsets(sample["cu_seqlens"], "cu_seqlens").cpu()
    padded = sample.get("cu_seqlens_padded")
    cu_padded = cu if padded is None else _flat_offsets(padded, "cu_seqlens_padded").cpu()
    if cu.shape != cu_padded.shape:
        raise SampleError(f"cu_seqlens has {cu.numel()} entries but cu_seqlens_padded has {cu_padded.numel()}")
    for name, offsets in (("cu_seqlens", cu), ("cu_seqlens_padded", cu_padded)):
        if offsets.numel() and int(offsets[0]) != 0:
            raise SampleError(f"{name} must start at 0, got {offsets[:4].tolist()}")
    starts, ends = cu_padded[:-1], cu_padded[1:]
    lens = cu[1:] - cu[:-1]
    bad = torch.nonzero((lens < 0) | (starts + lens > ends) | (starts < 0)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise SampleError(
            f"inconsistent pack layout: real length {int(lens[i])} in slot [{int(starts[i])}, {int(ends[i])})"
        )
    if not isinstance(sample.get("input_ids"), torch.Tensor) or sample["input_ids"].dim() != 1:
        raise SampleError("a pre-packed sample needs 'input_ids' as a 1-D tensor (normalize_sample it first)")
    total = int(sample["input_ids"].shape[0])
    if ends.numel() and int(ends[-1]) > total:
        raise SampleError(f"cu_seqlens_padded ends at {int(ends[-1])} but input_ids has {total} tokens")
    present = [key for key in keys if sample.get(key) is not None]
    return [
        {key: sample[key][start : start + length] for key in present}
        for start, length in zip(starts.tolist(), lens.tolist(), strict=True)
    ]


def sample_sequences(
    sample: Any, *, where: str = "sample", label_format: LabelFormat | str = LabelFormat.SHIFTED
) -> list[dict[str, torch.Tensor]]:
    """The sequences of one dataloader sample, each under the sample contract.

    A sample carrying ``cu_seqlens`` is pre-packed: normalised as a whole, then split by
    :func:`split_packed_sample`. Any other sample is one sequence. Under
    ``label_format="shifted"`` each split sequence's last label (the next document's first
    token) becomes -100, so that no document learns where the next one starts.

    Raises:
        SeqpackTypeError, SampleError: As :func:`~seqpack.thd.normalize_sample`; a
            pre-packed sample with a bad layout is a ``SampleError`` naming it.
    """
    normalized = normalize_sample(sample, where=where)
    if "cu_seqlens" not in sample:
        return [normalized]
    offsets = {key: sample[key] for key in ("cu_seqlens", "cu_seqlens_padded") if sample.get(key) is not None}
    try:
        sequences = split_packed_sample({**normalized, **offsets})
    except (ValueError, TypeError, IndexError) as exc:
        raise SampleError(f"{where} is pre-packed with a bad layout: {exc}") from None
    if check_choice("label_format", label_format, LabelFormat) is LabelFormat.SHIFTED:
        for sequence in sequences:
            if sequence["input_ids"].shape[0] and "labels" in sequence:
                sequence["labels"] = sequence["labels"].clone()
                sequence["labels"][-1] = IGNORE_INDEX
                if "loss_mask" in sequence:
                    sequence["loss_mask"] = sequence["loss_mask"].clone()
                    sequence["loss_mask"][-1] = 0
    return sequences
