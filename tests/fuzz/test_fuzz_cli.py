"""Fuzz the ``seqpack`` command: every flag of every subcommand, from a valid command line,
set to a hostile value. The answer is exit 0, or exit 2 with one ``error:`` line that names
the flag or the value (docs/errors.md, "CLI exit codes"); never a traceback, never another
status. ``seqpack demo`` is fuzzed up to the point where it would start processes."""

from __future__ import annotations

import argparse
import collections

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.cli import main
from seqpack.cli.app import build_parser
from seqpack.mock_data import write_lengths

# Curated like hostile.HOSTILE: small, malformed or absurd, never a valid request so big it
# takes long (absurd sizes are refused before any allocation on every machine).
VALUES = [
    "", " ", "0", "-1", "1", "2", "3", "2.5", "-0.0", "nan", "inf", "-inf", "1e400", "0x10",
    "35184372088832", "9223372036854775808", "18446744073709551616", "99999999999999999999",
    "abc", "\u00e9", "balanced,nope", ",", "-", "--json",
    "/nonexistent/dir/x.csv", "{tmp}", "{tmp}/x.xyz", "{tmp}/out.parquet", "{tmp}/out.csv", "{tmp}/out.png",
    "{tmp}/lens.csv", "{tmp}/bad.parquet", "{tmp}/utf16.csv", "{tmp}/zeros.csv",
    '{"mode": "distribution"}', "{bad json",
]  # fmt: skip

# A valid, fast command line per subcommand (output paths inside the test's tmp dir).
BASE = {
    "mock": ["-n", "40", "-o", "{tmp}/base.csv", "-q"],
    "stats": ["{tmp}/lens.csv"],
    "simulate": ["--global-batch", "16", "--steps", "2", "--dp", "2", "--no-progress", "--max-seq-len", "4096"],
    "demo": ["--quiet"],
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flags(command: str) -> list[tuple[str, bool, tuple[str, ...]]]:
    """(flag or positional name, whether it takes a value, every spelling of it) of every
    argument of ``command``."""
    out = []
    for action in _subparsers()[command]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = action.option_strings[-1] if action.option_strings else action.dest
        out.append((name, action.nargs != 0, tuple(action.option_strings) or (name,)))
    return out


@pytest.fixture
def cli_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative output path lands here
    write_lengths(tmp_path / "lens.csv", [100, 2000, 300, 4000, 50])
    write_lengths(tmp_path / "zeros.csv", [0, 0])
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "utf16.csv").write_bytes("length\n5\n".encode("utf-16-le"))  # no byte-order mark
    pq.write_table(pa.table({"length": [3, 4]}), tmp_path / "ok.parquet")
    return tmp_path


@pytest.fixture
def no_spawn(monkeypatch):
    """``seqpack demo`` stops where it would start its processes: what comes before is the
    argument and file checking under test."""
    import torch.multiprocessing as mp

    monkeypatch.setattr(mp, "start_processes", lambda *args, **kwargs: None)
    monkeypatch.delenv("RANK", raising=False)


def _argv(command: str, flag: str, value: str | None, tmp: str, takes_value: bool = True) -> list[str]:
    base = [part.replace("{tmp}", tmp) for part in BASE[command]]
    if not flag.startswith("-"):  # the positional (stats FILE): replace it
        return [command, *(base[1:] if base and not base[0].startswith("-") else base), value or ""]
    if flag in base:  # replace the base's value of this flag
        i = base.index(flag)
        base = base[:i] + base[i + 1 + int(takes_value) :]
    return [command, *base, flag] + ([] if value is None else [value])


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of ``seqpack ARGV``; any escaping exception fails the test."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help / --version exit 0
        status = exc.code if isinstance(exc.code, int) else 2
    return status, capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(BASE))
def test_the_base_command_lines_are_valid(command, cli_files, no_spawn, capsys):
    status, err = run_cli([command, *(part.replace("{tmp}", str(cli_files)) for part in BASE[command])], capsys)
    assert status == 0, err


@pytest.mark.parametrize("command", sorted(BASE))
@pytest.mark.slow
def test_every_flag_with_a_hostile_value_exits_0_or_2_with_one_line(command, cli_files, no_spawn, capsys):
    flags = _flags(command)
    outcomes = collections.Counter()

    @settings(max_examples=45)
    @given(flag=st.sampled_from(flags), value=st.sampled_from(VALUES), drop_value=st.booleans())
    def one_flag(flag, value, drop_value):
        name, takes_value, spellings = flag
        value = value.replace("{tmp}", str(cli_files))
        given_value = None if (drop_value and not takes_value) else value
        argv = _argv(command, name, given_value, str(cli_files), takes_value)
        status, err = run_cli(argv, capsys)
        assert status in (0, 2), f"seqpack {argv}: exit {status}\n{err}"
        assert "Traceback" not in err, f"seqpack {argv}:\n{err}"
        outcomes[status] += 1
        if status == 2:
            lines = [line for line in err.splitlines() if line.strip()]
            errors = [line for line in lines if "error:" in line]
            assert len(errors) == 1 and lines[-1] == errors[0], f"seqpack {argv}: not one error line:\n{err}"
            words = {*spellings, name.lstrip("-"), name.lstrip("-").replace("-", "_")}
            if given_value and given_value.strip():
                words.add(given_value.strip())
            if not name.startswith("-"):
                words.add(name.upper())
            if given_value is not None and not takes_value:  # a value after a switch: a stray argument
                words.add("unrecognized arguments")
            assert any(word in errors[0] for word in words), f"seqpack {argv}: the error names none of {words}: {err}"

    one_flag()
    assert outcomes[2] > 0 and outcomes[0] > 0, outcomes  # not vacuous: both refused and accepted
