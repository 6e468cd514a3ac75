"""Labels in the wrapper: the convention checked and converted where samples are read, and
the loss tokens of every sequence, which ride the length gather.

Every sequence leaves :func:`prepare_labels` in seqpack's own form (next-token targets,
``label_format="shifted"``), so truncation, the exchange and packing see one convention.
:func:`loss_token_counts` then counts what each sequence adds to ``num_loss_tokens`` once it
is packed (truncated first under ``on_oversize="truncate"``): the same count
:func:`seqpack.thd.pack_sequences` makes, for every DP rank's sequences on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from seqpack.errors import SampleError
from seqpack.options import LABEL_COPY_MIN_TOKENS, LabelFormat
from seqpack.thd import IGNORE_INDEX, label_copy_counts, looks_unshifted
from seqpack.thd.sample import copied_labels, copied_labels_message, default_labels, next_token_targets

__all__ = ["copied_step_message", "loss_token_counts", "prepare_labels"]

Sample = dict[str, torch.Tensor]


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=cu[1:])
    return cu


def prepare_labels(
    sequences: list[Sample], wheres: Sequence[str], label_format: LabelFormat
) -> tuple[list[Sample], int, int]:
    """Check and convert the (non-empty) sequences of one read.

    Under ``"shifted"`` a sequence whose labels copy its ``input_ids``
    (:func:`~seqpack.thd.looks_unshifted`) is refused. Under ``"unshifted"`` a sequence that
    carries ``labels`` or ``loss_mask`` gets both moved one token left within it
    (:func:`~seqpack.thd.sample.next_token_targets`; its last token -100): labels always,
    ``loss_mask`` when it had one. Sequences with neither are left alone (their default
    labels are the next tokens under either convention).

    Args:
        sequences: Normalised sequences (:func:`~seqpack.thd.sample_sequences`), none empty.
        wheres: How an error names each sequence (``"sample 4 of this rank's data"``).
        label_format: How the samples' labels are aligned.

    Returns:
        ``(sequences, supervised, copied)``: the sequences in seqpack's form, and under
        ``"shifted"`` the supervised tokens of those carrying labels and how many of them
        copy their own token (sums, for the step's guard; 0 otherwise).

    Raises:
        SampleError: ``"shifted"`` labels that copy ``input_ids``, naming the sample and
            ``label_format``.
    """
    labelled = [i for i, seq in enumerate(sequences) if "labels" in seq or "loss_mask" in seq]
    if not labelled:
        return sequences, 0, 0
    if label_format is LabelFormat.SHIFTED:
        return sequences, *_check_copies(sequences, [i for i in labelled if "labels" in sequences[i]], wheres)
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
    return out, 0, 0


def _check_copies(sequences: list[Sample], labelled: list[int], wheres: Sequence[str]) -> tuple[int, int]:
    """Refuse the first sequence whose labels copy its input; the sums over ``labelled``."""
    if not labelled:
        return 0, 0
    picked = [sequences[i] for i in labelled]
    cu = _offsets([int(seq["input_ids"].shape[0]) for seq in picked])
    ids = torch.cat([seq["input_ids"] for seq in picked])
    labels = torch.cat([seq["labels"] for seq in picked])
    masks = None
    if any("loss_mask" in seq for seq in picked):
        masks = torch.cat([seq.get("loss_mask", torch.ones(seq["input_ids"].shape[0])) for seq in picked])
    supervised = labels != IGNORE_INDEX
    if masks is not None:
        supervised &= masks > 0
    copied = copied_labels(ids, labels, masks, torch.from_numpy(cu[1:] - 1))
    total_supervised, total_copied = torch.stack([supervised.sum(), copied.sum()]).tolist()  # one host sync
    # Next-token labels have no copies: only then can a sequence be refused (the packer's shortcut).
    if total_copied >= LABEL_COPY_MIN_TOKENS:
        per_supervised, per_copied = label_copy_counts(ids, labels, masks, cu)
        refused = np.flatnonzero(looks_unshifted(per_supervised, per_copied))
        if refused.size:
            k = int(refused[0])
            raise SampleError(copied_labels_message(wheres[labelled[k]], int(per_supervised[k]), int(per_copied[k])))
    return int(total_supervised), int(total_copied)


def copied_step_message(step: int, supervised: int, copied: int) -> str | None:
    """The error for a step whose ``"shifted"`` labels, summed over every DP rank, copy
    ``input_ids`` (:func:`~seqpack.thd.looks_unshifted` on the sums), else ``None``.

    Catches Hugging Face-style labels whose supervised spans are each too short for the
    per-sample check."""
    if not looks_unshifted(np.array([supervised]), np.array([copied]))[0]:
        return None
    return copied_labels_message(f"step {step} (the samples of every DP rank)", supervised, copied)


def loss_token_counts(pool: Sequence[Sample], truncate_to: int | None = None) -> np.ndarray:
    """Supervised tokens of each sequence once packed (int64 ``[n]``).

    A token counts when its label (the sequence's own, else the next token, -100 at its
    last token) is not -100 and its ``loss_mask`` (when given) is > 0: what
    :func:`~seqpack.thd.pack_sequences` counts in ``num_loss_tokens``.

    Args:
        pool: Non-empty sequences in seqpack's form (:func:`prepare_labels`).
        truncate_to: Count each sequence's first ``truncate_to`` tokens only, as packed
            under ``on_oversize="truncate"`` (its labels cut there, default labels of the
            cut sequence); ``None``: whole sequences.
    """
    cut = None if truncate_to is None else int(truncate_to)
    lengths = np.fromiter((seq["input_ids"].shape[0] for seq in pool), np.int64, len(pool))
    if cut is not None:
        lengths = np.minimum(lengths, cut)
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
