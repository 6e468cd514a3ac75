"""Read and write sequence lengths: CSV (with or without a header), Parquet, Arrow IPC /
Feather and JSON lines, through pyarrow."""

from __future__ import annotations

import codecs
import csv
import math
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX
from seqpack.validation import check_path, int64_array

__all__ = ["LENGTH_COLUMNS", "LIST_MAX_VALUES", "file_format", "lengths_from_file", "write_lengths"]

LIST_MAX_VALUES = 2**31 - 1
"""The most values an Arrow ``list`` column (int32 offsets) addresses in one array; past it,
seqpack writes a ``large_list`` (int64 offsets)."""

LENGTH_COLUMNS = ("length", "lengths", "seq_len", "seqlen", "seq_length", "num_tokens", "tokens", "len")
"""Column names picked automatically when a file has several columns."""

_FORMATS = {
    **dict.fromkeys((".csv", ".tsv", ".txt"), "csv"),
    **dict.fromkeys((".parquet", ".pq"), "parquet"),
    **dict.fromkeys((".arrow", ".feather", ".ipc"), "arrow"),
    **dict.fromkeys((".jsonl", ".ndjson", ".json"), "jsonl"),
}


# Byte-order marks of the encodings a CSV may arrive in besides UTF-8 (Excel's "Unicode
# text" export is UTF-16 with a BOM); pyarrow transcodes them.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip


def file_format(path: str | os.PathLike) -> str:
    """``"csv"``, ``"parquet"``, ``"arrow"`` or ``"jsonl"``: the format of a lengths file, by
    its extension.

    Raises:
        ConfigError: An extension seqpack does not read or write.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS:
        raise ConfigError(f"{path}: unknown file type {ext!r}; use one of {', '.join(sorted(_FORMATS))}")
    return _FORMATS[ext]


def _encoding(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    return next((name for bom, name in _BOMS if head.startswith(bom)), "utf-8")


def _is_int(text: str) -> bool:
    text = text.strip().strip('"').strip("'")
    if text.startswith(("+", "-")):
        text = text[1:]
    return text.isdigit()


def _is_number(text: str) -> bool:
    """A cell that reads as a finite number (``100``, ``12.0``, ``'7'``): data, not a header."""
    try:
        return math.isfinite(float(text.strip().strip("'")))
    except ValueError:
        return False


def _nonempty_lines(path: str, limit: int | None = None, encoding: str = "utf-8") -> list[tuple[int, str]]:
    """(1-based line number, text) of non-empty lines (as pyarrow counts them), up to
    ``limit`` of them."""
    out = []
    with open(path, encoding=encoding, errors="replace") as f:
        for number, line in enumerate(f, start=1):
            text = line.rstrip("\r\n")
            if text:
                out.append((number, text))
                if limit is not None and len(out) >= limit:
                    break
    return out


_SNIFF_LINES = 20  # lines of the file's head csv.Sniffer looks at
_DELIMITERS = ",\t;|"


def _sniff(path: str, encoding: str) -> tuple[str, list[str]]:
    """(delimiter, cells of the first non-empty row): the dialect as :class:`csv.Sniffer`
    finds it in the file's head, the row as the csv module parses it (quotes removed).

    A file of one column has no delimiter to find: ``","`` (``"\t"`` for ``.tsv``)."""
    head = [text for _, text in _nonempty_lines(path, limit=_SNIFF_LINES, encoding=encoding)]
    default = "\t" if path.lower().endswith(".tsv") else ","
    if not head:
        return default, []
    head[0] = head[0].lstrip("\ufeff")  # a UTF-8 byte-order mark (pyarrow skips it too)
    try:
        delimiter = csv.Sniffer().sniff("\n".join(head), delimiters=_DELIMITERS).delimiter
    except csv.Error:
        delimiter = default
    cells = next(csv.reader([head[0]], delimiter=delimiter, skipinitialspace=True), [])
    return delimiter, [cell.strip() for cell in cells]


def _read_csv(path: str, column: str | int | None, as_text: str | None = None) -> tuple[pa.Table, bool]:
    """(table, whether the first row is a header); ``as_text`` names a column to keep as
    the text written in the file. csv.Sniffer finds the delimiter, pyarrow parses."""
    import pyarrow.csv as pacsv

    encoding = _encoding(path)
    delimiter, cells = _sniff(path, encoding)
    if not cells:
        return pa.table({"0": pa.array([], pa.int64())}), False
    # A first row whose length cell reads as a number is data: never drop it as a header
    # (integral floats such as "12.0" included).
    if isinstance(column, (int, np.integer)) and not isinstance(column, bool) and 0 <= column < len(cells):
        header = not _is_number(cells[int(column)])
    elif isinstance(column, str) and column in cells:
        header = True
    else:
        header = not any(_is_number(c) for c in cells)
    read = pacsv.ReadOptions(autogenerate_column_names=not header, encoding=encoding)
    parse = pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=True)
    convert = pacsv.ConvertOptions(
        strings_can_be_null=True, column_types={as_text: pa.string()} if as_text is not None else None
    )
    try:
        table = pacsv.read_csv(path, read_options=read, parse_options=parse, convert_options=convert)
        _ = table.column_names  # header names are decoded lazily: fail here, naming the file
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        hint = "" if encoding != "utf-8" else " (seqpack reads UTF-8, or UTF-16/32 with a byte-order mark)"
        raise SampleError(f"{path}: cannot parse as {encoding} CSV{hint}: {_first_line(err)}") from None
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
    except (pa.ArrowInvalid, UnicodeDecodeError) as err:
        raise SampleError(f"{path}: cannot read as {kind}: {_first_line(err)}") from None


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
        raise ConfigError(f"{path}: {len(names)} columns {names}; pass column= to pick the lengths")
    if isinstance(column, (int, np.integer)) and not isinstance(column, bool):
        if not 0 <= column < len(names):
            raise ConfigError(f"{path}: column index {column} out of range; the file has {len(names)} columns {names}")
        return names[int(column)]
    if isinstance(column, str) and column in names:
        return column
    if not header and str(column).isdigit() and int(column) < len(names):
        return names[int(column)]
    raise ConfigError(f"{path}: no column {column!r}; columns are {names}")


def _where(path: str, kind: str, row: int, header: bool) -> str:
    """Human position of data row ``row`` (0-based): the file line for CSV."""
    if kind == "csv":
        lines = _nonempty_lines(path, limit=row + 1 + int(header), encoding=_encoding(path))
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
        IsADirectoryError: ``path`` is a directory.
        ConfigError: Unknown file type or column.
        SampleError: A file that does not parse, or a missing, non-integer, negative or
            too large (> 2**63 - 1) value; the message names the file, the row or line,
            and the value.
    """
    path = check_path("path", path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a file of lengths")
    kind = file_format(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    table, header = _read_table(path, kind, column)
    name = _pick_column(path, table, column, header)
    col = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.int64())
    what = f"{path}: column {name!r}"
    if col.null_count:
        row = int(np.flatnonzero(np.asarray(col.is_null()))[0])
        raise SampleError(f"{what}: missing value at {_where(path, kind, row, header)}")
    values, bad_row, problem = _as_lengths(col)
    if bad_row is not None:
        if kind == "csv" and pa.types.is_floating(col.type):
            # Show the value as written (99999999999999999999), not as the float it parsed to (1e20).
            text = _read_csv(path, column, as_text=name)[0].column(name)[bad_row].as_py()
            problem = problem.replace(_shown(col[bad_row].as_py()), text.strip())
        raise SampleError(f"{what}: {problem} at {_where(path, kind, bad_row, header)}")
    return values


def _shown(value: float) -> str:
    """How a float length appears in a message: integral ones without a fraction."""
    return f"{value:.0f}" if math.isfinite(value) and value == round(value) else repr(value)


def _as_lengths(col: pa.Array) -> tuple[np.ndarray, int | None, str]:
    """(int64 values, first bad row or None, what is wrong with it) of a length column."""
    if pa.types.is_integer(col.type):
        raw = np.asarray(col.to_numpy(zero_copy_only=False))
        if raw.dtype == np.uint64 and raw.size and int(raw.max()) > INT64_MAX:  # would wrap negative
            row = int(np.flatnonzero(raw > INT64_MAX)[0])
            return raw, row, f"length {int(raw[row])} is too large (at most 2**63 - 1)"
        values = raw.astype(np.int64)
    elif pa.types.is_floating(col.type):
        raw = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))
        if bad.size:
            return raw, int(bad[0]), f"non-integer length {_shown(float(raw[bad[0]]))}"
        big = np.flatnonzero(raw >= 2.0**63)  # integers past int64 parse as floats
        if big.size:
            return raw, int(big[0]), f"length {_shown(float(raw[big[0]]))} is too large (at most 2**63 - 1)"
        if raw.size and raw.min() < 0:  # before the cast: one below -2**63 would wrap
            row = int(np.argmin(raw))
            return raw, row, f"negative length {_shown(float(raw[row]))}"
        values = raw.astype(np.int64)
    else:
        texts = col.to_pylist()
        values = np.empty(len(texts), dtype=np.int64)
        for row, text in enumerate(texts):
            if isinstance(text, bool) or not (isinstance(text, int) or (isinstance(text, str) and _is_int(text))):
                return values, row, f"non-integer length {text!r}"
            number = int(text.strip().strip('"').strip("'")) if isinstance(text, str) else text
            if number > INT64_MAX:
                return values, row, f"length {number} is too large (at most 2**63 - 1)"
            if number < 0:
                return values, row, f"negative length {number}"
            values[row] = number
    if values.size and values.min() < 0:
        row = int(np.argmin(values))
        return values, row, f"negative length {int(values[row])}"
    return values, None, ""


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def write_lengths(path: str | os.PathLike, lengths: Sequence[int] | np.ndarray, column: str = "length") -> None:
    """Write lengths to CSV (with a header), Parquet, Arrow IPC or JSON lines, by extension.

    :func:`lengths_from_file` reads every format back.

    Raises:
        ConfigError: An unknown extension.
        IsADirectoryError: ``path`` is a directory.
        OSError: The file cannot be written (a missing directory, no permission).
    """
    path = check_path("path", path)
    if not isinstance(column, str) or not column or any(c in column for c in '\n\r"'):
        raise SeqpackTypeError(f"column must be a column name (a non-empty string), got {column!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory; give a file name")
    kind = file_format(path)
    arr = int64_array("lengths", lengths, too_large=SampleError, element="sample {index} has length")
    if arr.ndim != 1:
        raise SeqpackTypeError(f"lengths must be a 1-D sequence of integers, got {lengths!r:.60}")
    if arr.size and arr.min() < 0:  # zeros are empty samples
        i = int(np.argmin(arr))
        raise SampleError(f"lengths must be >= 0: sample {i} has length {int(arr[i])}")
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
