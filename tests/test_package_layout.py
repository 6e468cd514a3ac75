"""How the package is laid out: one home per name, no compatibility shims (seqpack is 0.x
and unreleased: a move is a rename recorded in CHANGELOG.md)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import seqpack

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqpack"

# Basenames that several modules share because they mean the same thing in each place.
SHARED_BASENAMES = {
    "__init__.py": "a package",
    "base.py": "the base classes of a family (schedulers, calibrators)",
    "scheduler.py": "the scheduler class of a scheduler family (balanced, dynamic_cp)",
    "stats.py": "step statistics; under cli/commands/ every module is named after its subcommand",
}


def test_no_module_basename_names_two_things():
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert len(seen) > 100  # not vacuous: the package was read
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1 and name not in SHARED_BASENAMES}
    assert not repeated, f"one basename, two meanings: {repeated}"


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


def _layers() -> dict[str, int]:
    """The layer of every top-level module or subpackage, as ``seqpack/__init__``'s docstring
    declares them."""
    assert seqpack.__doc__ is not None
    found = re.findall(r"^ {4}(\d+)\. (.+)$", seqpack.__doc__, flags=re.M)
    assert [int(n) for n, _ in found] == list(range(1, len(found) + 1))
    return {name.strip(): int(n) for n, names in found for name in names.split(",")}


def _unit(module: str) -> str | None:
    """The top-level module or subpackage of seqpack that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "seqpack" and len(parts) > 1 else None


def _runtime_imports(path: pathlib.Path) -> set[str]:
    """Every module the seqpack module at ``path`` imports at run time (:func:`_imports`)."""
    return _imports(path.read_text(), list(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]))


def _imports(source: str, package: list[str]) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports at run time, function-level
    included, ``if TYPE_CHECKING:`` blocks excluded (``from a import b`` gives ``a`` and ``a.b``)."""
    tree = ast.parse(source)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


@pytest.mark.slow
def test_subpackages_import_only_the_layers_below():
    layers = _layers()
    units = {p.stem if p.parent == PACKAGE else p.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py")}
    units.discard("__init__")
    assert units == set(layers), f"declare every subpackage in a layer: {sorted(units ^ set(layers))}"
    edges = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue
        here = path.stem if path.parent == PACKAGE else path.relative_to(PACKAGE).parts[0]
        for module in _runtime_imports(path):
            there = _unit(module)
            if there is None or there == here or there not in layers:
                continue
            edges += 1
            assert layers[there] < layers[here], (
                f"{path.relative_to(PACKAGE.parent)} imports {module}: layer {layers[there]} ({there}) is not "
                f"below layer {layers[here]} ({here})"
            )
    assert edges > 100  # not vacuous: the imports were read


def test_the_layer_check_reads_function_level_and_relative_imports_not_typing_ones():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from seqpack.loader import Step\n"
        "def f():\n    from seqpack.cli import main\n"
        "from ..cost import CostModel\n"
    )
    imported = _imports(source, ["seqpack", "thd"])
    assert {"seqpack.cli", "seqpack.cost.CostModel"} <= imported and "seqpack.loader" not in imported
