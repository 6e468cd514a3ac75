"""Offline packing of a whole dataset (:func:`pack_dataset`): rows of one sequence each to
packed rows of at most ``max_tokens`` tokens, packed once by :func:`~seqpack.packing.pack_lengths`.

A packed row holds its sequences back to back:

* ``input_ids`` (int64 ``[T]``), ``position_ids`` (int64 ``[T]``, restarting at 0 at every
  sequence), ``cu_seqlens`` (int32 ``[k + 1]``, the sequences' offsets), ``sample_ids``
  (int64 ``[k]``, the input row of each sequence);
* ``labels`` (int64 ``[T]``) and ``loss_mask`` (float32 ``[T]``, the weight of each label,
  0 wherever the label is -100) in the ``label_format`` the rows came in: ``"unshifted"``
  (Hugging Face, TRL: aligned with ``input_ids``, the model shifts; -100 at the first token
  of every sequence, so no sequence is trained to predict the next one's start),
  ``"shifted"`` (Megatron, NeMo: next-token targets, -100 at every sequence's last token)
  or ``"position_aligned"`` (each position's own target, as given).

The labels go through seqpack's own form on the way (:func:`seqpack.thd.next_token_targets`),
so a row's ``labels`` / ``loss_mask`` follow the sample contract and the alignment guard of
the wrapper; TRL's ``completion_mask`` and ``assistant_masks`` (1 on the tokens to learn,
aligned with ``input_ids``) set the label of every other token to -100.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT32_MAX, LabelFormat, OnOversize
from seqpack.packing.packer import pack_lengths
from seqpack.thd.sample import (
    IGNORE_INDEX,
    default_labels,
    label_alignment_counts,
    looks_misaligned,
    misaligned_labels_message,
    next_token_targets,
    normalize_sample,
)
from seqpack.validation import check_bool, check_choice, check_positive_int, int64_array

__all__ = ["MASK_KEYS", "PACKED_KEYS", "PackedRows", "pack_dataset"]

logger = logging.getLogger(__name__)

MASK_KEYS = ("completion_mask", "assistant_masks")
"""TRL's token masks: 1 on the tokens to learn, aligned with ``input_ids``."""
PACKED_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "sample_ids")
"""The fields of a packed row."""
_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids")
PROGRESS_ROWS = 100_000
"""Rows from which ``progress=None`` shows a progress bar while reading (when the length is known)."""


@dataclasses.dataclass
class _Columns:
    """Rows as flat token arrays: row ``i`` is ``[offsets[i], offsets[i + 1])``."""

    ids: np.ndarray  # int64 [T]
    offsets: np.ndarray  # int64 [R + 1]
    labels: np.ndarray | None = None  # int64 [T], label_format's alignment; rows without: anything
    has_labels: np.ndarray | None = None  # bool [R]
    loss_mask: np.ndarray | None = None  # float32 [T], 1 in rows without one
    token_mask: np.ndarray | None = None  # float32 [T], completion / assistant masks multiplied, 1 where absent
    rows: np.ndarray | None = None  # int64 [R]: the input row of each (None: 0..R-1)


class PackedRows(Sequence[dict[str, torch.Tensor]]):
    """The packed rows of :func:`pack_dataset`, built on access (a map-style dataset): each
    a dict of :data:`PACKED_KEYS` (tensors viewing one flat buffer per field)."""

    def __init__(self, flat: dict[str, np.ndarray], token_offsets: np.ndarray, cu_offsets: np.ndarray,
                 seq_offsets: np.ndarray) -> None:  # fmt: skip
        self._flat = flat
        self._tokens = token_offsets  # int64 [P + 1] into the token fields
        self._cu = cu_offsets  # int64 [P + 1] into cu_seqlens
        self._seqs = seq_offsets  # int64 [P + 1] into sample_ids

    def __len__(self) -> int:
        return int(self._tokens.shape[0]) - 1

    @overload
    def __getitem__(self, k: int) -> dict[str, torch.Tensor]: ...
    @overload
    def __getitem__(self, k: slice) -> list[dict[str, torch.Tensor]]: ...

    def __getitem__(self, k: int | slice) -> dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"packed row {k} of {n}")
        k %= n
        a, b = int(self._tokens[k]), int(self._tokens[k + 1])
        row = {key: torch.from_numpy(self._flat[key][a:b]) for key in _TOKEN_FIELDS}
        row["cu_seqlens"] = torch.from_numpy(self._flat["cu_seqlens"][self._cu[k] : self._cu[k + 1]])
        row["sample_ids"] = torch.from_numpy(self._flat["sample_ids"][self._seqs[k] : self._seqs[k + 1]])
        return row

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for k in range(len(self)):
            yield self[k]


@overload
def pack_dataset(
    rows: Iterable[Mapping[str, Any]],
    max_tokens: int,
    *,
    label_format: LabelFormat | str = ...,
    on_oversize: OnOversize | str = ...,
    progress: bool | None = ...,
) -> PackedRows: ...
@overload
def pack_dataset(
    rows: Any,
    max_tokens: int,
    *,
    label_format: LabelFormat | str = ...,
    on_oversize: OnOversize | str = ...,
    progress: bool | None = ...,
) -> Any: ...


def pack_dataset(
    rows: Any,
    max_tokens: int,
    *,
    label_format: LabelFormat | str = LabelFormat.SHIFTED,
    on_oversize: OnOversize | str = OnOversize.ERROR,
    progress: bool | None = None,
) -> Any:
    """Pack a dataset's rows into rows of at most ``max_tokens`` tokens (module docstring),
    as few as :func:`~seqpack.packing.pack_lengths` finds; deterministic. Packed rows come
    longest sequences first; shuffle them for training if the order matters.

    Args:
        rows: An iterable of mappings, each one sequence: ``input_ids`` and optionally
            ``labels`` and ``loss_mask`` (the sample contract, :func:`seqpack.thd.normalize_sample`,
            in ``label_format``'s alignment), ``completion_mask`` / ``assistant_masks`` (TRL:
            1 on the tokens to learn, aligned with ``input_ids``); other keys are left out.
            Or a ``datasets.Dataset`` with those columns.
        max_tokens: Tokens a packed row holds (at most 2**31 - 1: ``cu_seqlens`` are int32).
        label_format: How the rows' labels are aligned, and the packed rows' labels with them:
            ``"shifted"`` (next-token targets), ``"unshifted"`` (Hugging Face) or
            ``"position_aligned"``. Rows without labels get the next tokens.
        on_oversize: A row longer than ``max_tokens``: ``"error"`` (default), ``"truncate"``
            (its first ``max_tokens`` tokens) or ``"drop"``; truncated and dropped rows are
            counted in a warning. Empty rows are left out and counted alike.
        progress: Show a progress bar (tqdm) while reading rows; ``None``: for inputs of a
            known length of at least 100,000 rows.

    Returns:
        :class:`PackedRows` (a sequence of dicts of tensors, :data:`PACKED_KEYS`), or a
        ``datasets.Dataset`` with those columns when ``rows`` is one.

    Raises:
        SampleError: A row that breaks the sample contract, names a row longer than
            ``max_tokens`` under ``on_oversize="error"``, carries ``position_ids`` that do not
            count 0, 1, ... (a row already packed), or labels aligned the other way than
            ``label_format`` says; each naming the row.
        SeqpackTypeError: ``rows`` not an iterable of mappings; a field of the wrong type.
        ConfigError: ``max_tokens``, ``label_format`` or ``on_oversize`` out of range.
    """
    max_tokens = check_positive_int("max_tokens", max_tokens, maximum=INT32_MAX)
    label_format = check_choice("label_format", label_format, LabelFormat)
    on_oversize = check_choice("on_oversize", on_oversize, OnOversize)
    if progress is not None:
        progress = check_bool("progress", progress)
    hf = sys.modules.get("datasets")
    if hf is not None and isinstance(rows, hf.Dataset):
        columns = _read_dataset(rows)
        packed = _pack(columns, max_tokens, label_format, on_oversize)
        # The output's fingerprint follows from the input's and the arguments (datasets would
        # otherwise hash every packed token).
        key = f"{getattr(rows, '_fingerprint', None)} {max_tokens} {label_format} {on_oversize} {PACKED_KEYS}"
        return _to_dataset(*packed, fingerprint=hashlib.sha256(key.encode()).hexdigest()[:16])
    if isinstance(rows, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(rows, Iterable):
        raise SeqpackTypeError(
            f"rows must be an iterable of mappings (one sequence each) or a datasets.Dataset, got {type(rows).__name__}"
        )
    if progress is None:
        progress = isinstance(rows, Sequence) and len(rows) >= PROGRESS_ROWS
    columns = _read_rows(rows, progress)
    return PackedRows(*_pack(columns, max_tokens, label_format, on_oversize))


# --- reading ---------------------------------------------------------------------------------


def _token_mask(value: Any, key: str, where: str, length: int) -> np.ndarray:
    """A completion / assistant mask as float32 ``[length]``: numbers >= 0 (bools, 0/1)."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise SeqpackTypeError(f"{where}: {key!r} must hold 0/1 (or bools), got dtype {array.dtype}")
    if array.ndim != 1 or array.shape[0] != length:
        raise SampleError(f"{where}: {key!r} has shape {array.shape} but 'input_ids' has {length} tokens")
    mask = array.astype(np.float32)
    valid = np.isfinite(mask) & (mask >= 0)
    if not valid.all():
        bad = int(np.flatnonzero(~valid)[0])
        raise SampleError(f"{where}: {key!r} must be >= 0 and finite, got {array[bad]!r} at token {bad}")
    return mask


def _read_rows(rows: Iterable[Any], progress: bool) -> _Columns:
    """Every row normalised (the sample contract) and concatenated."""
    if progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="seqpack: reading rows", unit="row")
    ids: list[np.ndarray] = []
    labels: list[np.ndarray | None] = []
    loss_masks: list[np.ndarray | None] = []
    token_masks: list[np.ndarray | None] = []
    for i, row in enumerate(rows):
        where = f"row {i}"
        sample = normalize_sample(row, where=where)
        n = int(sample["input_ids"].shape[0])
        _check_positions(sample.get("position_ids"), where)
        ids.append(sample["input_ids"].cpu().numpy())
        labels.append(sample["labels"].cpu().numpy() if "labels" in sample else None)
        loss_masks.append(sample["loss_mask"].cpu().numpy() if "loss_mask" in sample else None)
        mask = None
        for key in MASK_KEYS:
            value = row.get(key)
            if value is not None:
                part = _token_mask(value, key, where, n)
                mask = part if mask is None else mask * part
        token_masks.append(mask)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([a.shape[0] for a in ids], out=offsets[1:])
    columns = _Columns(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64), offsets)
    if any(x is not None for x in labels):
        columns.has_labels = np.array([x is not None for x in labels])
        columns.labels = np.concatenate([x if x is not None else a for x, a in zip(labels, ids, strict=True)])
    if any(x is not None for x in loss_masks):
        columns.loss_mask = _joined(loss_masks, ids)
    if any(x is not None for x in token_masks):
        columns.token_mask = _joined(token_masks, ids)
    return columns


def _joined(parts: list[np.ndarray | None], ids: list[np.ndarray]) -> np.ndarray:
    filled = [x if x is not None else np.ones(a.shape[0], np.float32) for x, a in zip(parts, ids, strict=True)]
    return np.concatenate(filled)


def _check_positions(positions: torch.Tensor | None, where: str) -> None:
    if positions is None:
        return
    expected = torch.arange(positions.shape[0], device=positions.device)
    if not torch.equal(positions, expected):
        bad = int(torch.nonzero(positions != expected)[0])
        raise SampleError(
            f"{where}: 'position_ids' is {int(positions[bad])} at token {bad} where 0, 1, 2, ... are expected: "
            "pack_dataset packs rows of one sequence each (split packed rows first, or leave position_ids out)"
        )


def _read_dataset(dataset: Any) -> _Columns:
    """A ``datasets.Dataset``'s columns as flat arrays (arrow, no per-row Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")[:]
    if "input_ids" not in table.column_names:
        raise SampleError(f"the dataset has no 'input_ids' column (columns: {sorted(table.column_names)})")

    def column(key: str) -> tuple[np.ndarray, np.ndarray]:
        array = table.column(key).combine_chunks()
        if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
            raise SeqpackTypeError(f"the dataset's {key!r} column must hold a list per row, got {array.type}")
        if array.null_count:
            bad = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise SampleError(f"row {bad}: {key!r} is null (fill it, or leave the column out)")
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(array).to_numpy(zero_copy_only=False)
        return values, lengths

    ids, lengths = column("input_ids")
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    columns = _Columns(int64_array("input_ids", ids), offsets)

    def aligned(key: str) -> np.ndarray:
        values, row_lengths = column(key)
        wrong = np.flatnonzero(row_lengths != lengths)
        if wrong.size:
            i = int(wrong[0])
            raise SampleError(f"row {i}: {key!r} has {row_lengths[i]} tokens but 'input_ids' has {lengths[i]}")
        return values

    if "position_ids" in table.column_names:
        positions = int64_array("position_ids", aligned("position_ids"))
        expected = np.arange(positions.shape[0]) - np.repeat(offsets[:-1], lengths)
        wrong = np.flatnonzero(positions != expected)
        if wrong.size:
            row = int(np.searchsorted(offsets, wrong[0], side="right")) - 1
            _check_positions(torch.from_numpy(positions[offsets[row] : offsets[row + 1]]), f"row {row}")
    if "labels" in table.column_names:
        columns.labels = int64_array("labels", aligned("labels"))
        columns.has_labels = np.ones(lengths.shape[0], dtype=bool)
    if "loss_mask" in table.column_names:
        columns.loss_mask = _weights(aligned("loss_mask"), "loss_mask", offsets)
    for key in MASK_KEYS:
        if key in table.column_names:
            mask = _weights(aligned(key), key, offsets)
            columns.token_mask = mask if columns.token_mask is None else columns.token_mask * mask
    return columns


def _weights(values: np.ndarray, key: str, offsets: np.ndarray) -> np.ndarray:
    if values.dtype.kind not in "biuf":
        raise SeqpackTypeError(f"the dataset's {key!r} column must hold numbers, got dtype {values.dtype}")
    weights = values.astype(np.float32)
    valid = np.isfinite(weights) & (weights >= 0)
    if not valid.all():
        t = int(np.flatnonzero(~valid)[0])
        row = int(np.searchsorted(offsets, t, side="right")) - 1
        raise SampleError(f"row {row}: {key!r} must be >= 0 and finite, got {values[t]!r} at token {t - offsets[row]}")
    return weights


# --- packing ---------------------------------------------------------------------------------


def _select_rows(columns: _Columns, keep: np.ndarray, cut: np.ndarray) -> _Columns:
    """The rows ``keep`` (indices), each cut to ``cut`` tokens."""
    lengths = cut[keep]
    offsets = np.zeros(keep.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(columns.offsets[keep] - offsets[:-1], lengths) + np.arange(int(offsets[-1]))

    def pick(values: np.ndarray | None) -> np.ndarray | None:
        return None if values is None else values[index]

    rows = keep if columns.rows is None else columns.rows[keep]
    has_labels = None if columns.has_labels is None else columns.has_labels[keep]
    return _Columns(
        columns.ids[index], offsets, pick(columns.labels), has_labels, pick(columns.loss_mask),
        pick(columns.token_mask), rows,
    )  # fmt: skip


def _fit(columns: _Columns, max_tokens: int, on_oversize: OnOversize) -> _Columns:
    """Leave out empty rows and apply ``on_oversize``, counting what changed in a warning."""
    lengths = np.diff(columns.offsets)
    over = np.flatnonzero(lengths > max_tokens)
    if over.size and on_oversize is OnOversize.ERROR:
        i = int(over[0])
        raise SampleError(
            f"row {i} has {int(lengths[i])} tokens > max_tokens={max_tokens} ({over.size} rows are longer): pass "
            "on_oversize='truncate' to keep their first max_tokens tokens or 'drop' to leave them out, or raise "
            "max_tokens"
        )
    empty = lengths == 0
    if not over.size and not empty.any():
        return columns
    keep_mask = ~empty
    if on_oversize is OnOversize.DROP:
        keep_mask[over] = False
    parts = [f"{int(empty.sum())} empty rows left out"] if empty.any() else []
    if over.size and on_oversize is OnOversize.TRUNCATE:
        lost = int(lengths[over].sum()) - max_tokens * over.size
        parts.append(f"{over.size} rows truncated to max_tokens={max_tokens} ({lost} tokens not trained)")
    elif over.size:
        lost = int(lengths[over].sum())
        parts.append(f"{over.size} rows left out, longer than max_tokens={max_tokens} ({lost} tokens not trained)")
    logger.warning("pack_dataset: %s", "; ".join(parts))
    return _select_rows(columns, np.flatnonzero(keep_mask), np.minimum(lengths, max_tokens))


def _targets(columns: _Columns, label_format: LabelFormat) -> tuple[np.ndarray, np.ndarray]:
    """Every row's labels and loss mask in seqpack's form (next-token targets)."""
    ids = torch.from_numpy(columns.ids)
    last = torch.from_numpy(columns.offsets[1:] - 1)
    given = None
    if columns.labels is not None:
        assert columns.has_labels is not None
        given = torch.from_numpy(columns.labels)
        _check_alignment(columns, given, label_format)
        labels = given
        if not columns.has_labels.all():
            per_token = torch.from_numpy(np.repeat(columns.has_labels, np.diff(columns.offsets)))
            labels = torch.where(per_token, given, default_labels(ids, last, label_format))
    else:
        labels = default_labels(ids, last, label_format)
    loss_mask = None if columns.loss_mask is None else torch.from_numpy(columns.loss_mask)
    targets, weights = next_token_targets(labels, loss_mask, last, label_format)
    target, weight = targets.numpy(), weights.numpy()
    if columns.token_mask is not None:
        mask = columns.token_mask
        if label_format is not LabelFormat.POSITION_ALIGNED:  # the target at t is token t + 1's
            # A row's last token has no next token in the row: its target stays as it is.
            mask = np.append(mask[1:], np.float32(1.0))
            mask[columns.offsets[1:] - 1] = 1.0
        weight = weight * mask
        target = np.where(mask > 0, target, IGNORE_INDEX)
    return target, weight.astype(np.float32, copy=False)


def _check_alignment(columns: _Columns, labels: torch.Tensor, label_format: LabelFormat) -> None:
    """Refuse the first row whose labels are aligned the other way than ``label_format``."""
    assert columns.has_labels is not None
    if label_format is LabelFormat.POSITION_ALIGNED:
        return
    mask = None if columns.loss_mask is None else torch.from_numpy(columns.loss_mask)
    ids = torch.from_numpy(columns.ids)
    checked, misaligned = label_alignment_counts(ids, labels, mask, columns.offsets, label_format)
    refused = np.flatnonzero(looks_misaligned(checked, misaligned) & columns.has_labels)
    if refused.size:
        k = int(refused[0])
        row = k if columns.rows is None else int(columns.rows[k])
        raise SampleError(misaligned_labels_message(f"row {row}", int(checked[k]), int(misaligned[k]), label_format))


def _pack(
    columns: _Columns, max_tokens: int, label_format: LabelFormat, on_oversize: OnOversize
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """The packed fields as flat arrays, and the offsets of every packed row in them
    (tokens, ``cu_seqlens`` entries, sequences)."""
    columns = _fit(columns, max_tokens, on_oversize)
    lengths = np.diff(columns.offsets)
    target, weight = _targets(columns, label_format)
    packing = pack_lengths(lengths, max_tokens)
    order = packing.order
    seq_lengths = lengths[order]  # [S], pack by pack
    starts = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(seq_lengths, out=starts[1:])  # where each sequence starts in the packed stream
    total = int(starts[-1])
    index = np.repeat(columns.offsets[order] - starts[:-1], seq_lengths) + np.arange(total)
    flat: dict[str, np.ndarray] = {"input_ids": columns.ids[index]}
    labels, loss_mask = target[index], weight[index]
    if label_format is LabelFormat.UNSHIFTED:
        # Back to Hugging Face's alignment: token t's label is the target of t - 1; a
        # sequence's first token has none (-100), so no sequence predicts the next one.
        labels = np.concatenate([[IGNORE_INDEX], labels[:-1]]) if total else labels
        loss_mask = np.concatenate([np.zeros(1, np.float32), loss_mask[:-1]]) if total else loss_mask
        labels[starts[:-1]] = IGNORE_INDEX
        loss_mask[starts[:-1]] = 0.0
    flat["labels"] = labels
    flat["loss_mask"] = loss_mask
    flat["position_ids"] = np.arange(total, dtype=np.int64) - np.repeat(starts[:-1], seq_lengths)
    num_packs = packing.num_packs
    token_offsets = np.zeros(num_packs + 1, dtype=np.int64)
    np.cumsum(packing.tokens, out=token_offsets[1:])
    # cu_seqlens of every packed row, back to back: pack k's k + 1 ... entries start at
    # cu_packs[k] + k, its first is 0.
    per_pack = np.diff(packing.cu_packs)
    pack_of_seq = np.repeat(np.arange(num_packs), per_pack)
    cu = np.zeros(order.shape[0] + num_packs, dtype=np.int32)
    cu[np.arange(order.shape[0]) + pack_of_seq + 1] = starts[1:] - token_offsets[pack_of_seq]
    flat["cu_seqlens"] = cu
    rows = order if columns.rows is None else columns.rows[order]
    flat["sample_ids"] = rows.astype(np.int64, copy=False)
    logger.info(
        "pack_dataset: %d rows of %d tokens into %d packed rows of at most %d (the token bound is %d)",
        order.shape[0], total, num_packs, max_tokens, packing.token_bound,
    )  # fmt: skip
    return flat, token_offsets, packing.cu_packs + np.arange(num_packs + 1), packing.cu_packs


def _to_dataset(flat: dict[str, np.ndarray], token_offsets: np.ndarray, cu_offsets: np.ndarray,
                seq_offsets: np.ndarray, fingerprint: str) -> Any:  # fmt: skip
    """The packed rows as an in-memory ``datasets.Dataset``."""
    import pyarrow as pa

    datasets = importlib.import_module("datasets")  # typed as Any: it ships no type hints
    in_memory = importlib.import_module("datasets.table").InMemoryTable

    def lists(values: np.ndarray, offsets: np.ndarray) -> Any:
        if offsets[-1] <= INT32_MAX:
            return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))

    columns = {key: lists(flat[key], token_offsets) for key in _TOKEN_FIELDS}
    columns["cu_seqlens"] = lists(flat["cu_seqlens"], cu_offsets)
    columns["sample_ids"] = lists(flat["sample_ids"], seq_offsets)
    return datasets.Dataset(in_memory(pa.table(columns)), fingerprint=fingerprint)
