"""Real text that ships with every Python install (the standard library's source files, cut
into byte-tokenized documents: a real length distribution), and map-style samples of any
token table or Parquet file."""

from __future__ import annotations

import os
import re
import sysconfig

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.mock_data import io
from seqpack.validation import check_int

__all__ = ["BYTE_VOCAB_SIZE", "stdlib_corpus", "split_documents", "TokenDataset"]

BYTE_VOCAB_SIZE = 256
_DEFINITION = re.compile(rb"^(?:    )?(?:def |class |async def |@)")
_DECORATOR = re.compile(rb"^(?:    )?@")


def _blocks(data: bytes) -> list[bytes]:
    """Split at module- or class-level definitions (a decorator stays with what it decorates)."""
    blocks: list[bytes] = []
    current: list[bytes] = []
    previous_decorator = False
    for line in data.splitlines(keepends=True):
        starts = bool(_DEFINITION.match(line))
        if starts and not previous_decorator and current:
            blocks.append(b"".join(current))
            current = []
        current.append(line)
        if line.strip():
            previous_decorator = bool(_DECORATOR.match(line))
    if current:
        blocks.append(b"".join(current))
    return blocks


def split_documents(data: bytes, max_len: int) -> list[bytes]:
    """Cut source text at module- and class-level definitions (a function, a method, a class
    header with its attributes); pieces longer than ``max_len`` are cut into ``max_len``-byte
    parts. Whitespace-only pieces are dropped."""
    max_len = check_int("max_len", max_len, minimum=1)
    docs: list[bytes] = []
    for block in _blocks(data):
        if not block.strip():
            continue
        for start in range(0, len(block), max_len):
            piece = block[start : start + max_len]
            if piece.strip():
                docs.append(piece)
    return docs


def stdlib_corpus(root: str | None = None, *, max_len: int = 4096, max_files: int | None = None) -> pa.Table:
    """Byte-tokenized documents from the standard library's ``.py`` files.

    Args:
        root: Directory to read (default: this interpreter's stdlib; ``site-packages`` and
            test data directories are skipped).
        max_len: Longest document in tokens (bytes); longer blocks are cut.
        max_files: Read at most this many files (sorted by path, for reproducibility).

    Returns:
        A table with columns ``path`` (string), ``input_ids`` (list<uint8>) and ``length``
        (int64), one row per document, in path order.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    fs = pafs.LocalFileSystem()
    info = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    skip = (os.sep + "site-packages" + os.sep, os.sep + "test" + os.sep, os.sep + "idle_test" + os.sep)
    paths = sorted(
        f.path
        for f in info
        if f.type == pafs.FileType.File and f.path.endswith(".py") and not any(s in f.path for s in skip)
    )
    if max_files is not None:
        paths = paths[:max_files]
    if not paths:
        raise ConfigError(f"no .py files under {root!r}")
    doc_paths: list[str] = []
    chunks: list[np.ndarray] = []
    for path in paths:
        with fs.open_input_stream(path) as stream:
            data = stream.read()
        for doc in split_documents(data, max_len):
            doc_paths.append(os.path.relpath(path, root))
            chunks.append(np.frombuffer(doc, dtype=np.uint8))
    lengths = np.fromiter((c.shape[0] for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.concatenate(chunks), type=pa.uint8())
    if offsets[-1] > io.LIST_MAX_VALUES:  # int32 list offsets would wrap: int64 ones
        input_ids = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    else:
        input_ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    return pa.table({"path": doc_paths, "input_ids": input_ids, "length": lengths})


class TokenDataset(torch.utils.data.Dataset):
    """Map-style samples ``{"input_ids": int64 tensor}`` from a table or Parquet file.

    The table needs an ``input_ids`` list column of integers, or a ``text`` string column
    (byte-tokenized). Empty rows are kept (the wrapper drops and counts them).

    Raises:
        FileNotFoundError, IsADirectoryError: ``source`` is not a file.
        SampleError: A file that is not Parquet, a table without the columns, negative or
            too large token ids (the message names the file).
        SeqpackTypeError: Columns of the wrong type.
    """

    def __init__(self, source: pa.Table | str | os.PathLike):
        if isinstance(source, pa.Table):
            table, where = source, "table"
        else:
            where = os.fspath(source)
            if os.path.isdir(where):
                raise IsADirectoryError(f"{where}: is a directory, not a Parquet file")
            if not os.path.isfile(where):
                raise FileNotFoundError(f"{where}: no such file")
            try:
                table = pq.read_table(where)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
                raise SampleError(f"{where}: cannot read as Parquet: {io._first_line(err)}") from None
        if "input_ids" in table.column_names:
            column = table.column("input_ids").combine_chunks()
            if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
                raise SeqpackTypeError(f"{where}: input_ids must be a list column, got {column.type}")
            if not pa.types.is_integer(column.type.value_type):
                raise SeqpackTypeError(f"{where}: input_ids must hold integers, got {column.type.value_type}")
            values = np.asarray(column.values.to_numpy(zero_copy_only=False))
            if values.dtype == np.uint64 and values.size and int(values.max()) > np.iinfo(np.int64).max:
                raise SampleError(f"{where}: token id {int(values.max())} is larger than int64 holds")
            self._offsets = np.asarray(column.offsets, dtype=np.int64)
            self._values = values.astype(np.int64)
        elif "text" in table.column_names:
            column = table.column("text")
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise SeqpackTypeError(f"{where}: text must be a string column, got {column.type}")
            texts = column.to_pylist()
            encoded = [np.frombuffer((t or "").encode("utf-8"), dtype=np.uint8) for t in texts]
            self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
            np.cumsum([e.shape[0] for e in encoded], out=self._offsets[1:])
            self._values = np.concatenate(encoded).astype(np.int64) if encoded else np.zeros(0, np.int64)
        else:
            raise SampleError(f"{where}: table needs an 'input_ids' or 'text' column, has {table.column_names}")
        if self._values.size and self._values.min() < 0:
            raise SampleError(f"{where}: input_ids must be non-negative token ids, got {int(self._values.min())}")

    def __len__(self) -> int:
        return int(self._offsets.shape[0] - 1)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} documents")
        index %= len(self)
        start, end = self._offsets[index], self._offsets[index + 1]
        return {"input_ids": torch.from_numpy(self._values[start:end].copy())}

    def lengths(self) -> np.ndarray:
        """Length of every document (int64)."""
        return np.diff(self._offsets)

    @property
    def vocab_size(self) -> int:
        return int(self._values.max()) + 1 if self._values.size else 1
