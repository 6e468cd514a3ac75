"""Length gathering: every DP rank's sequence lengths, in global order, on every DP rank.

A fixed-size int64 header per rank goes first, so that a rank with bad input makes *every*
rank raise instead of leaving one waiting in a collective; then the lengths, each with the
caller's per-sample int64 columns, in one all-gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed import ProcessGroup

from seqpack.collective.agree import Status
from seqpack.collective.fields import Header
from seqpack.collective.groups import (
    all_gather,
    all_gather_objects,
    all_gather_rows,
    global_rank,
    group_size,
    this_rank,
)
from seqpack.collective.wire import FORMAT_VERSION
from seqpack.errors import SeqpackTypeError, StepFailed, WireError
from seqpack.validation import int64_array

__all__ = ["GATHER_HEADER", "GatheredLengths", "gather_lengths"]

GATHER_HEADER = Header(
    "length gather header (int64, per DP rank, then the caller's extras)",
    (
        ("version", "format version (the wire format's)"),
        ("status", "0 ok, 2 this rank has bad input (every rank then raises its message)"),
        ("count", "lengths this rank sends"),
        ("extra_words", "caller words after this header (the step's gather fields)"),
        ("column_words", "caller int64 columns per sample, gathered with the lengths (the sample columns)"),
    ),
)


@dataclasses.dataclass(frozen=True)
class GatheredLengths:
    """Lengths of every DP rank, in global order (DP rank 0's samples first).

    Attributes:
        lengths: int64 ``[N]``.
        counts: int64 ``[dp]`` samples per DP rank.
        extras: int64 ``[dp, k]`` the caller's header fields of every rank.
        columns: int64 ``[N, c]`` the caller's per-sample columns, rows in global order
            (``None`` given: ``[N, 0]``).
    """

    lengths: np.ndarray
    counts: np.ndarray
    extras: np.ndarray
    columns: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.columns is None:
            object.__setattr__(self, "columns", np.zeros((self.lengths.shape[0], 0), dtype=np.int64))

    @property
    def offsets(self) -> np.ndarray:
        """int64 ``[dp+1]``: global ids of DP rank ``r`` are ``offsets[r]:offsets[r+1]``."""
        out = np.zeros(self.counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.counts, out=out[1:])
        return out

    def origin(self) -> np.ndarray:
        """DP rank holding each global id (int64 ``[N]``)."""
        return np.repeat(np.arange(self.counts.shape[0], dtype=np.int64), self.counts)


def _int64_vector(name: str, value: Any) -> np.ndarray:
    """``value`` as a flat int64 array: integers only, none past int64 (never wrapped)."""
    return np.ascontiguousarray(int64_array(name, value).reshape(-1))


def _int64_columns(columns: Any, count: int) -> np.ndarray:
    """``columns`` as a C-contiguous int64 ``[count, c]`` table (``None``: ``c = 0``)."""
    if columns is None:
        return np.zeros((count, 0), dtype=np.int64)
    try:
        array = np.asarray(columns)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.ndim != 2 or array.shape[0] != count:
        raise SeqpackTypeError(
            f"columns must be a [{count}, c] table (one row per length), got shape {tuple(array.shape)}"
        )
    return _int64_vector("columns", array).reshape(count, array.shape[1])


def gather_lengths(
    lengths: Sequence[int] | np.ndarray,
    group: ProcessGroup | None = None,
    *,
    error: str | None = None,
    extras: Sequence[int] | np.ndarray = (),
    columns: np.ndarray | None = None,
) -> GatheredLengths:
    """All-gather every DP rank's lengths over ``group``; all ranks must call it.

    Args:
        lengths: This rank's sample lengths.
        group: The DP group (``None``: a single rank).
        error: This rank's bad-input message (found before calling), or ``None``.
        extras: Caller fields (ints) every rank passes the same number of, returned per
            rank in ``GatheredLengths.extras``.
        columns: int64 ``[len(lengths), c]``, ``c`` the same on every rank, returned in
            global order in ``GatheredLengths.columns``.

    Raises:
        StepFailed: On every rank when any rank passed ``error`` (the lowest failing DP
            rank's message; ``rank`` is its global rank).
        WireError: Ranks disagree on the format version, the number of extras or of columns.
    """
    local = _int64_vector("lengths", lengths)
    extra = _int64_vector("extras", extras)
    table = _int64_columns(columns, local.shape[0])
    status = Status.OK if error is None else Status.ERROR
    fields = GATHER_HEADER.pack(
        version=FORMAT_VERSION,
        status=status,
        count=local.shape[0],
        extra_words=extra.shape[0],
        column_words=table.shape[1],
    )
    header = np.concatenate([fields, extra])
    if group_size(group) == 1:
        if error is not None:
            raise StepFailed(error, rank=this_rank())
        return GatheredLengths(local.copy(), np.array([local.shape[0]], np.int64), extra[None, :].copy(), table.copy())
    headers = all_gather(torch.from_numpy(header), group).numpy()
    versions, extra_words = GATHER_HEADER.column(headers, "version"), GATHER_HEADER.column(headers, "extra_words")
    column_words = GATHER_HEADER.column(headers, "column_words")
    if (
        np.any(versions != FORMAT_VERSION)
        or np.any(extra_words != extra.shape[0])
        or np.any(column_words != table.shape[1])
    ):
        raise WireError(
            f"DP ranks run different seqpack versions or wrappers: header versions {versions.tolist()}, "
            f"extra field counts {extra_words.tolist()}, per-sample column counts {column_words.tolist()}"
        )
    failed = np.flatnonzero(GATHER_HEADER.column(headers, "status") == Status.ERROR)
    if failed.size:
        messages = all_gather_objects(error, group)
        first = int(failed[0])
        raise StepFailed(
            messages[first] or "a rank reported an error without a message", rank=global_rank(group, first)
        )
    counts = GATHER_HEADER.column(headers, "count").copy()
    rows = torch.from_numpy(np.concatenate([local[:, None], table], axis=1))  # [n, 1 + c]
    gathered = all_gather_rows(rows, counts.tolist(), group).numpy()
    return GatheredLengths(
        gathered[:, 0].copy(), counts, headers[:, GATHER_HEADER.words :].copy(), gathered[:, 1:].copy()
    )
