import json

import numpy as np
import pyarrow.parquet as pq

from seqpack.cli import main
from seqpack.mock_data import lengths_from_file, lognormal_lengths


def test_mock_writes_megatron_lognormal_by_default(tmp_path, capsys):
    out = tmp_path / "lens.csv"
    assert main(["mock", "-n", "500", "-o", str(out)]) == 0
    expected = lognormal_lengths(500, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=0)
    assert np.array_equal(lengths_from_file(out), expected)
    assert "wrote 500 lengths from lognormal(" in capsys.readouterr().out


def test_mock_distributions_config_and_formats(tmp_path):
    out = tmp_path / "p.parquet"
    assert (
        main(["mock", "--dist", "pareto", "--alpha", "1.5", "--max-seq-len", "9000", "-n", "100", "-o", str(out), "-q"])
        == 0
    )
    lengths = lengths_from_file(out)
    assert lengths.size == 100 and lengths.min() >= 128 and lengths.max() <= 9000
    cfg = json.dumps({"mode": "distribution", "type": "uniform", "min_seq_len": 5, "max_seq_len": 9})
    out = tmp_path / "u.jsonl"
    assert main(["mock", "--config", cfg, "-n", "50", "-o", str(out), "-q"]) == 0
    assert set(lengths_from_file(out).tolist()) <= set(range(5, 10))


def test_mock_dataset(tmp_path, capsys):
    out = tmp_path / "ds.parquet"
    assert (
        main(
            [
                "mock",
                "--dist",
                "constant",
                "--length",
                "7",
                "-n",
                "3",
                "--dataset",
                "--vocab-size",
                "100",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    table = pq.read_table(out)
    assert table.column("length").to_pylist() == [7, 7, 7]
    assert all(len(row) == 7 and max(row) < 100 for row in table.column("input_ids").to_pylist())
    assert "mock SFT dataset" in capsys.readouterr().out


def test_mock_errors(tmp_path, capsys):
    assert main(["mock", "--alpha", "2", "-o", str(tmp_path / "x.csv")]) == 2
    assert "--alpha does not apply to the 'lognormal' distribution" in capsys.readouterr().err
    assert main(["mock", "--dataset", "-o", str(tmp_path / "x.csv")]) == 2
    assert "writes Parquet" in capsys.readouterr().err
    assert main(["mock", "--dist", "uniform", "--config", "{}", "-o", str(tmp_path / "x.csv")]) == 2
    assert "give one source of lengths" in capsys.readouterr().err
    assert main(["mock", "-o", str(tmp_path / "x.xlsx")]) == 2
    assert "unknown file type" in capsys.readouterr().err
