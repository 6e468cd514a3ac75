"""Read and write sequence lengths: CSV (with or without a header), Parquet, Arrow IPC /
Feather and JSON lines, through pyarrow."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["LENGTH_COLUMNS", "lengths_from_file", "write_lengths"]

LENGTH_COLUMNS = ("length", "lengths", "seq_len", "seqlen", "seq_length", "num_tokens", "tokens", "len")
"""Column names picked automatically when a file has several columns."""

_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS:
        raise ValueError(f"{path}: unknown file type {ext!r}; use one of {', '.join(sorted(_FORMATS))}")
    return _FORMATS[ext]


def _is_int(text: str) -> bool:
    text = text.strip().strip('"').strip("'")
    if text.startswith(("+", "-")):
        text = text[1:]
    return text.isdigit()


def _is_number(text: str) -> bool:
    """A cell that reads as a finite number (``100``, ``12.0``, ``"7"``): data, not a header."""
    text = text.strip().lstrip("\ufeff").strip().strip('"').strip("'")
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _nonempty_lines(path: str, limit: int | None = None) -> list[tuple[int, str]]:
    """(1-based line number, text) of non-empty lines (as pyarrow counts them), up to
    ``limit`` of them."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            text = line.rstrip("\r\n")
            if text:
                out.append((number, text))
                if limit is not None and len(out) >= limit:
                    break
    return out


def _read_csv(path: str, column: str | int | None) -> tuple[pa.Table, bool]:
    import pyarrow.csv as pacsv

    first = _nonempty_lines(path, limit=1)
    if not first:
        return pa.table({"0": pa.array([], pa.int64())}), False
    delimiter = "\t" if path.lower().endswith(".tsv") or "\t" in first[0][1] else ","
    cells = [c.strip().lstrip("\ufeff").strip().strip('"').strip("'") for c in first[0][1].split(delimiter)]
    # A first row whose length cell reads as a number is data: never drop it as a header
    # (integral floats such as "12.0" and an Excel byte-order mark included).
    if isinstance(column, (int, np.integer)) and not isinstance(column, bool) and 0 <= column < len(cells):
        header = not _is_number(cells[int(column)])
    elif isinstance(column, str) and column in cells:
        header = True
    else:
        header = not any(_is_number(c) for c in cells)
    read = pacsv.ReadOptions(autogenerate_column_names=not header)
    parse = pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=True)
    convert = pacsv.ConvertOptions(strings_can_be_null=True)
    try:
        table = pacsv.read_csv(path, read_options=read, parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid as err:
        raise ValueError(f"{path}: cannot parse as CSV: {err}") from None
    return table, header


def _read_table(path: str, kind: str, column: str | int | None) -> tuple[pa.Table, bool]:
    if kind == "csv":
        return _read_csv(path, column)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path), True
        if kind == "arrow":
            import pyarrow.ipc as ipc

            try:
                with ipc.open_file(path) as reader:
                    return reader.read_all(), True
            except pa.ArrowInvalid:
                with pa.OSFile(path) as source, ipc.open_stream(source) as reader:
                    return reader.read_all(), True
        import pyarrow.json as pajson

        return pajson.read_json(path), True
    except pa.ArrowInvalid as err:
        raise ValueError(f"{path}: cannot read as {kind}: {err}") from None


def _pick_column(path: str, table: pa.Table, column: str | int | None, header: bool) -> str:
    names = table.column_names
    if column is None:
        if len(names) == 1:
            return names[0]
        for name in LENGTH_COLUMNS:
            if name in names:
                return name
        lowered = {n.lower(): n for n in names}
        for name in LENGTH_COLUMNS:
            if name in lowered:
                return lowered[name]
        raise ValueError(f"{path}: {len(names)} columns {names}; pass column= to pick the lengths")
    if isinstance(column, (int, np.integer)) and not isinstance(column, bool):
        if not 0 <= column < len(names):
            raise ValueError(f"{path}: column index {column} out of range; the file has {len(names)} columns {names}")
        return names[int(column)]
    if column in names:
        return column
    if not header and str(column).isdigit() and int(column) < len(names):
        return names[int(column)]
    raise ValueError(f"{path}: no column {column!r}; columns are {names}")


def _where(path: str, kind: str, row: int, header: bool) -> str:
    """Human position of data row ``row`` (0-based): the file line for CSV."""
    if kind == "csv":
        lines = _nonempty_lines(path, limit=row + 1 + int(header))
        if len(lines) > row + int(header):
            return f"line {lines[row + int(header)][0]}"
    return f"row {row + 1}"


def lengths_from_file(path: str | os.PathLike, column: str | int | None = None) -> np.ndarray:
    """Sequence lengths stored in a file, as int64.

    CSV/TSV (``.csv``, ``.tsv``, ``.txt``): with or without a header. A first row whose
    length cell is an integer is data; blank lines are skipped. Parquet (``.parquet``),
    Arrow IPC / Feather (``.arrow``, ``.feather``, ``.ipc``) and JSON lines (``.jsonl``,
    ``.ndjson``, ``.json``) are read with pyarrow.

    Args:
        path: The file.
        column: Name or 0-based index of the length column. Default: the only column, or
            the first of :data:`LENGTH_COLUMNS` present.

    Returns:
        int64 ``[N]`` lengths (zeros allowed: empty samples).

    Raises:
        FileNotFoundError: No such file.
        ValueError: Unknown file type or column, or a missing, non-integer or negative
            value (the message names the file, the row or line, and the value).
    """
    path = os.fspath(path)
    kind = _format(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    table, header = _read_table(path, kind, column)
    name = _pick_column(path, table, column, header)
    col = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.int64())
    what = f"{path}: column {name!r}"
    if col.null_count:
        row = int(np.flatnonzero(np.asarray(col.is_null()))[0])
        raise ValueError(f"{what}: missing value at {_where(path, kind, row, header)}")
    if pa.types.is_integer(col.type):
        values = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
    elif pa.types.is_floating(col.type):
        raw = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"{what}: non-integer length {float(raw[row])!r} at {_where(path, kind, row, header)}")
        values = raw.astype(np.int64)
    else:
        texts = col.to_pylist()
        values = np.empty(len(texts), dtype=np.int64)
        for row, text in enumerate(texts):
            if isinstance(text, bool) or not (isinstance(text, int) or (isinstance(text, str) and _is_int(text))):
                raise ValueError(f"{what}: non-integer length {text!r} at {_where(path, kind, row, header)}")
            values[row] = int(text.strip().strip('"').strip("'")) if isinstance(text, str) else text
    if values.size and values.min() < 0:
        row = int(np.argmin(values))
        raise ValueError(f"{what}: negative length {int(values[row])} at {_where(path, kind, row, header)}")
    return values


def write_lengths(path: str | os.PathLike, lengths: Sequence[int] | np.ndarray, column: str = "length") -> None:
    """Write lengths to CSV (with a header), Parquet, Arrow IPC or JSON lines, by extension.

    :func:`lengths_from_file` reads every format back.
    """
    path = os.fspath(path)
    kind = _format(path)
    arr = np.asarray(lengths, dtype=np.int64)
    if kind == "csv":
        sep = "\t" if path.lower().endswith(".tsv") else ","
        with open(path, "w", encoding="utf-8") as f:
            f.write(column + "\n")
            np.savetxt(f, arr, fmt="%d", delimiter=sep)
        return
    if kind == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f'{{"{column}": {int(v)}}}\n' for v in arr)
        return
    table = pa.table({column: pa.array(arr, pa.int64())})
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, path)
