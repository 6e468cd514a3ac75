"""The examples in docs/packing.md run as written, in order, in one namespace."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "packing.md"


def test_doc_examples_run_in_order():
    pytest.importorskip("datasets")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    for index, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[block {index}]", "exec"), namespace)
    assert namespace["packing"].num_packs == 3
