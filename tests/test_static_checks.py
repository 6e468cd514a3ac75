"""The static checks see the whole project: ruff reads every file under seqpack/, tests/,
benchmarks/ and examples/ (the folders .ci/run lints)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seqpack"
LINTED = ("seqpack", "tests", "benchmarks", "examples")  # as in .ci/run


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent))
    if exe is None:
        pytest.skip("ruff is not installed (pip install seqpack[lint])")
    return [exe]


@pytest.mark.processes
def test_ruff_reads_every_file_ci_lints():
    shown = subprocess.run(
        [*_ruff(), "check", "--show-files", *LINTED], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    seen = {pathlib.Path(line.strip()).resolve() for line in shown.splitlines() if line.strip().endswith(".py")}
    every = {p.resolve() for d in LINTED for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts}
    assert len(every) > 200 and len([p for p in every if PACKAGE in p.parents]) > 70  # not vacuous
    missing = sorted(str(p.relative_to(ROOT)) for p in every - seen)
    assert not missing, f"ruff skips {missing}: an exclude pattern in pyproject.toml hides them"


def test_ci_lints_every_python_folder():
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("ruff check", "ruff format --check"):
        line = next(line for line in ci.splitlines() if command in line)
        assert all(f" {d}" in line for d in LINTED), (command, line)
    folders = {
        d.name
        for d in ROOT.iterdir()
        if d.is_dir() and not d.name.startswith(".") and d.name not in ("build", "dist") and any(d.rglob("*.py"))
    }
    assert folders <= set(LINTED), f"python folders not linted by .ci/run: {sorted(folders - set(LINTED))}"
