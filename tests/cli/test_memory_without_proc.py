"""seqpack.cli.memory where ``/proc`` does not answer (macOS, a locked-down container): the
peak is unknown (None) rather than wrong, and the memory available falls back to sysconf,
else is unknown."""

from __future__ import annotations

import os

import pytest

from seqpack.cli import memory


def test_a_proc_field_is_read_in_kib_and_a_missing_file_or_field_is_none(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t   2048 kB\nVmHWM:\t  4096 kB\n")
    assert memory._status_kib("VmRSS", status) == 2048
    assert memory._status_kib("VmHWM", status) == 4096
    assert memory._status_kib("VmSwap", status) is None
    assert memory._status_kib("VmRSS", tmp_path / "missing") is None


def test_the_peak_is_unknown_where_it_cannot_be_reset(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "no" / "clear_refs")
    with memory.PeakMemory() as peak:
        pass
    assert peak.bytes is None  # a high-water mark from before the block would overstate it
    assert peak.seconds >= 0


def test_available_memory_falls_back_to_sysconf_then_to_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "_MEMINFO", tmp_path / "meminfo")
    try:
        expected = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pytest.skip("no sysconf for physical pages here")
    got = memory.available_bytes()
    assert got is not None and abs(got - expected) <= expected // 4 + (64 << 20)  # memory moves meanwhile

    def refuse(name):
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(memory.os, "sysconf", refuse)
    assert memory.available_bytes() is None
    (tmp_path / "meminfo").write_text("MemTotal:  1000 kB\nMemAvailable:   512 kB\n")
    assert memory.available_bytes() == 512 * 1024  # /proc/meminfo first when it answers
