"""The examples in docs/thd.md run as written, in order, in one namespace (each block builds
on the ones before it)."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "thd.md"


@pytest.mark.slow
def test_doc_examples_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for index, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[block {index}]", "exec"), namespace)
    assert namespace["full"].shape == namespace["batch"].input_ids.shape
