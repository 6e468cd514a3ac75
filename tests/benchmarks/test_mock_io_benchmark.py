"""benchmarks/mock_io.py runs at toy size (1,000 lengths, 20 samples, one repeat) against its
default baseline revision (skipped where the clone lacks it, as a shallow one does), so that it
cannot rot: a line per CSV dialect and per Parquet writer, each timed."""

import re
import subprocess
import sys

import pytest
from benchmark_module import BENCHMARKS, benchmark_module

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # runs git

BASELINE = "210b20e"  # the script's default --baseline


def test_toy_run_times_every_dialect_and_writer(monkeypatch, capsys):
    root = BENCHMARKS.parent
    has = subprocess.run(["git", "cat-file", "-e", f"{BASELINE}^{{commit}}"], cwd=root, capture_output=True)
    if has.returncode != 0:
        pytest.skip(f"the clone lacks the baseline {BASELINE} that the benchmark reads with git show")
    monkeypatch.chdir(root)
    with benchmark_module("mock_io") as module:
        argv = ["mock_io.py", "--baseline", BASELINE, "--lengths", "1000", "--samples", "20", "--repeats", "1"]
        monkeypatch.setattr(sys, "argv", argv)
        module.main()
    out = capsys.readouterr().out
    assert re.search(rf"^seqpack \S+.* vs {BASELINE}, ", out)
    for dialect in ("one column", "two columns", "semicolons"):
        assert re.search(rf"^lengths_from_file {dialect}\s+1,000 rows: this\s+[\d.]+ ms", out, flags=re.MULTILINE)
    for writer in ("list", "large_list", "baseline"):
        line = rf"^MockSFTDataset {writer}\s+20 samples, [\d,]+ tokens: write_parquet\s+[\d.]+ ms, TokenDataset read"
        assert re.search(line, out, flags=re.MULTILINE), writer
