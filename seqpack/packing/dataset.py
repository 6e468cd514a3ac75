"""Offline packing of a whole dataset (:func:`pack_dataset`): the rows' sequences to packed
rows of at most ``max_tokens`` tokens, packed once by :func:`~seqpack.packing.pack_lengths`.

A row is one sequence, or several when it carries ``cu_seqlens`` (a row packed already): it
is split into its sequences as the wrapper splits such a sample
(:func:`seqpack.thd.split_packed_sample`). A packed row holds its sequences back to back:

* ``input_ids`` (``[T]``), ``position_ids`` (int64 ``[T]``, restarting at 0 at every
  sequence), ``cu_seqlens`` (int32 ``[k + 1]``, the sequences' offsets), ``sample_ids``
  (int64 ``[k]``, the input row of each sequence), ``seq_lengths`` (int32 ``[k]``, the
  sequences' lengths: the column TRL's padding-free collator reads);
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

The sequences are read once into index arrays (where each one's tokens are); the packed
rows are then built :data:`CHUNK_TOKENS` tokens at a time, so a ``datasets.Dataset`` is
packed from its Arrow buffers into Arrow batches without a Python loop over rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import operator
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT32_MAX, INT64_MAX, LabelFormat, OnOversize
from seqpack.packing.packer import pack_lengths
from seqpack.thd.prepacked import split_packed_sample
from seqpack.thd.sample import (
    IGNORE_INDEX,
    default_labels,
    label_alignment_counts,
    looks_misaligned,
    misaligned_labels_message,
    next_token_targets,
    normalize_sample,
)
from seqpack.validation import check_bool, check_choice, check_positive_int

__all__ = ["CHUNK_TOKENS", "MASK_KEYS", "PACKED_KEYS", "PackedRows", "pack_dataset"]

logger = logging.getLogger(__name__)

MASK_KEYS = ("completion_mask", "assistant_masks")
"""TRL's token masks: 1 on the tokens to learn, aligned with ``input_ids``."""
PACKED_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "sample_ids", "seq_lengths")
"""The fields of a packed row."""
_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids")
_READ_KEYS = ("input_ids", "labels", "loss_mask", *MASK_KEYS)  # the per-token fields packing reads
_OFFSET_KEYS = ("cu_seqlens", "cu_seqlens_padded")
_Chunk = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]  # fields, token offsets, sequences per packed row
CHUNK_TOKENS = 1 << 18
"""Tokens of packed rows built at a time (at least one packed row)."""
PROGRESS_ROWS = 100_000
"""Rows from which ``progress=None`` shows a progress bar while reading (when the length is known)."""


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i], ..., starts[i] + lengths[i] - 1`` for every ``i``, concatenated (int64)."""
    ends = np.cumsum(lengths, dtype=np.int64)
    return np.repeat(starts - ends + lengths, lengths) + np.arange(int(ends[-1]) if ends.size else 0)


@dataclasses.dataclass
class _Sequences:
    """Where every sequence's tokens are: sequence ``s`` of field ``key`` is
    ``values[key][chunk[s]][start[s] : start[s] + lengths[s]]``."""

    lengths: np.ndarray  # int64 [S]
    rows: np.ndarray  # int64 [S]: the input row of each
    part: np.ndarray | None  # int64 [S]: its index in a pre-packed row, -1 in other rows (None: no row is one)
    chunk: np.ndarray  # int64 [S]
    start: np.ndarray  # int64 [S]
    values: dict[str, list[np.ndarray]]  # per field of _READ_KEYS present: its values, chunk by chunk
    has_labels: np.ndarray | None = None  # bool [S] where "labels" is present: the row brought labels

    def where(self, s: int) -> str:
        row = f"row {int(self.rows[s])}"
        return row if self.part is None or self.part[s] < 0 else f"{row}, sequence {int(self.part[s])}"

    def select(self, keep: np.ndarray, lengths: np.ndarray) -> _Sequences:
        """The sequences ``keep`` (indices), each cut to ``lengths`` tokens (its first ones)."""
        pick = None if self.part is None else self.part[keep]
        has_labels = None if self.has_labels is None else self.has_labels[keep]
        return _Sequences(lengths[keep], self.rows[keep], pick, self.chunk[keep], self.start[keep], self.values,
                          has_labels)  # fmt: skip

    def gather(self, key: str, seqs: np.ndarray) -> np.ndarray:
        """The tokens of ``seqs`` (indices) in field ``key``, back to back."""
        chunks, lengths, start = self.values[key], self.lengths[seqs], self.start[seqs]
        if len(chunks) == 1:
            return chunks[0][_ranges(start, lengths)]
        chunk = self.chunk[seqs]
        out = np.empty(int(lengths.sum()), dtype=chunks[0].dtype)
        at = np.cumsum(lengths) - lengths
        for c in np.unique(chunk).tolist():
            mine = chunk == c
            out[_ranges(at[mine], lengths[mine])] = chunks[c][_ranges(start[mine], lengths[mine])]
        return out


class PackedRows(Sequence[dict[str, torch.Tensor]]):
    """The packed rows of :func:`pack_dataset`, built on access (a map-style dataset): each
    a dict of :data:`PACKED_KEYS` (tensors viewing one flat buffer per field)."""

    def __init__(self, flat: dict[str, np.ndarray], token_offsets: np.ndarray, cu_offsets: np.ndarray,
                 seq_offsets: np.ndarray) -> None:  # fmt: skip
        self._flat = flat
        self._tokens = token_offsets  # int64 [P + 1] into the token fields
        self._cu = cu_offsets  # int64 [P + 1] into cu_seqlens
        self._seqs = seq_offsets  # int64 [P + 1] into sample_ids and seq_lengths

    def __len__(self) -> int:
        return int(self._tokens.shape[0]) - 1

    @overload
    def __getitem__(self, k: int) -> dict[str, torch.Tensor]: ...
    @overload
    def __getitem__(self, k: slice) -> list[dict[str, torch.Tensor]]: ...

    def __getitem__(self, k: int | slice) -> dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        try:
            k = operator.index(k)
        except TypeError:
            raise SeqpackTypeError(
                f"packed row indices must be integers or slices, got {k!r} ({type(k).__name__})"
            ) from None
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"packed row {k} of {n}")
        k %= n
        a, b = int(self._tokens[k]), int(self._tokens[k + 1])
        row = {key: torch.from_numpy(self._flat[key][a:b]) for key in _TOKEN_FIELDS}
        row["cu_seqlens"] = torch.from_numpy(self._flat["cu_seqlens"][self._cu[k] : self._cu[k + 1]])
        for key in ("sample_ids", "seq_lengths"):
            row[key] = torch.from_numpy(self._flat[key][self._seqs[k] : self._seqs[k + 1]])
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
    """Pack a dataset's sequences into rows of at most ``max_tokens`` tokens (module
    docstring), as few as :func:`~seqpack.packing.pack_lengths` finds; deterministic. Packed
    rows come longest sequences first; shuffle them for training if the order matters.

    Args:
        rows: An iterable of mappings: ``input_ids`` and optionally ``labels`` and
            ``loss_mask`` (the sample contract, :func:`seqpack.thd.normalize_sample`, in
            ``label_format``'s alignment), ``completion_mask`` / ``assistant_masks`` (TRL: 1 on
            the tokens to learn, aligned with ``input_ids``), ``cu_seqlens`` (and
            ``cu_seqlens_padded``) in a row packed already, which is split into its sequences;
            other keys are left out. Or a ``datasets.Dataset`` with those columns.
        max_tokens: Tokens a packed row holds (at most 2**31 - 1: ``cu_seqlens`` are int32).
        label_format: How the rows' labels are aligned, and the packed rows' labels with them:
            ``"shifted"`` (next-token targets), ``"unshifted"`` (Hugging Face: pass this to
            feed the packed rows to a Hugging Face model) or ``"position_aligned"``. Rows
            without labels get the next tokens.
        on_oversize: A sequence longer than ``max_tokens``: ``"error"`` (default),
            ``"truncate"`` (its first ``max_tokens`` tokens) or ``"drop"``; truncated and
            dropped sequences are counted in a warning. Empty ones are left out and counted alike.
        progress: Show a progress bar (tqdm) while reading rows; ``None``: for inputs of a
            known length of at least 100,000 rows. (A ``datasets.Dataset`` is read whole.)

    Returns:
        :class:`PackedRows` (a sequence of dicts of tensors, :data:`PACKED_KEYS`), or, when
        ``rows`` is a ``datasets.Dataset``, a ``datasets.Dataset`` with those columns
        (``input_ids`` of the input's integer type), written batch by batch to an Arrow file
        beside the input's cache files (else in datasets' temporary cache directory) and
        memory-mapped, as ``Dataset.map`` writes its results.

    Raises:
        SampleError: A row that breaks the sample contract or carries a bad ``cu_seqlens``
            layout, a sequence longer than ``max_tokens`` under ``on_oversize="error"``,
            ``position_ids`` that do not count 0, 1, ... in a sequence, or labels aligned the
            other way than ``label_format`` says (in a row, or in the rows together); each
            naming the row.
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
        sequences = _fit(_read_dataset(rows), max_tokens, on_oversize)
        # The output's fingerprint follows from the input's and the arguments (datasets would
        # otherwise hash every packed token).
        key = f"{getattr(rows, '_fingerprint', None)} {max_tokens} {label_format} {on_oversize} {PACKED_KEYS}"
        fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
        # Labels and positions stored as int32 where they fit (datasets reads integers as int64 tensors).
        narrow = all(np.can_cast(sequences.values[key][0].dtype, np.int32) for key in ("input_ids", "labels")
                     if key in sequences.values)  # fmt: skip
        dtypes = dict(labels=np.int32 if narrow else np.int64, position_ids=np.int32)
        chunks = _packed_chunks(sequences, max_tokens, label_format, CHUNK_TOKENS)
        return _write_dataset(chunks, rows, fingerprint, dtypes)
    if isinstance(rows, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(rows, Iterable):
        raise SeqpackTypeError(
            f"rows must be an iterable of mappings (one sequence each) or a datasets.Dataset, got {type(rows).__name__}"
        )
    if progress is None:
        progress = isinstance(rows, Sequence) and len(rows) >= PROGRESS_ROWS
    sequences = _fit(_read_rows(rows, progress), max_tokens, on_oversize)
    return _packed_rows(_packed_chunks(sequences, max_tokens, label_format, None))  # in memory anyway: one pass


# --- reading ---------------------------------------------------------------------------------


def _token_mask(value: Any, key: str, where: str, length: int) -> torch.Tensor:
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
    return torch.from_numpy(mask)


def _read_rows(rows: Iterable[Any], progress: bool) -> _Sequences:
    """Every row normalised (the sample contract), split into its sequences, concatenated."""
    if progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="seqpack: reading rows", unit="row")
    parts: dict[str, list[np.ndarray | None]] = {key: [] for key in _READ_KEYS}
    row_of: list[int] = []
    part: list[int] = []
    any_prepacked = False
    for i, row in enumerate(rows):
        where = f"row {i}"
        sample: dict[str, torch.Tensor] = normalize_sample(row, where=where)
        n = int(sample["input_ids"].shape[0])
        sample.update({key: _token_mask(row[key], key, where, n) for key in MASK_KEYS if row.get(key) is not None})
        sequences = [sample]
        prepacked = row.get("cu_seqlens") is not None
        any_prepacked |= prepacked
        if prepacked:
            offsets = {key: row[key] for key in _OFFSET_KEYS if row.get(key) is not None}
            try:
                sequences = split_packed_sample({**sample, **offsets}, keys=tuple(sample))
            except (ValueError, TypeError, IndexError) as exc:
                raise SampleError(f"{where} is pre-packed with a bad layout: {exc}") from None
        for k, sequence in enumerate(sequences):
            _check_positions(sequence.get("position_ids"), f"{where}, sequence {k}" if prepacked else where)
            for key in _READ_KEYS:
                parts[key].append(sequence[key].cpu().numpy() if key in sequence else None)
            row_of.append(i)
            part.append(k if prepacked else -1)
    ids = [a for a in parts["input_ids"] if a is not None]
    lengths = np.array([a.shape[0] for a in ids], dtype=np.int64)
    values = {"input_ids": [np.concatenate([np.zeros(0, np.int64), *ids])]}
    for key in _READ_KEYS[1:]:
        if any(x is not None for x in parts[key]):  # rows without: their ids as labels (not used), weights 1
            fill = [x if x is not None else (a if key == "labels" else np.ones(a.shape[0], np.float32))
                    for x, a in zip(parts[key], ids, strict=True)]  # fmt: skip
            values[key] = [np.concatenate(fill)]
    has_labels = np.array([x is not None for x in parts["labels"]]) if "labels" in values else None
    rows_array = np.array(row_of, dtype=np.int64)
    start = np.cumsum(lengths) - lengths
    return _Sequences(lengths, rows_array, np.array(part, dtype=np.int64) if any_prepacked else None,
                      np.zeros(lengths.shape[0], dtype=np.int64), start, values, has_labels)  # fmt: skip


def _check_positions(positions: torch.Tensor | None, where: str) -> None:
    if positions is None:
        return
    expected = torch.arange(positions.shape[0], device=positions.device)
    if not torch.equal(positions, expected):
        bad = int(torch.nonzero(positions != expected)[0])
        raise SampleError(
            f"{where}: 'position_ids' is {int(positions[bad])} at token {bad} where 0, 1, 2, ... are expected: "
            "pack_dataset packs rows of one sequence each (give a packed row's cu_seqlens to have it split into its "
            "sequences, or leave position_ids out)"
        )


def _read_dataset(dataset: Any) -> _Sequences:
    """A ``datasets.Dataset``'s sequences: index arrays over its Arrow buffers, batch by batch
    (the buffers are not copied unless a column's rows sit apart from ``input_ids``')."""
    import pyarrow as pa

    table = dataset.with_format("arrow")[:]
    if "input_ids" not in table.column_names:
        raise SampleError(f"the dataset has no 'input_ids' column (columns: {sorted(table.column_names)})")
    keys = [key for key in (*_READ_KEYS, "position_ids", *_OFFSET_KEYS) if key in table.column_names]
    values: dict[str, list[np.ndarray]] = {key: [] for key in keys if key in _READ_KEYS}
    pieces: list[tuple[np.ndarray, ...]] = []
    first = 0  # the first row of the batch
    for c, batch in enumerate(table.select(keys).to_batches()):
        lists = {}
        for key in keys:
            array = batch.column(key)
            if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
                raise SeqpackTypeError(f"the dataset's {key!r} column must hold a list per row, got {array.type}")
            if array.null_count:
                bad = first + int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
                raise SampleError(f"row {bad}: {key!r} is null (fill it, or leave the column out)")
            lists[key] = (array.offsets.to_numpy().astype(np.int64), array.values.to_numpy(zero_copy_only=False))
        offsets, ids = lists["input_ids"]
        row_lengths = np.diff(offsets)
        for key, (key_offsets, key_values) in lists.items():
            if key in _OFFSET_KEYS:
                continue
            lengths = np.diff(key_offsets)
            if (lengths != row_lengths).any():
                r = int(np.flatnonzero(lengths != row_lengths)[0])
                raise SampleError(
                    f"row {first + r}: {key!r} has {lengths[r]} tokens but 'input_ids' has {row_lengths[r]}"
                )
            if not np.array_equal(key_offsets, offsets):  # stored apart: copied into input_ids' layout
                aligned = np.zeros(ids.shape[0], dtype=key_values.dtype)
                aligned[_ranges(offsets[:-1], row_lengths)] = key_values[_ranges(key_offsets[:-1], row_lengths)]
                key_values = aligned
            used = key_values[offsets[0] : offsets[-1]]
            if key in ("input_ids", "labels", "position_ids") and not _integers(used):
                raise SeqpackTypeError(f"the dataset's {key!r} column must hold integers, got dtype {used.dtype}")
            if key in ("loss_mask", *MASK_KEYS):
                _check_weights(used, key, offsets - offsets[0], first)
            lists[key] = (offsets, key_values)
        lengths, rows, part, start = _split(lists, first)
        if "position_ids" in lists:
            positions = lists["position_ids"][1][_ranges(start, lengths)]
            expected = np.arange(positions.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            if (positions != expected).any():
                s = int(np.searchsorted(np.cumsum(lengths), np.flatnonzero(positions != expected)[0], side="right"))
                a = int(start[s])
                where = f"row {int(rows[s])}" + (f", sequence {int(part[s])}" if "cu_seqlens" in lists else "")
                _check_positions(
                    torch.from_numpy(lists["position_ids"][1][a : a + int(lengths[s])].astype(np.int64)), where
                )
        for key in values:
            values[key].append(lists[key][1])
        pieces.append((lengths, rows, part, np.full(lengths.shape[0], c), start))
        first += batch.num_rows
    if not pieces:  # no rows
        pieces.append(tuple(np.zeros(0, np.int64) for _ in range(5)))
        values = {key: [np.zeros(0, np.int64)] for key in values}
    lengths, rows, part, chunk, start = (np.concatenate([p[i] for p in pieces]) for i in range(5))
    has_labels = np.ones(lengths.shape[0], dtype=bool) if "labels" in values else None
    prepacked = "cu_seqlens" in keys
    return _Sequences(lengths, rows, part if prepacked else None, chunk, start, values, has_labels)


def _integers(values: np.ndarray) -> bool:
    """Integers in int64's range; no values at all (Arrow types a column of empty lists as null) pass."""
    if not values.size:
        return True
    return values.dtype.kind in "iu" and not (values.dtype == np.uint64 and values.max() > INT64_MAX)


def _split(lists: dict[str, tuple[np.ndarray, np.ndarray]], first: int) -> tuple[np.ndarray, ...]:
    """The sequences of one batch's rows: ``(lengths, rows, part, start)``, ``start`` into the
    batch's values; a row with ``cu_seqlens`` is split as :func:`seqpack.thd.split_packed_sample` splits it."""
    offsets, _ = lists["input_ids"]
    row_lengths = np.diff(offsets)
    if "cu_seqlens" not in lists:
        return row_lengths, first + np.arange(row_lengths.shape[0]), np.zeros_like(row_lengths), offsets[:-1]
    cu_offsets, cu = lists["cu_seqlens"]
    padded_offsets, padded = lists.get("cu_seqlens_padded", lists["cu_seqlens"])
    if not (_integers(cu) and _integers(padded)):
        raise SeqpackTypeError(f"the dataset's cu_seqlens must hold integers, got dtype {cu.dtype} / {padded.dtype}")
    entries = np.diff(cu_offsets)
    cu, padded = cu.astype(np.int64), padded.astype(np.int64)

    def refuse(r: int, why: str) -> SampleError:
        return SampleError(f"row {first + r} is pre-packed with a bad layout: {why}")

    if (np.diff(padded_offsets) != entries).any():
        r = int(np.flatnonzero(np.diff(padded_offsets) != entries)[0])
        raise refuse(r, f"cu_seqlens has {entries[r]} entries but cu_seqlens_padded has {np.diff(padded_offsets)[r]}")
    if (entries == 0).any():
        raise refuse(int(np.flatnonzero(entries == 0)[0]), "cu_seqlens must have at least one entry")
    heads = np.flatnonzero((cu[cu_offsets[:-1]] != 0) | (padded[padded_offsets[:-1]] != 0))
    if heads.size:
        raise refuse(int(heads[0]), "cu_seqlens and cu_seqlens_padded must start at 0")
    row_of_entry = np.repeat(np.arange(entries.shape[0]), entries)
    is_seq = np.ones(cu_offsets[-1] - cu_offsets[0], dtype=bool)
    is_seq[cu_offsets[1:] - cu_offsets[0] - 1] = False  # a row's last entry starts no sequence
    j = np.flatnonzero(is_seq)
    cu_j, pad_j = cu_offsets[0] + j, padded_offsets[0] + j
    lengths = cu[cu_j + 1] - cu[cu_j]
    slot_start, slot_end = padded[pad_j], padded[pad_j + 1]
    rows = row_of_entry[j]
    bad = np.flatnonzero(
        (lengths < 0) | (slot_start < 0) | (slot_start + lengths > slot_end) | (slot_end > row_lengths[rows])
    )
    if bad.size:
        s = int(bad[0])
        raise refuse(
            int(rows[s]),
            f"real length {lengths[s]} in slot [{slot_start[s]}, {slot_end[s]}) of {row_lengths[rows[s]]} tokens",
        )
    part = j - (cu_offsets[rows] - cu_offsets[0])
    return lengths, first + rows, part, offsets[rows] + slot_start


def _check_weights(values: np.ndarray, key: str, offsets: np.ndarray, first: int) -> None:
    if values.size and values.dtype.kind not in "biuf":
        raise SeqpackTypeError(f"the dataset's {key!r} column must hold numbers, got dtype {values.dtype}")
    if values.dtype.kind in "bu":
        return
    valid = np.isfinite(values) & (values >= 0) if values.dtype.kind == "f" else values >= 0
    if not valid.all():
        t = int(np.flatnonzero(~valid)[0])
        row = int(np.searchsorted(offsets, t, side="right")) - 1
        raise SampleError(
            f"row {first + row}: {key!r} must be >= 0 and finite, got {values[t]!r} at token {t - offsets[row]}"
        )


# --- packing ---------------------------------------------------------------------------------


def _fit(sequences: _Sequences, max_tokens: int, on_oversize: OnOversize) -> _Sequences:
    """Leave out empty sequences and apply ``on_oversize``, counting what changed in a warning."""
    lengths = sequences.lengths
    over = np.flatnonzero(lengths > max_tokens)
    if over.size and on_oversize is OnOversize.ERROR:
        s = int(over[0])
        raise SampleError(
            f"{sequences.where(s)} has {int(lengths[s])} tokens > max_tokens={max_tokens} ({over.size} sequences are "
            "longer): pass on_oversize='truncate' to keep their first max_tokens tokens or 'drop' to leave them out, "
            "or raise max_tokens"
        )
    empty = lengths == 0
    if not over.size and not empty.any():
        return sequences
    keep = ~empty
    if on_oversize is OnOversize.DROP:
        keep[over] = False
    parts = [f"{int(empty.sum())} empty sequences left out"] if empty.any() else []
    lost = int(lengths[over].sum())
    if over.size and on_oversize is OnOversize.TRUNCATE:
        parts.append(f"{over.size} sequences truncated to max_tokens={max_tokens} "
                     f"({lost - max_tokens * over.size} tokens not trained)")  # fmt: skip
    elif over.size:
        parts.append(f"{over.size} sequences left out, longer than max_tokens={max_tokens} ({lost} tokens not trained)")
    logger.warning("pack_dataset: %s", "; ".join(parts))
    return sequences.select(np.flatnonzero(keep), np.minimum(lengths, max_tokens))


def _targets(
    sequences: _Sequences, seqs: np.ndarray, ids: np.ndarray, cu: np.ndarray, label_format: LabelFormat
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The labels and loss mask of the sequences ``seqs`` (tokens ``ids``, offsets ``cu``) in
    seqpack's form (next-token targets), and per sequence the alignment counts
    ``[2, k]`` (checked, misaligned) of those that brought labels."""
    ids_t = torch.from_numpy(ids)
    last = torch.from_numpy(cu[1:] - 1)
    loss_mask = torch.from_numpy(sequences.gather("loss_mask", seqs)) if "loss_mask" in sequences.values else None
    counts = None
    if "labels" in sequences.values:
        assert sequences.has_labels is not None
        labels = torch.from_numpy(sequences.gather("labels", seqs).astype(np.int64, copy=False))
        has_labels = sequences.has_labels[seqs]
        if label_format is not LabelFormat.POSITION_ALIGNED:
            counts = np.stack(label_alignment_counts(ids_t, labels, loss_mask, cu, label_format))
            counts[:, ~has_labels] = 0
        if label_format is LabelFormat.SHIFTED and sequences.part is not None:
            # In a pre-packed row the last token's next-token label is the next sequence's first token.
            labels[last[sequences.part[seqs] >= 0]] = IGNORE_INDEX
        if not has_labels.all():
            per_token = torch.from_numpy(np.repeat(has_labels, np.diff(cu)))
            labels = torch.where(per_token, labels, default_labels(ids_t, last, label_format))
    else:
        labels = default_labels(ids_t, last, label_format)
    targets, weights = next_token_targets(labels, loss_mask, last, label_format)
    target, weight = targets.numpy(), weights.numpy()
    masks = [sequences.gather(key, seqs).astype(np.float32) for key in MASK_KEYS if key in sequences.values]
    if masks:
        mask = masks[0] if len(masks) == 1 else masks[0] * masks[1]
        if label_format is not LabelFormat.POSITION_ALIGNED:  # the target at t is token t + 1's
            # A sequence's last token has no next token in it: its target stays as it is.
            mask = np.append(mask[1:], np.float32(1.0))
            mask[cu[1:] - 1] = 1.0
        weight = weight * mask
        target = np.where(mask > 0, target, IGNORE_INDEX)
    return target, weight.astype(np.float32, copy=False), counts


def _packed_chunks(
    sequences: _Sequences, max_tokens: int, label_format: LabelFormat, chunk_tokens: int | None
) -> Iterator[_Chunk]:
    """The packed rows, ``chunk_tokens`` tokens at a time (``None``: all at once): each chunk's
    fields as flat arrays, the token offsets of its packed rows and their numbers of sequences
    ``k`` (``cu_seqlens`` holds ``k + 1`` entries per packed row, ``sample_ids`` and
    ``seq_lengths`` ``k``). Refuses misaligned labels once every chunk is built."""
    packing = pack_lengths(sequences.lengths, max_tokens)
    ends = np.cumsum(packing.tokens)
    counts = np.zeros((2, sequences.lengths.shape[0]), dtype=np.int64)
    p = 0
    while p < packing.num_packs:
        done = int(ends[p - 1]) if p else 0
        q = packing.num_packs
        if chunk_tokens is not None:
            q = max(p + 1, int(np.searchsorted(ends, done + chunk_tokens, side="right")))
        seqs = packing.order[packing.cu_packs[p] : packing.cu_packs[q]]
        lengths = sequences.lengths[seqs]
        cu = np.zeros(seqs.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu[1:])
        ids = sequences.gather("input_ids", seqs)
        labels, loss_mask, chunk_counts = _targets(sequences, seqs, ids.astype(np.int64, copy=False), cu, label_format)
        if chunk_counts is not None:
            counts[:, seqs] = chunk_counts
        starts = cu[:-1]
        if label_format is LabelFormat.UNSHIFTED:
            # Back to Hugging Face's alignment: token t's label is the target of t - 1; a
            # sequence's first token has none (-100), so no sequence predicts the next one.
            labels = np.concatenate([[IGNORE_INDEX], labels[:-1]])
            loss_mask = np.concatenate([np.zeros(1, np.float32), loss_mask[:-1]])
            labels[starts] = IGNORE_INDEX
            loss_mask[starts] = 0.0
        token_offsets = cu[packing.cu_packs[p : q + 1] - packing.cu_packs[p]]  # [q - p + 1]
        # cu_seqlens of every packed row, back to back: a row of k sequences has k + 1 entries, its first 0.
        per_pack = np.diff(packing.cu_packs[p : q + 1])
        pack_of_seq = np.repeat(np.arange(q - p), per_pack)
        cu_seqlens = np.zeros(seqs.shape[0] + q - p, dtype=np.int32)
        cu_seqlens[np.arange(seqs.shape[0]) + pack_of_seq + 1] = cu[1:] - token_offsets[pack_of_seq]
        yield {
            "input_ids": ids, "labels": labels, "loss_mask": loss_mask,
            "position_ids": np.arange(cu[-1], dtype=np.int64) - np.repeat(starts, lengths),
            "cu_seqlens": cu_seqlens, "sample_ids": sequences.rows[seqs], "seq_lengths": lengths.astype(np.int32),
        }, token_offsets, per_pack  # fmt: skip
        p = q
    _refuse_misaligned(sequences, counts, label_format)
    logger.info(
        "pack_dataset: %d sequences of %d tokens into %d packed rows of at most %d (the token bound is %d)",
        sequences.lengths.shape[0], int(ends[-1]) if ends.size else 0, packing.num_packs, max_tokens,
        packing.token_bound,
    )  # fmt: skip


def _refuse_misaligned(sequences: _Sequences, counts: np.ndarray, label_format: LabelFormat) -> None:
    """Refuse the first sequence whose labels are aligned the other way than ``label_format``,
    then the rows together: answers too short to judge alone (fewer than
    :data:`~seqpack.options.LABEL_COPY_MIN_TOKENS` checked tokens each) are judged on their sums,
    as the wrapper judges a step's."""
    checked, misaligned = counts
    refused = np.flatnonzero(looks_misaligned(checked, misaligned))
    if refused.size:
        s = int(refused[0])
        raise SampleError(misaligned_labels_message(sequences.where(s), int(checked[s]), int(misaligned[s]),
                                                    label_format))  # fmt: skip
    total_checked, total_misaligned = int(checked.sum()), int(misaligned.sum())
    if looks_misaligned(np.array([total_checked]), np.array([total_misaligned]))[0]:
        first = sequences.where(int(np.flatnonzero(misaligned)[0]))
        where = f"the rows together (each too short to judge alone; the first misaligned is {first})"
        raise SampleError(misaligned_labels_message(where, total_checked, total_misaligned, label_format))


def _packed_rows(chunks: Iterator[_Chunk]) -> PackedRows:
    """The chunks in flat buffers (one per field) behind a :class:`PackedRows`."""
    parts: dict[str, list[np.ndarray]] = {key: [] for key in PACKED_KEYS}
    tokens, per_row = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    for fields, token_offsets, per_pack in chunks:
        for key in PACKED_KEYS:
            parts[key].append(fields[key])
        tokens.append(np.diff(token_offsets))
        per_row.append(per_pack)
    dtypes = dict(input_ids=np.int64, labels=np.int64, loss_mask=np.float32, position_ids=np.int64,
                  cu_seqlens=np.int32, sample_ids=np.int64, seq_lengths=np.int32)  # fmt: skip
    flat = {
        key: (parts[key][0] if len(parts[key]) == 1 else np.concatenate([np.zeros(0, dtype), *parts[key]])).astype(
            dtype, copy=False
        )
        for key, dtype in dtypes.items()
    }
    token_offsets, seq_offsets = np.cumsum(np.concatenate(tokens)), np.cumsum(np.concatenate(per_row))
    return PackedRows(flat, token_offsets, seq_offsets + np.arange(seq_offsets.shape[0]), seq_offsets)


def _write_dataset(chunks: Iterator[_Chunk], source: Any, fingerprint: str, dtypes: dict[str, Any]) -> Any:
    """The chunks as Arrow batches in a cache file, memory-mapped back as a ``datasets.Dataset``
    (the fields of ``dtypes`` stored in those types)."""
    import pyarrow as pa

    datasets = importlib.import_module("datasets")  # typed as Any: it ships no type hints
    if source.cache_files:
        directory = os.path.dirname(source.cache_files[0]["filename"])
    else:
        directory = importlib.import_module("datasets.fingerprint").get_temporary_cache_files_directory()
    path = os.path.join(directory, f"seqpack-packed-{fingerprint}.arrow")
    handle, partial = tempfile.mkstemp(dir=directory, prefix="seqpack-packed-", suffix=".partial")
    os.close(handle)
    writer = None
    try:
        with pa.OSFile(partial, "wb") as sink:
            for fields, token_offsets, per_pack in chunks:
                starts = token_offsets.astype(np.int32)
                seq_offsets = np.concatenate([[0], np.cumsum(per_pack)]).astype(np.int32)
                fields.update({key: fields[key].astype(dtype) for key, dtype in dtypes.items()})
                columns = {key: pa.ListArray.from_arrays(starts, fields[key]) for key in _TOKEN_FIELDS}
                cu_offsets = seq_offsets + np.arange(per_pack.shape[0] + 1, dtype=np.int32)
                columns["cu_seqlens"] = pa.ListArray.from_arrays(cu_offsets, fields["cu_seqlens"])
                for key in ("sample_ids", "seq_lengths"):
                    columns[key] = pa.ListArray.from_arrays(seq_offsets, fields[key])
                batch = pa.record_batch(columns)
                if writer is None:
                    writer = pa.ipc.new_stream(sink, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
        if writer is None:  # nothing packed
            empty = pa.table({key: pa.array([], pa.list_(pa.int64())) for key in PACKED_KEYS})
            return datasets.Dataset(
                importlib.import_module("datasets.table").InMemoryTable(empty), fingerprint=fingerprint
            )
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    table = importlib.import_module("datasets.table").MemoryMappedTable.from_file(path)
    return datasets.Dataset(table, fingerprint=fingerprint)
