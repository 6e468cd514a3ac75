"""Offline packing of a whole dataset (:func:`pack_dataset`): the rows' sequences to packed
rows of at most ``max_tokens`` tokens, packed once by :func:`~seqpack.packing.pack_lengths`
(the packed row's fields and label conventions: docs/packing.md).

A row packed already (``cu_seqlens``) is split into its sequences as the wrapper splits such
a sample. Labels go through seqpack's own form on the way, so packed rows follow the sample
contract and the wrapper's alignment guard. The sequences are read once into index arrays;
the packed rows are then built :data:`CHUNK_TOKENS` tokens at a time, so a
``datasets.Dataset`` is packed from its Arrow buffers into Arrow batches without a Python
loop over rows.
"""

from __future__ import annotations

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
from seqpack.options import INT32_MAX, LabelFormat, OnOversize
from seqpack.packing.packer import pack_lengths
from seqpack.packing.rows import MASK_KEYS, Sequences, read_dataset, read_rows
from seqpack.thd.sample import (
    IGNORE_INDEX,
    default_labels,
    label_alignment_counts,
    looks_misaligned,
    misaligned_labels_message,
    next_token_targets,
)
from seqpack.validation import check_bool, check_choice, check_positive_int

__all__ = ["CHUNK_TOKENS", "MASK_KEYS", "PACKED_KEYS", "PackedRows", "pack_dataset"]

logger = logging.getLogger(__name__)

PACKED_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "sample_ids", "seq_lengths")
"""The fields of a packed row."""
_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids")
_Chunk = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]  # fields, token offsets, sequences per packed row
CHUNK_TOKENS = 1 << 18
"""Tokens of packed rows built at a time (at least one packed row)."""
PROGRESS_ROWS = 100_000
"""Rows from which ``progress=None`` shows a progress bar while reading (when the length is known)."""


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
    """Pack a dataset's sequences into as few rows of at most ``max_tokens`` tokens as
    :func:`~seqpack.packing.pack_lengths` finds; deterministic, longest sequences first.

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
        ``rows`` is a ``datasets.Dataset``, a memory-mapped ``datasets.Dataset`` with those
        columns, written to an Arrow file beside the input's cache files.

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
        sequences = _fit(read_dataset(rows), max_tokens, on_oversize)
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
    sequences = _fit(read_rows(rows, progress), max_tokens, on_oversize)
    return _packed_rows(_packed_chunks(sequences, max_tokens, label_format, None))  # in memory anyway: one pass


def _fit(sequences: Sequences, max_tokens: int, on_oversize: OnOversize) -> Sequences:
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
    sequences: Sequences, seqs: np.ndarray, ids: np.ndarray, cu: np.ndarray, label_format: LabelFormat
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
    sequences: Sequences, max_tokens: int, label_format: LabelFormat, chunk_tokens: int | None
) -> Iterator[_Chunk]:
    """The packed rows, ``chunk_tokens`` tokens at a time (``None``: all at once): each chunk's
    fields as flat arrays, the token offsets of its packed rows and their numbers of
    sequences. Refuses misaligned labels once every chunk is built."""
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


def _refuse_misaligned(sequences: Sequences, counts: np.ndarray, label_format: LabelFormat) -> None:
    """Refuse the first sequence whose labels are aligned the other way than ``label_format``,
    then the rows together (sequences too short to judge alone are judged on their sums)."""
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
    tables = importlib.import_module("datasets.table")
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
            return datasets.Dataset(tables.InMemoryTable(empty), fingerprint=fingerprint)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return datasets.Dataset(tables.MemoryMappedTable.from_file(path), fingerprint=fingerprint)
