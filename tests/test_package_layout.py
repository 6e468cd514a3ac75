"""How the package is laid out: one home per name, no compatibility shims (seqpack is 0.x
and unreleased: a move is a rename recorded in CHANGELOG.md)."""

from __future__ import annotations

import importlib
import pathlib

import pytest

import seqpack

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqpack"

# Import paths that were shims before issue 30 removed them.
REMOVED = [
    "seqpack.config",
    "seqpack.wrapper",
    "seqpack.step",
    "seqpack.prefetch",
    "seqpack.resume",
    "seqpack.online",
    "seqpack.phases",
    "seqpack.timing",
    "seqpack.comm",
    "seqpack.cp",
    "seqpack.demo",
    "seqpack.progress",
    "seqpack.dist",
    "seqpack.schedulers.locality",
    "seqpack.schedulers._exact",
    "seqpack._compat",
]


@pytest.mark.parametrize("module", REMOVED)
def test_removed_import_paths_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


def test_no_module_warns_deprecation_or_serves_moved_names():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 100  # not vacuous: the package was read
    for path in sources:
        text = path.read_text()
        assert "DeprecationWarning" not in text, path
        assert "\n__getattr__ = " not in text, path  # a module-level __getattr__ serving old names


def test_the_front_door_serves_only_what_it_exports():
    for name in seqpack.__all__:
        assert getattr(seqpack, name) is not None, name
    with pytest.raises(AttributeError):
        seqpack.lognormal_lengths  # noqa: B018  (a name it served from seqpack.mock_data before)
