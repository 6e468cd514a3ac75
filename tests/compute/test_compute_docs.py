"""The single-process examples in docs/compute.md run as written."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "compute.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_doc_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index):
    code = BLOCKS[index]
    if "torchrun" in code:
        pytest.skip("multi-process example (torchrun); the same calls run in tests/distributed/test_compute_dist.py")
    exec(compile(code, f"{DOC.name}[block {index}]", "exec"), {})
