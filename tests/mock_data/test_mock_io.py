import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from seqpack.mock_data import lengths_from_file, write_lengths

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
