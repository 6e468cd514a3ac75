"""Docs are code: every repository path, file name and dotted ``seqpack`` name that README.md
and docs/ cite must exist. A path is looked up from the repository's root; a bare file name
(``test_origin_dist.py``) must name some file of the repository; a dotted name is imported
module by module, then looked up attribute by attribute."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_PATH = re.compile(r"(?<![\w/.-])((?:seqpack|tests|benchmarks|examples|docs|\.ci)/[\w/.-]*[\w/])")
_FILE = re.compile(r"(?<![\w/.-])(\w+\.(?:py|md|sh|json|toml))\b")
_DOTTED = re.compile(r"(?<![\w/.-])(seqpack(?:\.\w+)+)")
# Text that names what is not the repository's: addresses, a shell session's lines (the
# user's own files), other projects' paths.
_ELSEWHERE = re.compile(
    r"https?://\S+|^\$ .*$|`[^`]*(?:megatron|verl|transformer_engine|torchtitan|trl|transformers)/[^`]*`", re.M
)
_WIRE_VERSION = re.compile(r"wire format,? (?:version )?(\d+)|format version (\d+)")


def citations(text: str) -> tuple[set[str], set[str], set[str]]:
    """The (paths, bare file names, dotted names) one document cites."""
    text = _ELSEWHERE.sub(" ", text)
    paths = {p.rstrip("./") for p in _PATH.findall(text)}
    files = {f for f in _FILE.findall(text) if not any(p.endswith("/" + f) or p == f for p in paths)}
    dotted = {d.rstrip(".") for d in _DOTTED.findall(text)}
    return paths, files, dotted


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or an attribute reached from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


_REPO_FILES = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
# Files a doc names that the project makes or expects, not files of the repository.
_NOT_OURS = {"sitecustomize.py", "pyproject.toml"}


def test_citations_are_read():
    text = "see `seqpack/thd/pack.py`, tests/x.py, pack.py, layout.py and seqpack.thd.PackedBatch.\n$ cp a.json b.py"
    paths, files, dotted = citations(text)
    assert paths == {"seqpack/thd/pack.py", "tests/x.py"}
    assert files == {"layout.py"}
    assert dotted == {"seqpack.thd.PackedBatch"}
    assert resolves("seqpack.thd.PackedBatch") and not resolves("seqpack.thd.NoSuchName")
    assert not resolves("seqpack.no_such_module")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_name_exists(doc):
    paths, files, dotted = citations(doc.read_text())
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    missing += [f for f in sorted(files) if f not in _REPO_FILES and f not in _NOT_OURS]
    missing += [d for d in sorted(dotted) if not resolves(d)]
    assert not missing, f"{doc.name} cites what does not exist: {missing}"


def test_wire_version_cited_is_the_wire_version():
    from seqpack.collective.wire import FORMAT_VERSION

    cited = {
        (doc.name, int(a or b))
        for doc in DOCS
        for a, b in _WIRE_VERSION.findall(doc.read_text())
        if int(a or b) != FORMAT_VERSION
    }
    assert not cited, f"docs cite a wire format version other than {FORMAT_VERSION}: {sorted(cited)}"
