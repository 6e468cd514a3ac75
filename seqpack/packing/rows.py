"""The rows of a dataset read into sequences for :func:`seqpack.packing.pack_dataset`: rows
of any mapping (a pre-packed row split into its sequences, as the wrapper splits such a
sample) or a ``datasets.Dataset``'s Arrow columns, read in place, into one index of where
each sequence's tokens are (:class:`Sequences`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX
from seqpack.thd.padding import ranges
from seqpack.thd.prepacked import split_packed_sample
from seqpack.thd.sample import normalize_sample

__all__ = ["MASK_KEYS", "READ_KEYS", "Sequences", "read_dataset", "read_rows"]

MASK_KEYS = ("completion_mask", "assistant_masks")
"""TRL's token masks: 1 on the tokens to learn, aligned with ``input_ids``."""
READ_KEYS = ("input_ids", "labels", "loss_mask", *MASK_KEYS)
"""The per-token fields packing reads."""
_OFFSET_KEYS = ("cu_seqlens", "cu_seqlens_padded")


@dataclasses.dataclass
class Sequences:
    """Where every sequence's tokens are: sequence ``s`` of field ``key`` is
    ``values[key][chunk[s]][start[s] : start[s] + lengths[s]]``."""

    lengths: np.ndarray  # int64 [S]
    rows: np.ndarray  # int64 [S]: the input row of each
    part: np.ndarray | None  # int64 [S]: its index in a pre-packed row, -1 in other rows (None: no row is one)
    chunk: np.ndarray  # int64 [S]
    start: np.ndarray  # int64 [S]
    values: dict[str, list[np.ndarray]]  # per field of READ_KEYS present: its values, chunk by chunk
    has_labels: np.ndarray | None = None  # bool [S] where "labels" is present: the row brought labels

    def where(self, s: int) -> str:
        row = f"row {int(self.rows[s])}"
        return row if self.part is None or self.part[s] < 0 else f"{row}, sequence {int(self.part[s])}"

    def select(self, keep: np.ndarray, lengths: np.ndarray) -> Sequences:
        """The sequences ``keep`` (indices), each cut to ``lengths`` tokens (its first ones)."""
        pick = None if self.part is None else self.part[keep]
        has_labels = None if self.has_labels is None else self.has_labels[keep]
        return Sequences(lengths[keep], self.rows[keep], pick, self.chunk[keep], self.start[keep], self.values,
                          has_labels)  # fmt: skip

    def gather(self, key: str, seqs: np.ndarray) -> np.ndarray:
        """The tokens of ``seqs`` (indices) in field ``key``, back to back."""
        chunks, lengths, start = self.values[key], self.lengths[seqs], self.start[seqs]
        if len(chunks) == 1:
            return chunks[0][ranges(start, lengths)]
        chunk = self.chunk[seqs]
        out = np.empty(int(lengths.sum()), dtype=chunks[0].dtype)
        at = np.cumsum(lengths) - lengths
        for c in np.unique(chunk).tolist():
            mine = chunk == c
            out[ranges(at[mine], lengths[mine])] = chunks[c][ranges(start[mine], lengths[mine])]
        return out


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


def read_rows(rows: Iterable[Any], progress: bool) -> Sequences:
    """Every row normalised (the sample contract), split into its sequences, concatenated."""
    if progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="seqpack: reading rows", unit="row")
    parts: dict[str, list[np.ndarray | None]] = {key: [] for key in READ_KEYS}
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
            for key in READ_KEYS:
                parts[key].append(sequence[key].cpu().numpy() if key in sequence else None)
            row_of.append(i)
            part.append(k if prepacked else -1)
    ids = [a for a in parts["input_ids"] if a is not None]
    lengths = np.array([a.shape[0] for a in ids], dtype=np.int64)
    values = {"input_ids": [np.concatenate([np.zeros(0, np.int64), *ids])]}
    for key in READ_KEYS[1:]:
        if any(x is not None for x in parts[key]):  # rows without: their ids as labels (not used), weights 1
            fill = [x if x is not None else (a if key == "labels" else np.ones(a.shape[0], np.float32))
                    for x, a in zip(parts[key], ids, strict=True)]  # fmt: skip
            values[key] = [np.concatenate(fill)]
    has_labels = np.array([x is not None for x in parts["labels"]]) if "labels" in values else None
    rows_array = np.array(row_of, dtype=np.int64)
    start = np.cumsum(lengths) - lengths
    return Sequences(lengths, rows_array, np.array(part, dtype=np.int64) if any_prepacked else None,
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


def read_dataset(dataset: Any) -> Sequences:
    """A ``datasets.Dataset``'s sequences: index arrays over its Arrow buffers, batch by batch
    (the buffers are not copied unless a column's rows sit apart from ``input_ids``')."""
    import pyarrow as pa

    table = dataset.with_format("arrow")[:]
    if "input_ids" not in table.column_names:
        raise SampleError(f"the dataset has no 'input_ids' column (columns: {sorted(table.column_names)})")
    keys = [key for key in (*READ_KEYS, "position_ids", *_OFFSET_KEYS) if key in table.column_names]
    values: dict[str, list[np.ndarray]] = {key: [] for key in keys if key in READ_KEYS}
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
                aligned[ranges(offsets[:-1], row_lengths)] = key_values[ranges(key_offsets[:-1], row_lengths)]
                key_values = aligned
            used = key_values[offsets[0] : offsets[-1]]
            if key in ("input_ids", "labels", "position_ids") and not _integers(used):
                raise SeqpackTypeError(f"the dataset's {key!r} column must hold integers, got dtype {used.dtype}")
            if key in ("loss_mask", *MASK_KEYS):
                _check_weights(used, key, offsets - offsets[0], first)
            lists[key] = (offsets, key_values)
        lengths, rows, part, start = _split(lists, first)
        if "position_ids" in lists:
            positions = lists["position_ids"][1][ranges(start, lengths)]
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
    return Sequences(lengths, rows, part if prepacked else None, chunk, start, values, has_labels)


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
