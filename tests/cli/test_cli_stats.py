import json

import pytest

from seqpack.cli import length_summary, main
from seqpack.mock_data import write_lengths


@pytest.mark.slow
def test_stats_summary_and_histogram(tmp_path, capsys):
    path = tmp_path / "lens.csv"
    write_lengths(path, [100, 200, 300, 400, 10_000])
    png = tmp_path / "hist.png"
    assert main(["stats", str(path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "5 sequences, 11,000 tokens" in out and "p50 300" in out and "attention's quadratic term" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_stats_json(tmp_path, capsys):
    path = tmp_path / "lens.parquet"
    write_lengths(path, [1, 2, 3, 0])
    assert main(["stats", str(path), "--json", "--model", "none"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 4 and data["tokens"] == 6 and data["max"] == 3 and data["zeros"] == 1
    assert "attention_share" not in data


def test_length_summary_attention_share():
    s = length_summary([8192], "llama3-8b")
    assert 0.12 < s["attention_share"] < 0.13
    assert length_summary([], None) == {"count": 0, "tokens": 0}


def test_stats_errors(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
