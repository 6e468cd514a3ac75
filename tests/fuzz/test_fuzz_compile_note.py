"""Fuzz the compile notice's reading of numba's index files (issue 29, item 2): a damaged,
truncated or hostile ``*.nbi`` file (huge length fields included) is a cold cache, never an
exception escaping into the kernel's import; only numba's own layout with this numba's
version and the stamp of the module's source as it is now is warm."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.schedulers._kernels import compile_note

VERSION = "0.68.1"
SHA = bytes(range(32))  # numba 0.68's stamp: the source's SHA-256
STAT = (1795792054.0059204, 12345)  # earlier releases': its (st_mtime, st_size)
STAMPS = (SHA, STAT)

# Pickle opcodes whose length field a damaged file may set to anything (BINBYTES8,
# BINUNICODE8, BINUNICODE, BINBYTES, FRAME).
LENGTHS = [b"\x8e", b"\x8d", b"X", b"B", b"\x95"]


def _numba_index(version: str, stamp: object) -> bytes:
    return pickle.dumps(version, protocol=-1) + pickle.dumps(
        (stamp, {("sig", 1): "grid.f-10.py311.1.nbc"}), protocol=-1
    )


def _fresh(tmp_path_factory, data: bytes) -> bool:
    path = tmp_path_factory.mktemp("index") / "grid._grid_lpt_sorted-30.py311.nbi"
    path.write_bytes(data)
    result = compile_note._index_is_fresh(path, VERSION, STAMPS)
    assert isinstance(result, bool)
    return result


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
@pytest.mark.slow
def test_random_bytes_are_never_fresh(tmp_path_factory, data):
    assert not _fresh(tmp_path_factory, data) or data.startswith(pickle.dumps(VERSION, protocol=-1))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(LENGTHS),
    st.sampled_from([4, 8]),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=16),
    st.booleans(),
)
@pytest.mark.slow
def test_hostile_length_fields_are_cold(tmp_path_factory, opcode, width, length, tail, after_version):
    field = struct.pack("<Q" if width == 8 else "<I", length % (2 ** (8 * width)))
    hostile = b"\x80\x05" + opcode + field + tail
    data = (pickle.dumps(VERSION, protocol=-1) + hostile) if after_version else hostile
    assert not _fresh(tmp_path_factory, data)


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=70),
    st.one_of(
        st.binary(max_size=40),
        st.just(SHA),
        st.tuples(st.floats(allow_nan=False), st.integers(0, 2**63)),
        st.just(STAT),
        st.text(max_size=40),
    ),
    st.integers(0, 200),
)
@pytest.mark.slow
def test_only_this_version_and_stamp_are_fresh(tmp_path_factory, version, stamp, cut):
    whole = _numba_index(version, stamp)
    assert _fresh(tmp_path_factory, whole) == (version == VERSION and stamp in STAMPS)
    truncated = whole[: len(pickle.dumps(version, protocol=-1)) + cut]
    assert isinstance(_fresh(tmp_path_factory, truncated), bool)


def test_numba_layout_with_this_version_and_stamp_is_fresh(tmp_path_factory):
    assert _fresh(tmp_path_factory, _numba_index(VERSION, SHA))
    assert _fresh(tmp_path_factory, _numba_index(VERSION, STAT))
    assert not _fresh(tmp_path_factory, _numba_index(VERSION, (STAT[0], STAT[1] + 1)))
