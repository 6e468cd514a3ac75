"""The command line at its edges: a field type that cannot become a flag is refused naming it;
an output path with no name or in a directory no one may write is refused before any work;
the cores fall back to the machine's without CPU affinity; a closed stdout with no file
descriptor (captured) still exits quietly."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys

import pytest

from seqpack.cli import app, files, tables
from seqpack.cli.exit import CommandError, ExitCode
from seqpack.cli.flags import add_options


@dataclasses.dataclass
class _Union:
    x: int | str | None = None


@dataclasses.dataclass
class _Bytes:
    x: bytes = b""


@dataclasses.dataclass
class _Pair:
    x: tuple[int, int] = (1, 2)


@pytest.mark.parametrize(
    ("cls", "words"),
    [(_Union, r"unsupported union .*only X \| None"), (_Bytes, r"unsupported option type <class 'bytes'>"),
     (_Pair, r"_Pair.x: only tuple\[X, \.\.\.\] becomes a flag")],
)  # fmt: skip
def test_a_field_type_that_cannot_become_a_flag_is_refused_naming_it(cls, words):
    with pytest.raises(TypeError, match=words):
        add_options(argparse.ArgumentParser(), cls)


@pytest.mark.parametrize("path", ["", "   "])
def test_an_output_without_a_name_is_refused_naming_the_flag(path):
    with pytest.raises(CommandError, match=rf"-o needs a file name, got {path!r}"):
        files.check_output_file("-o", path)


def test_an_output_in_a_directory_no_one_may_write_is_refused(tmp_path, monkeypatch):
    target = str(tmp_path / "plan.json")
    files.check_output_file("-o", target)  # writable: fine
    monkeypatch.setattr(files.os, "access", lambda path, mode: False)
    with pytest.raises(CommandError, match=rf"-o '{target}': directory '{tmp_path}' is not writable"):
        files.check_output_file("-o", target)


@pytest.mark.parametrize("error", [AttributeError, OSError])
def test_without_cpu_affinity_the_cores_are_the_machines(error, monkeypatch):
    def unsupported(pid):
        raise error("no affinity here")

    monkeypatch.setattr(tables.os, "sched_getaffinity", unsupported, raising=False)
    assert tables.usable_cores() == (os.cpu_count() or 1)


@pytest.mark.slow
def test_a_closed_stdout_without_a_file_descriptor_exits_quietly(monkeypatch, capsys):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("fileno")

    monkeypatch.setattr(sys, "stdout", Closed())
    code = app.main(["simulate", "--dp", "2", "--steps", "1", "--no-progress"])
    assert code == ExitCode.BROKEN_PIPE
    assert "error" not in capsys.readouterr().err
