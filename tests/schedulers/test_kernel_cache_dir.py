"""seqpack.schedulers._kernels.cache_dir looks where numba caches: NUMBA_CACHE_DIR, else
``__pycache__`` beside the sources when writable, else numba's user-wide cache, whose folder
on Linux, macOS and Windows is numba's own appdirs answer (checked against numba itself)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from numba.core.caching import UserWideCacheLocator
from numba.misc import appdirs

from seqpack.schedulers import _kernels


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32"])
@pytest.mark.parametrize("xdg", [None, "xdg"])
def test_the_user_wide_cache_is_numbas_on_each_platform(platform, xdg, monkeypatch, tmp_path):
    monkeypatch.setattr(appdirs, "system", platform)  # what numba read from sys.platform
    monkeypatch.setattr(_kernels.sys, "platform", platform)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    monkeypatch.setattr(appdirs, "_get_win_folder", lambda name: os.environ["LOCALAPPDATA"], raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / xdg))
    expected = Path(appdirs.AppDirs(appname="numba", appauthor=False).user_cache_dir)
    assert _kernels._user_cache() == expected
    assert str(expected).startswith(str(tmp_path))  # not the real home: the test reads what it set


def test_sources_in_a_folder_no_one_may_write_are_cached_in_numbas_user_wide_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sources = tmp_path / "site" / "kernels"
    sources.mkdir(parents=True)
    assert _kernels.cache_dir(sources) == sources / "__pycache__"  # writable: beside the sources
    monkeypatch.setattr(_kernels.os, "access", lambda path, mode: False)  # a read-only install
    subfolder = UserWideCacheLocator.get_suitable_cache_subpath(str(sources / "bin_search.py"))
    assert _kernels.cache_dir(sources) == _kernels._user_cache() / subfolder
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert _kernels.cache_dir(sources) == tmp_path / "numba" / subfolder  # numba's folder per source folder
