"""The static checks see the whole package: ruff reads every file under seqpack/."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seqpack"


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent))
    if exe is None:
        pytest.skip("ruff is not installed (pip install seqpack[lint])")
    return [exe]


def test_ruff_reads_every_file_of_the_package():
    shown = subprocess.run(
        [*_ruff(), "check", "--show-files", "seqpack"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    seen = {pathlib.Path(line.strip()).resolve() for line in shown.splitlines() if line.strip().endswith(".py")}
    every = {p.resolve() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert len(every) > 70  # not vacuous: the package has many modules
    missing = sorted(str(p.relative_to(ROOT)) for p in every - seen)
    assert not missing, f"ruff skips {missing}: an exclude pattern in pyproject.toml hides them"
