import numpy as np
import pytest
import torch

from seqpack.mock_data import MockSFTDataset, lengths_from_file
from seqpack.thd import pack_sequences


def test_samples_depend_only_on_seed_and_index():
    ds = MockSFTDataset([5, 3, 8], vocab_size=50, seed=7)
    assert len(ds) == 3 and [ds[i]["input_ids"].shape[0] for i in range(3)] == [5, 3, 8]
    again = MockSFTDataset([5, 9, 8, 1], vocab_size=50, seed=7)
    assert torch.equal(ds[2]["input_ids"], again[2]["input_ids"])  # other samples don't matter
    assert torch.equal(ds[0]["input_ids"], ds[0]["input_ids"]) and torch.equal(ds[-1]["input_ids"], ds[2]["input_ids"])
    assert not torch.equal(ds[0]["input_ids"], MockSFTDataset([5], vocab_size=50, seed=8)[0]["input_ids"])
    ids = torch.cat([s["input_ids"] for s in ds])
    assert ids.min() >= 1 and ids.max() < 50 and ids.dtype == torch.int64


def test_labels_and_loss_mask():
    s = MockSFTDataset([10], seed=1, prompt_fraction=0.5)[0]
    ids, labels, mask = s["input_ids"], s["labels"], s["loss_mask"]
    assert labels[-1] == -100 and torch.equal(labels[4:9], ids[5:10])
    assert (labels[:4] == -100).all() and mask.tolist() == [0.0] * 4 + [1.0] * 5 + [0.0]
    batch = pack_sequences(list(MockSFTDataset([3, 4], seed=0)), pad_multiple=4)
    assert batch.num_real_tokens == 7 and batch.num_tokens == 8


def test_errors():
    with pytest.raises(ValueError, match="sample 1 has length 0"):
        MockSFTDataset([3, 0])
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 2"):
        MockSFTDataset([3], vocab_size=1)
    with pytest.raises(IndexError, match="index 3 out of range for 1 samples"):
        MockSFTDataset([3])[3]


def test_write_parquet_round_trip(tmp_path):
    import pyarrow.parquet as pq

    ds = MockSFTDataset([5, 3, 8, 2, 6], vocab_size=1000, seed=3)
    path = tmp_path / "mock.parquet"
    ds.write_parquet(path, rows_per_group=2)
    table = pq.read_table(path)
    assert table.column("length").to_pylist() == [5, 3, 8, 2, 6]
    rows = table.column("input_ids").to_pylist()
    for i, row in enumerate(rows):
        assert row == ds[i]["input_ids"].tolist()
    assert lengths_from_file(path).tolist() == [5, 3, 8, 2, 6]
    MockSFTDataset(np.zeros(0, dtype=np.int64)).write_parquet(tmp_path / "empty.parquet")
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


@pytest.mark.parametrize("limit, large", [(10, True), (11, False)])
def test_write_parquet_uses_int64_list_offsets_where_a_row_group_passes_int32(tmp_path, monkeypatch, limit, large):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from seqpack.mock_data import io

    # Row groups of 2 samples hold 5+6=11 and 7 tokens: past a limit of 10, int32 offsets
    # would not address the first group (the real limit, 2**31 - 1, is too big for a test).
    monkeypatch.setattr(io, "LIST_MAX_VALUES", limit)
    ds = MockSFTDataset([5, 6, 7], vocab_size=100, seed=1)
    ds.write_parquet(tmp_path / "big.parquet", rows_per_group=2)
    table = pq.read_table(tmp_path / "big.parquet")
    assert pa.types.is_large_list(table.schema.field("input_ids").type) == large
    assert table.column("input_ids").to_pylist() == [ds[i]["input_ids"].tolist() for i in range(3)]
    assert lengths_from_file(tmp_path / "big.parquet").tolist() == [5, 6, 7]


def test_a_sample_larger_than_memory_is_refused_before_drawing_it():
    from seqpack.errors import ConfigError

    ds = MockSFTDataset([3, 2**60], vocab_size=100)
    assert ds[0]["input_ids"].shape == (3,)
    with pytest.raises(ConfigError, match=r"sample 1 of 1152921504606846976 tokens is too large: it needs at least"):
        ds[1]


def test_write_parquet_reports_progress_and_refuses_a_directory(tmp_path, caplog):
    import logging

    ds = MockSFTDataset([5, 3, 8, 2, 6], vocab_size=50)
    seen = []
    ds.write_parquet(tmp_path / "a.parquet", rows_per_group=2, progress=seen.append)
    assert seen == [2, 2, 1]
    with caplog.at_level(logging.INFO, logger="seqpack.mock_data.sft"):
        ds.write_parquet(tmp_path / "b.parquet", rows_per_group=4, progress=True)
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "wrote 4 of 5 samples",
        "wrote 5 of 5 samples",
    ]
    with pytest.raises(IsADirectoryError, match="is a directory"):
        ds.write_parquet(tmp_path)


def test_argument_errors_are_seqpack_errors():
    from seqpack.errors import ConfigError, SampleError, SeqpackTypeError

    with pytest.raises(SampleError):
        MockSFTDataset([3, 0])
    with pytest.raises(ConfigError, match="vocab_size must be an integer >= 2, got 0"):
        MockSFTDataset([3], vocab_size=0)
    with pytest.raises(SeqpackTypeError):
        MockSFTDataset([1.5])
    with pytest.raises(ConfigError, match="prompt_fraction"):
        MockSFTDataset([3], prompt_fraction=1.0)
    with pytest.raises(SampleError, match=r"sample 0 has length 18446744073709551615, too large"):
        MockSFTDataset(np.array([2**64 - 1], dtype=np.uint64))
