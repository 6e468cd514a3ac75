"""The package's import graph has no cycle, and no module imports its own package's face.

Every import of ``seqpack/`` counts (module level and function level); imports under
``if TYPE_CHECKING:`` do not (they never run). ``from seqpack.a import b`` where ``b`` is a
module is an edge to ``seqpack.a.b``; Python's implicit import of a parent package is not
an edge (every package would otherwise sit in a cycle with its own modules).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seqpack"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the seqpack modules it imports explicitly."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name if is_package else name.rsplit(".", 1)[0]
                    anchor = ".".join(anchor.split(".")[: len(anchor.split(".")) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


@pytest.mark.slow
def test_the_graph_is_read():
    graph = import_graph()
    assert len(graph) > 70 and sum(len(e) for e in graph.values()) > 150  # not vacuous
    assert "seqpack.collective.groups" in graph["seqpack.collective.agree"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.slow
def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.slow
def test_no_module_imports_its_own_package_face():
    graph = import_graph()
    modules = _modules()
    bad = []
    for name, edges in graph.items():
        for target in edges:
            if modules[target].name == "__init__.py" and name.startswith(target + "."):
                bad.append(f"{name} -> {target}")  # a package above it: runs while that package initialises
    assert not bad, "modules importing their own package's __init__: " + ", ".join(sorted(bad))


_LIGHT = r"""
import json, sys
import torch  # seqpack needs torch; what torch itself imports (torch.hub imports tqdm) is not seqpack's
before = set(sys.modules)
import seqpack
print(json.dumps(sorted(set(sys.modules) - before)))
"""

# The face, the planning layers and the command line import no torch (seconds of CPU for every
# `seqpack simulate` or `doctor --warm`); the names that need it import it on first use.
_NO_TORCH = r"""
import json, sys
import seqpack, seqpack.schedulers, seqpack.cost, seqpack.stats, seqpack.cli.app, seqpack.cli.warm
import seqpack.thd.padding, seqpack.thd.static_shapes, seqpack.mock_data
before = "torch" in sys.modules
seqpack.Schedule, seqpack.StaticShapes, seqpack.pad_multiple_for, seqpack.thd.padded_lengths
print(json.dumps([before, "torch" in sys.modules, type(seqpack.PackedBatch).__name__, "torch" in sys.modules]))
"""


@pytest.mark.processes
def test_the_face_the_schedulers_and_the_cli_import_no_torch():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True, check=True, timeout=300)
    before, after_planning_names, batch_type, after_batch = json.loads(out.stdout.strip().splitlines()[-1])
    assert not before and not after_planning_names
    assert batch_type == "type" and after_batch  # not vacuous: a torch name still imports torch when read


@pytest.mark.processes
def test_import_seqpack_stays_light():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LIGHT], capture_output=True, text=True, check=True, timeout=300)
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    added = {m.split(".")[0] for m in modules}
    assert "seqpack" in added  # not vacuous
    heavy = added & {"pyarrow", "matplotlib", "rich", "tqdm", "pandas", "transformers", "datasets"}
    assert not heavy, f"import seqpack imports {sorted(heavy)}: import them where they are used"
    # torch.distributed.checkpoint alone costs about a second, as long as seqpack's own import
    heavy_torch = {m for m in modules if m.startswith("torch.distributed.checkpoint")}
    assert not heavy_torch, f"import seqpack imports {sorted(heavy_torch)[:3]}"
