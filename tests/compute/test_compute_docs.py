"""The single-process examples in docs/compute.md and docs/gpu.md run as written."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
BLOCKS = [
    (doc, block)
    for doc in ("compute.md", "gpu.md")
    for block in re.findall(r"```python\n(.*?)```", (DOCS / doc).read_text(), flags=re.S)
]


def test_docs_have_examples():
    assert sum(doc == "compute.md" for doc, _ in BLOCKS) >= 2
    assert sum(doc == "gpu.md" for doc, _ in BLOCKS) >= 1


@pytest.mark.parametrize("index", range(len(BLOCKS)))
@pytest.mark.processes
def test_doc_example_runs(index):
    doc, code = BLOCKS[index]
    if "torchrun" in code:
        pytest.skip("multi-process example (torchrun); the same calls run in tests/distributed/test_compute_dist.py")
    exec(compile(code, f"{doc}[block {index}]", "exec"), {})


def test_gpu_doc_names_the_benchmark_flags_that_exist():
    text = (DOCS / "gpu.md").read_text()
    bench = (DOCS.parent / "benchmarks" / "gpu_step.py").read_text()
    for flag in re.findall(r"`(--[a-z-]+)`", text):
        assert flag in ("--help", "--no-build-isolation") or flag[2:].replace("-", "_") in bench, flag
