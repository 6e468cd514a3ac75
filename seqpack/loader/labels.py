"""Labels in the wrapper: the convention checked and converted where samples are read
(:func:`prepare_labels`, to seqpack's own form, so truncation, the exchange and packing see
one convention), and the loss tokens of every sequence once packed (:func:`loss_token_counts`,
the count :func:`seqpack.thd.pack_sequences` makes), which ride the length gather.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from seqpack.errors import SampleError
from seqpack.options import LABEL_COPY_MIN_TOKENS, LabelFormat
from seqpack.thd import IGNORE_INDEX, label_alignment_counts, looks_misaligned
from seqpack.thd.sample import default_labels, misaligned_labels, misaligned_labels_message, next_token_targets
from seqpack.validation import check_choice

__all__ = ["loss_token_counts", "misaligned_step_message", "prepare_labels"]

Sample = dict[str, torch.Tensor]


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=cu[1:])
    return cu


def prepare_labels(
    sequences: list[Sample], wheres: Sequence[str], label_format: LabelFormat | str
) -> tuple[list[Sample], int, int]:
    """Check and convert the normalised, non-empty ``sequences`` of one read (``wheres``: how
    an error names each).

    A sequence whose labels are aligned the other way than ``label_format`` says
    (:func:`~seqpack.thd.looks_misaligned`) is refused. Under ``"unshifted"`` a sequence that
    carries ``labels`` or ``loss_mask`` gets them moved one token left within it (its last
    token -100); sequences with neither are left alone, and ``"position_aligned"`` labels
    are neither checked nor moved.

    Returns:
        ``(sequences, checked, misaligned)``: the sequences in seqpack's form, and the
        checked tokens of those carrying labels and how many of them are misaligned (the
        step's guard sums them).

    Raises:
        SampleError: Labels aligned the other way than declared, naming the sample and
            ``label_format``.
    """
    label_format = check_choice("label_format", label_format, LabelFormat)
    labelled = [i for i, seq in enumerate(sequences) if "labels" in seq or "loss_mask" in seq]
    if not labelled or label_format is LabelFormat.POSITION_ALIGNED:
        return sequences, 0, 0
    checked, misaligned = _check_alignment(
        sequences, [i for i in labelled if "labels" in sequences[i]], wheres, label_format
    )
    if label_format is LabelFormat.SHIFTED:
        return sequences, checked, misaligned
    picked = [sequences[i] for i in labelled]
    lengths = [int(seq["input_ids"].shape[0]) for seq in picked]
    cu = _offsets(lengths)
    ids = torch.cat([seq["input_ids"] for seq in picked])  # [L]
    last = torch.from_numpy(cu[1:] - 1)
    given = default_labels(ids, last, LabelFormat.UNSHIFTED)  # input_ids where a sequence has no labels
    parts = [seq.get("labels", given[a:b]) for seq, a, b in zip(picked, cu[:-1], cu[1:], strict=True)]
    masks = None
    if any("loss_mask" in seq for seq in picked):
        masks = torch.cat([seq.get("loss_mask", torch.ones(n)) for seq, n in zip(picked, lengths, strict=True)])
    labels, mask = next_token_targets(torch.cat(parts), masks, last, LabelFormat.UNSHIFTED)
    out = list(sequences)
    for i, seq, a, b in zip(labelled, picked, cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        converted = {**seq, "labels": labels[a:b]}
        if "loss_mask" in seq:
            converted["loss_mask"] = mask[a:b]
        out[i] = converted
    return out, checked, misaligned


def _check_alignment(
    sequences: list[Sample], labelled: list[int], wheres: Sequence[str], label_format: LabelFormat
) -> tuple[int, int]:
    """Refuse the first sequence whose labels are misaligned; the sums over ``labelled``."""
    if not labelled:
        return 0, 0
    picked = [sequences[i] for i in labelled]
    cu = _offsets([int(seq["input_ids"].shape[0]) for seq in picked])
    ids = torch.cat([seq["input_ids"] for seq in picked])
    labels = torch.cat([seq["labels"] for seq in picked])
    masks = None
    if any("loss_mask" in seq for seq in picked):
        masks = torch.cat([seq.get("loss_mask", torch.ones(seq["input_ids"].shape[0])) for seq in picked])
    checked, misaligned = misaligned_labels(ids, labels, masks, torch.from_numpy(cu[1:] - 1), label_format)
    total_checked, total_misaligned = torch.stack([checked.sum(), misaligned.sum()]).tolist()  # one host sync
    # Labels in the declared alignment have none misaligned: only then can a sequence be refused.
    if total_misaligned >= LABEL_COPY_MIN_TOKENS:
        per_checked, per_misaligned = label_alignment_counts(ids, labels, masks, cu, label_format)
        refused = np.flatnonzero(looks_misaligned(per_checked, per_misaligned))
        if refused.size:
            k = int(refused[0])
            raise SampleError(
                misaligned_labels_message(
                    wheres[labelled[k]], int(per_checked[k]), int(per_misaligned[k]), label_format
                )
            )
    return int(total_checked), int(total_misaligned)


def misaligned_step_message(step: int, checked: int, misaligned: int, label_format: LabelFormat | str) -> str | None:
    """The error for a step whose labels, summed over every DP rank, are aligned the other way
    than ``label_format`` says, else ``None`` (catches spans each too short to judge alone)."""
    if not looks_misaligned(np.array([checked]), np.array([misaligned]))[0]:
        return None
    return misaligned_labels_message(f"step {step} (the samples of every DP rank)", checked, misaligned, label_format)


def loss_token_counts(pool: Sequence[Sample], truncate_to: int | None = None) -> np.ndarray:
    """Supervised tokens of each sequence once packed (int64 ``[n]``).

    A token counts when its label (the sequence's own, else the next token, -100 at its
    last token) is not -100 and its ``loss_mask`` (when given) is > 0: what
    :func:`~seqpack.thd.pack_sequences` counts in ``num_loss_tokens``.

    Args:
        pool: Non-empty sequences in seqpack's form (:func:`prepare_labels`).
        truncate_to: Count each sequence's first ``truncate_to`` tokens only, as packed
            under ``on_oversize="truncate"``; ``None``: whole sequences.
    """
    lengths = np.fromiter((seq["input_ids"].shape[0] for seq in pool), np.int64, len(pool))
    if truncate_to is not None:
        lengths = np.minimum(lengths, truncate_to)
    if not any("labels" in seq or "loss_mask" in seq for seq in pool):
        return lengths - 1  # default labels: every token but the last
    cu = _offsets(lengths.tolist())
    spans = list(zip(pool, cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    if all("labels" in seq for seq in pool):
        labels = torch.cat([seq["labels"][: b - a] for seq, a, b in spans])  # [L]
    else:  # default labels of the (cut) sequences where a sequence has none
        ids = torch.cat([seq["input_ids"][: b - a] for seq, a, b in spans])
        defaults = default_labels(ids, torch.from_numpy(cu[1:] - 1), LabelFormat.SHIFTED)
        labels = torch.cat([seq["labels"][: b - a] if "labels" in seq else defaults[a:b] for seq, a, b in spans])
    supervised = labels != IGNORE_INDEX
    if any("loss_mask" in seq for seq in pool):
        masks = [seq["loss_mask"][: b - a] if "loss_mask" in seq else torch.ones(b - a) for seq, a, b in spans]
        supervised &= torch.cat(masks).to(supervised.device) > 0
    running = np.zeros(supervised.shape[0] + 1, dtype=np.int64)
    np.cumsum(supervised.cpu().numpy(), out=running[1:])
    return running[cu[1:]] - running[cu[:-1]]
