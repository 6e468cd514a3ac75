"""Issue 13 item 4: every user mistake is exit 2 with ONE line naming the flag or file and the
value; no traceback, and (for the demo) no process started."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cli import main
from seqpack.mock_data import write_lengths
from seqpack.schedulers.objective import exact_sum


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def _fails(argv, capsys, *expected: str) -> str:
    assert main([str(a) for a in argv]) == 2
    line = _error_line(capsys)
    for text in expected:
        assert text in line, line
    return line


@pytest.fixture
def lengths_csv(tmp_path):
    path = tmp_path / "lens.csv"
    write_lengths(path, [100, 200, 300])
    return path


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail the test if the demo starts a process."""
    import torch.multiprocessing as mp

    def refuse(*args, **kwargs):
        raise AssertionError("the demo started processes before refusing the mistake")

    monkeypatch.setattr(mp, "start_processes", refuse)


# -- stats --plot --------------------------------------------------------------------------


def test_stats_plot_without_matplotlib(lengths_csv, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    _fails(["stats", lengths_csv, "--plot", tmp_path / "h.png"], capsys, "--plot needs matplotlib", "seqpack[plot]")
    assert not (tmp_path / "h.png").exists()


@pytest.mark.slow
def test_stats_plot_on_all_zero_lengths(tmp_path, capsys):
    path = tmp_path / "zeros.csv"
    write_lengths(path, [0, 0, 0])
    _fails(["stats", path, "--plot", tmp_path / "h.png"], capsys, "--plot", str(path), "no non-zero lengths")


def test_stats_plot_into_a_missing_directory(lengths_csv, tmp_path, capsys):
    target = tmp_path / "nowhere" / "h.png"
    _fails(["stats", lengths_csv, "--plot", target], capsys, "--plot", str(target), "does not exist")


@pytest.mark.slow
def test_stats_plot_refuses_a_directory_and_writes_exactly_the_path(lengths_csv, tmp_path, capsys):
    _fails(["stats", lengths_csv, "--plot", tmp_path], capsys, "--plot", str(tmp_path), "is a directory")
    target = tmp_path / "histogram"  # no extension: PNG, at exactly this path (matplotlib alone adds .png)
    assert main(["stats", str(lengths_csv), "--plot", str(target)]) == 0
    assert target.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "histogram.png").exists()
    assert f"histogram written to {target}" in capsys.readouterr().out
    svg = tmp_path / "h.svg"
    assert main(["stats", str(lengths_csv), "--plot", str(svg)]) == 0
    assert b"<svg" in svg.read_bytes()[:400]
    _fails(["stats", lengths_csv, "--plot", tmp_path / "h.txt"], capsys, "--plot", "h.txt", "cannot write .txt")


@pytest.mark.parametrize("bins", ["0", "-3"])
def test_stats_bins(lengths_csv, tmp_path, capsys, bins):
    _fails(["stats", lengths_csv, "--plot", tmp_path / "h.png", "--bins", bins], capsys, "--bins", bins)


# -- files ------------------------------------------------------------------------------


def test_a_directory_as_a_length_file(tmp_path, capsys):
    folder = tmp_path / "lens.csv"
    folder.mkdir()
    line = _fails(["stats", folder], capsys, str(folder), "is a directory")
    assert "no such file" not in line
    _fails(["simulate", "--lengths", folder, "--no-progress"], capsys, str(folder), "is a directory")


def test_utf16_csv_is_read_and_an_undecodable_one_named(tmp_path, capsys):
    path = tmp_path / "excel.csv"
    path.write_bytes("length\n5\n6\n".encode("utf-16"))
    assert main(["stats", str(path), "--json", "--model", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == 11
    path.write_bytes(b"length\n5\n\xff\xfe\xfd\n")
    _fails(["stats", path], capsys, str(path))
    path.write_bytes(b"\xff\xfe\x00" + b"garbage\n")  # a UTF-16 byte-order mark, then not UTF-16
    _fails(["stats", path], capsys, str(path), "cannot parse")


@pytest.mark.parametrize(
    "write, where",
    [
        (lambda p: p.write_text("length\n5\n99999999999999999999\n"), "line 3"),
        (lambda p: p.write_text("length\n5\n-4\n"), "line 3"),
    ],
)
def test_bad_values_name_file_row_and_value(tmp_path, capsys, write, where):
    path = tmp_path / "lens.csv"
    write(path)
    line = _fails(["stats", path], capsys, str(path), where)
    assert "99999999999999999999" in line or "-4" in line
    assert "-9223372036854775808" not in line  # never the wrapped int64


def test_uint64_parquet_past_int64(tmp_path, capsys):
    path = tmp_path / "lens.parquet"
    pq.write_table(pa.table({"length": pa.array([3, 2**63 + 5], pa.uint64())}), path)
    _fails(["stats", path], capsys, str(path), "row 2", str(2**63 + 5), "too large")


def test_stats_token_totals_are_exact(tmp_path, capsys):
    path = tmp_path / "lens.csv"
    big = 2**63 - 1
    write_lengths(path, [big, big, big])
    assert main(["stats", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tokens"] == 3 * big and summary["max"] == big  # never negative from int64 overflow
    assert 0.99 < summary["attention_share"] <= 1.0


# -- mock -----------------------------------------------------------------------------------


def test_mock_output_is_a_directory(tmp_path, capsys):
    _fails(["mock", "-n", "3", "-o", tmp_path], capsys, "-o", str(tmp_path), "is a directory")
    _fails(["mock", "-n", "3", "--dataset", "-o", tmp_path], capsys, "-o", str(tmp_path), "is a directory")


@pytest.mark.parametrize("vocab", ["0", "1", "-5"])
def test_mock_vocab_size(tmp_path, capsys, vocab):
    out = tmp_path / "d.parquet"
    _fails(["mock", "--dataset", "-n", "3", "--vocab-size", vocab, "-o", out], capsys, "--vocab-size", vocab)
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--seed", "-1"], ("--seed", "-1")),
        (["-n", "-1"], ("--num-samples", "-1")),
        (["--min-seq-len", "0"], ("--dist lognormal", "--min-seq-len 0")),
        (["--max-seq-len", "100"], ("--max-seq-len 100", "max_seq_len=100")),
        (["--dist", "bimodal", "--long-fraction", "2"], ("--long-fraction 2", "long_fraction")),
        (["--config", "{not json"], ("config is not valid JSON",)),
    ],
)
def test_mock_generator_mistakes_name_the_flag(tmp_path, capsys, argv, expected):
    _fails(["mock", *argv, "-o", tmp_path / "x.csv"], capsys, *expected)


def test_mock_config_directory_and_missing_file(tmp_path, capsys):
    _fails(["mock", "--config", tmp_path, "-o", tmp_path / "x.csv"], capsys, str(tmp_path), "is a directory")
    missing = tmp_path / "cfg.json"
    _fails(["mock", "--config", missing, "-o", tmp_path / "x.csv"], capsys, str(missing), "neither")


# -- simulate --pad-multiple -----------------------------------------------------------------


def test_simulate_pad_multiple_zero_is_an_error_not_the_default(capsys):
    _fails(["simulate", "--pad-multiple", "0", "--steps", "1", "--no-progress"], capsys, "--pad-multiple", "0")


def test_simulate_pad_multiple_follows_the_wrappers_cp_rule(capsys):
    _fails(["simulate", "--pad-multiple", "3", "--cp", "2", "--steps", "1", "--no-progress"], capsys,
           "--pad-multiple 3", "2 * --cp = 4")  # fmt: skip
    args = ["simulate", "--pad-multiple", "8", "--cp", "2", "--steps", "1", "--no-progress", "--json", "--dp", "2"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["config"]["pad_multiple"] == 8


def test_simulate_plot_into_a_missing_directory_fails_before_simulating(tmp_path, capsys, monkeypatch):
    import seqpack.cli.commands.simulate as sim

    monkeypatch.setattr(sim, "simulate", lambda *a, **k: pytest.fail("simulated before refusing --plot"))
    _fails(["simulate", "--plot", tmp_path / "no" / "p.png", "--no-progress"], capsys, "--plot", "does not exist")


# -- demo: everything is refused before any process starts -----------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--pattern", "XYZ"], ("--pattern", "'XYZ'")),
        (["--pattern", ""], ("--pattern", "''")),
        (["--d-model", "7"], ("--d-model 7",)),
        (["--d-model", "80"], ("--d-model 80",)),
        (["--d-model", "8", "--pattern", "M", "--cp", "2"], ("--cp 2", "1 heads")),
        (["--cp", "3"], ("--cp 3", "divides 8")),
        (["--modes", "balanced,balanced"], ("--modes",)),
        (["--lr", "0"], ("--lr",)),
        (["--warmup-steps", "-1"], ("--warmup-steps", "-1")),
        (["--port", "70000"], ("--port", "70000")),
    ],
)
def test_demo_settings_mistakes(capsys, no_spawn, argv, expected):
    _fails(["demo", *argv], capsys, *expected)


def test_demo_cp3_is_fine_without_mamba(no_spawn):
    from seqpack.cli.demo.settings import DemoSettings

    assert DemoSettings(cp=3, pattern="AA").cp == 3  # the CP rule is Mamba's, not attention's


def test_demo_malformed_parquet_is_refused_in_the_parent(tmp_path, capsys, no_spawn):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"this is not parquet")
    _fails(["demo", "--data", path], capsys, str(path), "cannot read as Parquet")
    pq.write_table(pa.table({"tokens": [[1, 2]]}), path)
    _fails(["demo", "--data", path], capsys, str(path), "'input_ids' or 'text'")
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), path)
    _fails(["demo", "--data", path], capsys, "--data", "2 documents")
    _fails(["demo", "--data", tmp_path], capsys, "--data", "is a directory")


def test_demo_json_out_is_checked_before_training(tmp_path, capsys, no_spawn):
    _fails(["demo", "--json-out", tmp_path], capsys, "--json-out", str(tmp_path), "is a directory")
    _fails(["demo", "--json-out", tmp_path / "no" / "r.json"], capsys, "--json-out", "does not exist")


def test_demo_rank_refusing_its_data_exits_2_with_one_line(monkeypatch, capsys):
    """The last resort: a mistake only a rank can see is one line and exit 2, not a traceback."""
    import torch.distributed as dist

    from seqpack.cli.demo import launch
    from seqpack.cli.demo.settings import DemoSettings
    from seqpack.errors import SampleError

    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: None)

    def bad_rank(settings):
        raise SampleError("doc.parquet: row 7 holds token id -1")

    monkeypatch.setattr(launch, "_run_rank", bad_rank)
    with pytest.raises(SystemExit) as exit_info:
        launch._spawned(1, DemoSettings(), 12345)
    assert exit_info.value.code == 2
    assert _error_line(capsys) == "seqpack demo: rank 1: error: doc.parquet: row 7 holds token id -1"


def test_demo_launcher_maps_rank_exit_codes(monkeypatch, capsys):
    import torch.multiprocessing as mp

    from seqpack.cli.demo.launch import launch
    from seqpack.cli.demo.settings import DemoSettings

    def exits(code):
        def start(*args, **kwargs):
            raise mp.ProcessExitedException("gone", error_index=1, error_pid=4242, exit_code=code)

        return start

    monkeypatch.setattr(mp, "start_processes", exits(2))
    assert launch(DemoSettings(quiet=True)) == 2
    assert capsys.readouterr().err == ""  # the rank printed its one line
    monkeypatch.setattr(mp, "start_processes", exits(-9))
    assert launch(DemoSettings(quiet=True)) == 1
    assert "rank 1 died (exit code -9)" in capsys.readouterr().err


def test_bugs_still_raise(monkeypatch, lengths_csv):
    """Only mistakes are mapped to exit 2: an unexpected exception keeps its traceback."""
    import seqpack.cli.commands.stats as stats

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(stats, "length_summary", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["stats", str(lengths_csv)])


@given(
    st.lists(st.one_of(st.integers(0, 2**20), st.integers(0, 2**63 - 1)), max_size=40),
    st.booleans(),
)
def test_exact_sum_matches_python_ints(values, squares):
    """The numpy fast path and the Python-int path both equal the obvious sum."""
    arr = np.array(values, dtype=np.int64)
    expected = sum(v * v for v in values) if squares else sum(values)
    assert exact_sum(arr, squares=squares) == expected
