import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from seqpack.errors import ConfigError, SampleError
from seqpack.mock_data import lengths_from_file, write_lengths
from seqpack.mock_data.io import file_format

LENGTHS = [4096, 17, 1, 300000]


@pytest.mark.parametrize("ext", ["csv", "tsv", "parquet", "arrow", "feather", "jsonl"])
def test_round_trip(tmp_path, ext):
    path = tmp_path / f"lens.{ext}"
    write_lengths(path, LENGTHS)
    got = lengths_from_file(path)
    assert got.dtype == np.int64 and got.tolist() == LENGTHS


def test_csv_without_header_keeps_the_first_length(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("4096\n17\n\n1\n")
    assert lengths_from_file(path).tolist() == [4096, 17, 1]
    path.write_text("length\n4096\n17\n")
    assert lengths_from_file(path).tolist() == [4096, 17]
    # Integral floats and an Excel byte-order mark are data too, never a header.
    path.write_text("12.0\n13.0\n14.0\n")
    assert lengths_from_file(path).tolist() == [12, 13, 14]
    path.write_text("\ufeff100\n200\n300\n", encoding="utf-8")
    assert lengths_from_file(path).tolist() == [100, 200, 300]
    path.write_text("\ufefflength,x\n5,1\n6,2\n", encoding="utf-8")
    assert lengths_from_file(path, column="length").tolist() == [5, 6]


def test_csv_with_several_columns(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text("id,seq_len,source\na,12,web\nb,30,code\n")
    assert lengths_from_file(path).tolist() == [12, 30]  # picked by name
    assert lengths_from_file(path, column="seq_len").tolist() == [12, 30]
    assert lengths_from_file(path, column=1).tolist() == [12, 30]
    # Headerless with a text column: the integer cell marks the first row as data.
    path.write_text("a,12\nb,30\n")
    assert lengths_from_file(path, column=1).tolist() == [12, 30]
    with pytest.raises(ValueError, match=r"2 columns .* pass column="):
        lengths_from_file(path)
    with pytest.raises(ValueError, match="column index 5 out of range"):
        lengths_from_file(path, column=5)


def test_other_formats_with_named_columns(tmp_path):
    table = pa.table({"num_tokens": [3, 4], "text": ["x", "y"]})
    pq.write_table(table, tmp_path / "t.parquet")
    feather.write_feather(table, tmp_path / "t.arrow")
    assert lengths_from_file(tmp_path / "t.parquet").tolist() == [3, 4]
    assert lengths_from_file(tmp_path / "t.arrow", column="num_tokens").tolist() == [3, 4]
    with pytest.raises(ValueError, match="no column 'nope'"):
        lengths_from_file(tmp_path / "t.parquet", column="nope")
    # Arrow IPC stream format too.
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert lengths_from_file(tmp_path / "s.arrow").tolist() == [3, 4]
    # Integral floats are fine.
    pq.write_table(pa.table({"length": [3.0, 5.0]}), tmp_path / "f.parquet")
    assert lengths_from_file(tmp_path / "f.parquet").tolist() == [3, 5]


@pytest.mark.parametrize(
    "text, match",
    [
        ("length\n5\n\n7.5\n", r"plain.csv: column 'length': non-integer length 7.5 at line 4"),
        ("length\n5\nabc\n", r"non-integer length 'abc' at line 3"),
        ("5\n-3\n", r"negative length -3 at line 2"),
        ("length\n5\n-1e20\n", r"negative length -1e20 at line 3"),  # a float column, below -2**63
        ("id,length\na,5\nb,\n", r"missing value at line 3"),
    ],
)
def test_csv_errors_name_file_line_and_value(tmp_path, text, match):
    path = tmp_path / "plain.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        lengths_from_file(path)


def test_jsonl_errors_and_missing_files(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text('{"length": 3}\n{"length": null}\n')
    with pytest.raises(ValueError, match=r"missing value at row 2"):
        lengths_from_file(path)
    path.write_text('{"length": 3}\n{"length": "x"}\n')
    with pytest.raises(ValueError, match=r"l.jsonl"):
        lengths_from_file(path)
    with pytest.raises(FileNotFoundError, match="nope.csv: no such file"):
        lengths_from_file(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="unknown file type '.xlsx'"):
        lengths_from_file(tmp_path / "a.xlsx")


def test_empty_csv(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("\n")
    assert lengths_from_file(path).tolist() == []


def test_a_directory_is_named_as_such(tmp_path):
    folder = tmp_path / "lens.csv"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="lens.csv: is a directory"):
        lengths_from_file(folder)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_lengths(folder, [1, 2])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_csv_with_a_byte_order_mark_is_transcoded(tmp_path, encoding):
    path = tmp_path / "excel.tsv"  # Excel's "Unicode text": UTF-16 with a BOM, tab-separated
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[encoding]
    path.write_bytes(bom + "id\tlength\na\t12\nb\t30\n".encode(encoding))
    assert lengths_from_file(path).tolist() == [12, 30]
    path.write_bytes(bom + "id\tlength\na\t12\nb\t-30\n".encode(encoding))
    with pytest.raises(SampleError, match=r"negative length -30 at line 3"):
        lengths_from_file(path)


def test_undecodable_csv_names_the_file(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("l\u00e4nge\n5\n".encode("latin-1"))
    with pytest.raises(SampleError, match=r"latin1.csv: cannot parse as utf-8 CSV .*UTF-8"):
        lengths_from_file(path)


@pytest.mark.parametrize(
    "name, write, match",
    [
        ("a.csv", lambda p: p.write_text("length\n1\n99999999999999999999\n"),
         r"a.csv: column 'length': length 99999999999999999999 is too large .* at line 3"),
        ("b.csv", lambda p: p.write_text("9223372036854775808\n"),
         r"length 9223372036854775808 is too large .* line 1"),
        ("c.jsonl", lambda p: p.write_text('{"length": 3}\n{"length": 1e30}\n'), r"c.jsonl: .* too large .* row 2"),
        ("d.parquet", lambda p: pq.write_table(pa.table({"length": pa.array([1, 2**64 - 1], pa.uint64())}), p),
         r"d.parquet: .*length 18446744073709551615 is too large .* row 2"),
        ("e.parquet", lambda p: pq.write_table(pa.table({"n": pa.array(["4", str(2**63)])}), p),
         rf"length {2**63} is too large .* row 2"),
        ("f.parquet", lambda p: pq.write_table(pa.table({"n": pa.array([3.0, -2.0])}), p),
         r"negative length -2 at row 2"),
    ],
)  # fmt: skip
def test_lengths_past_int64_or_negative_are_refused_with_the_value(tmp_path, name, write, match):
    path = tmp_path / name
    write(path)
    with pytest.raises(SampleError, match=match):
        lengths_from_file(path)


def test_int64_max_itself_is_a_length(tmp_path):
    path = tmp_path / "max.csv"
    path.write_text(f"{2**63 - 1}\n5\n")
    assert lengths_from_file(path).tolist() == [2**63 - 1, 5]


def test_error_types(tmp_path):
    with pytest.raises(ConfigError):
        lengths_from_file(tmp_path / "a.xlsx")
    assert file_format("x.TSV") == "csv" and file_format("x.feather") == "arrow"
    path = tmp_path / "multi.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="pass column="):
        lengths_from_file(path)
    path.write_text("length\nabc\n")
    with pytest.raises(SampleError, match="non-integer length 'abc'"):
        lengths_from_file(path)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SampleError, match="bad.parquet: cannot read as parquet"):
        lengths_from_file(tmp_path / "bad.parquet")


@pytest.mark.parametrize(
    "text, column, expected",
    [
        ("a;length\nx;5\ny;6\n", None, [5, 6]),  # semicolons (European Excel)
        ("a|length\nx|5\ny|6\n", None, [5, 6]),
        ('name,length\n"Smith, J",5\n"Doe, A",6\n', None, [5, 6]),  # a delimiter inside quotes
        ('"length"\n"5"\n"6"\n', None, [5, 6]),
        (" length \n 5 \n 6\n", None, [5, 6]),
        ("a;b\n1;5\n2;6\n", "b", [5, 6]),
        ("1;5\n2;6\n", 1, [5, 6]),  # no header: the first row is data
        ("5\n6\n7\n", None, [5, 6, 7]),  # one column: nothing to sniff
    ],
)
def test_csv_dialect_is_sniffed(tmp_path, text, column, expected):
    path = tmp_path / "d.csv"
    path.write_text(text)
    assert lengths_from_file(path, column=column).tolist() == expected


def test_a_directory_without_an_extension_is_named_as_a_directory(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory, not a file of lengths"):
        lengths_from_file(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a directory; give a file name"):
        write_lengths(tmp_path, [1])
