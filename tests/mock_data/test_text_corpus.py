import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seqpack.mock_data.text import TokenDataset, split_documents, stdlib_corpus


def test_split_documents_at_top_level_definitions():
    src = b"import os\n\ndef a():\n    return 1\n\n@dec\nclass B:\n    def m(self):\n        pass\n"
    docs = split_documents(src, max_len=1000)
    assert docs == [
        b"import os\n\n",
        b"def a():\n    return 1\n\n",
        b"@dec\nclass B:\n",
        b"    def m(self):\n        pass\n",
    ]
    assert b"".join(docs) == src
    cut = split_documents(b"def f():\n" + b"x" * 25, max_len=10)
    assert [len(d) for d in cut] == [10, 10, 10, 4]


def test_stdlib_corpus_is_real_and_lossless(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_bytes(b"def f():\n    pass\n\nclass C:\n    x = 1\n")
    (root / "pkg" / "b.py").write_bytes(b"import sys\n" + b"y = 2\n" * 10)
    (root / "notes.txt").write_bytes(b"ignored")
    table = stdlib_corpus(str(root), max_len=32)
    assert table.column_names == ["path", "input_ids", "length"]
    assert set(table.column("path").to_pylist()) == {"a.py", "pkg/b.py"}
    ds = TokenDataset(table)
    joined = bytes(np.concatenate([ds[i]["input_ids"].numpy() for i in range(len(ds))]).astype(np.uint8))
    assert joined == (root / "a.py").read_bytes() + (root / "pkg" / "b.py").read_bytes()
    assert ds.lengths().max() <= 32
    assert np.array_equal(ds.lengths(), table.column("length").to_numpy())


@pytest.mark.slow
def test_real_stdlib_has_a_heavy_tailed_length_distribution():
    table = stdlib_corpus(max_files=120, max_len=8192)
    lengths = table.column("length").to_numpy()
    assert lengths.shape[0] > 500
    assert np.percentile(lengths, 99) > 10 * np.median(lengths)


def test_token_dataset_from_parquet_and_text(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"input_ids": [[5, 6, 7], [1], []]}), path)
    ds = TokenDataset(str(path))
    assert len(ds) == 3 and ds[0]["input_ids"].tolist() == [5, 6, 7] and ds[2]["input_ids"].numel() == 0
    assert ds[-1]["input_ids"].numel() == 0 and ds.vocab_size == 8
    with pytest.raises(IndexError):
        ds[3]
    text = TokenDataset(pa.table({"text": ["hi", "é"]}))
    assert text[0]["input_ids"].tolist() == [104, 105] and text[1]["input_ids"].tolist() == [195, 169]
    with pytest.raises(ValueError, match="'input_ids' or 'text'"):
        TokenDataset(pa.table({"x": [1]}))
    with pytest.raises(TypeError, match="integers"):
        TokenDataset(pa.table({"input_ids": [[1.5]]}))


def test_token_dataset_errors_name_the_file(tmp_path):
    from seqpack.errors import SampleError, SeqpackTypeError

    path = tmp_path / "docs.parquet"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(SampleError, match="docs.parquet: cannot read as Parquet"):
        TokenDataset(path)
    with pytest.raises(FileNotFoundError, match="nope.parquet: no such file"):
        TokenDataset(tmp_path / "nope.parquet")
    with pytest.raises(IsADirectoryError):
        TokenDataset(tmp_path)
    pq.write_table(pa.table({"input_ids": [[1, -2]]}), path)
    with pytest.raises(SampleError, match="docs.parquet: input_ids must be non-negative token ids, got -2"):
        TokenDataset(path)
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2**63]], pa.list_(pa.uint64()))}), path)
    with pytest.raises(SampleError, match="larger than int64"):
        TokenDataset(path)
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(SeqpackTypeError, match="docs.parquet: text must be a string column"):
        TokenDataset(path)


def test_stdlib_corpus_past_int32_offsets_is_a_large_list(tmp_path, monkeypatch):
    from seqpack.mock_data import io

    root = tmp_path / "lib"
    root.mkdir()
    (root / "a.py").write_bytes(b"def f():\n    pass\n\nclass C:\n    x = 1\n")
    small = stdlib_corpus(str(root))
    monkeypatch.setattr(io, "LIST_MAX_VALUES", 10)  # the real 2**31 - 1 is too big for a test
    large = stdlib_corpus(str(root))
    assert pa.types.is_list(small.schema.field("input_ids").type)
    assert pa.types.is_large_list(large.schema.field("input_ids").type)
    assert large.column("input_ids").to_pylist() == small.column("input_ids").to_pylist()
    ds = TokenDataset(large)
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == small.column("input_ids").to_pylist()
