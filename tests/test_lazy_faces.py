"""The packages whose face imports its names on first use (``seqpack._lazy.lazy_exports``):
each one's ``__all__``, its table of homes and its ``TYPE_CHECKING`` imports (what type
checkers and readers see) name the same things, and every name reads as the object its home
defines."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "seqpack"
FACES = sorted(
    str(p.parent.relative_to(ROOT.parent)).replace("/", ".")
    for p in ROOT.rglob("__init__.py")
    if "lazy_exports(" in p.read_text()
)


def _type_checking_imports(package: str) -> dict[str, str]:
    tree = ast.parse((ROOT.parent / package.replace(".", "/") / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    found[alias.asname or alias.name] = imp.module
    return found


def test_the_lazy_faces_are_found():
    assert {"seqpack", "seqpack.thd", "seqpack.packing", "seqpack.mock_data"} <= set(FACES)


@pytest.mark.parametrize("package", FACES)
def test_all_homes_and_type_checking_imports_agree(package):
    module = importlib.import_module(package)
    homes = module._HOMES
    assert _type_checking_imports(package) == homes
    assert set(module.__all__) - {"__version__"} == set(homes)
    for name, home in homes.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
    assert set(homes) <= set(dir(module))


@pytest.mark.parametrize("package", FACES)
def test_an_unknown_name_is_an_attribute_error(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018
    assert not hasattr(module, "__no_such_dunder__")


def test_a_submodule_reads_as_an_attribute():
    import seqpack.thd

    assert seqpack.thd.cp is importlib.import_module("seqpack.thd.cp")
