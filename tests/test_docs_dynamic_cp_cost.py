"""docs/wrapper.md and docs/dynamic_cp.md write out what ``PackingConfig(dynamic_cp=True)``
plans with when given no ``cost``: the prior they state is the one the config builds."""

import pathlib
import re

import pytest

from seqpack.cost import CostModel, model_preset
from seqpack.loader.config import PackingConfig, resolved_cost

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
# The option's entry (wrapper.md's table row, dynamic_cp.md's item) up to the prior it states.
DEFAULT = re.compile(
    r"(?:\| `dynamic_cp` \| `False` \||`dynamic_cp=True` alone)[^|]*?the prior\s+`(CostModel\.from_model\(.*?\))`",
    re.S,
)


@pytest.mark.parametrize("doc", ["wrapper.md", "dynamic_cp.md"])
def test_the_docs_state_the_default_dynamic_cp_cost(doc):
    found = DEFAULT.search((DOCS / doc).read_text())
    assert found, f"docs/{doc} does not say what dynamic_cp=True without a cost plans with"
    stated = eval(found.group(1), {"CostModel": CostModel, "model_preset": model_preset})
    config = PackingConfig(max_tokens_per_rank=4096, samples_per_rank=8, dynamic_cp=True)
    assert resolved_cost(config, config.build_scheduler()) == stated
