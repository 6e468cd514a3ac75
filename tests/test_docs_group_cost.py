"""docs/wrapper.md and docs/dynamic_cp.md write out what ``PackingConfig(dynamic_cp=True)``
plans with when given no ``group_cost``: the prior they state is the one the config builds."""

import pathlib
import re

import pytest

from seqpack.cost import GroupCost, model_preset
from seqpack.loader.config import PackingConfig

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
# The option's entry (wrapper.md's table row, dynamic_cp.md's item) up to the prior it states.
DEFAULT = re.compile(
    r"(?:\| `group_cost` \| `None` \||`group_cost` \(default)[^|]*?the prior `(GroupCost\.from_model\(.*?\))`", re.S
)


@pytest.mark.parametrize("doc", ["wrapper.md", "dynamic_cp.md"])
def test_the_docs_state_the_default_group_cost(doc):
    found = DEFAULT.search((DOCS / doc).read_text())
    assert found, f"docs/{doc} does not say what group_cost=None plans with"
    stated = eval(found.group(1), {"GroupCost": GroupCost, "model_preset": model_preset})
    config = PackingConfig(max_tokens_per_rank=4096, samples_per_rank=8, dynamic_cp=True)
    assert config.group_cost == stated
