"""What the wrapper's construction agreement compares with validate_ranks=False (gloo, dp=2):
the settings every rank's plan and collectives are computed from. Ranks that differ in one of
them got a crash or a hang in the first step's exchange (rank 1 SIGABRT in gloo, rank 0 a raw
gloo error); now one ConfigError on every rank names the setting and each rank's value."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from wrapper_data import items, mesh_topology

from seqpack.loader import wrap_data_iterator

DP2 = (("dp", 2),)
SETTINGS = {
    "samples_per_rank": 6,
    "max_tokens_per_rank": 48,
    "pad_multiple": 4,
    "scheduler": "balanced",
    "validate_ranks": False,
}


def differing(field: str, values: tuple, prefetch: int) -> str:
    topology = mesh_topology(DP2)
    settings = {**SETTINGS, field: values[dist.get_rank()]}
    try:
        it = wrap_data_iterator(items(3, topology.dp_rank, 24), topology, prefetch=prefetch, **settings)
        with it:
            steps = [step.num_microbatches for step in it]
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    assert steps  # the wrapper ran
    return "ok"


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize(
    "field, values, shown",
    [
        ("max_tokens_per_rank", (48, 64), "max_tokens_per_rank: 48 on dp rank 0, 64 on dp rank 1"),
        ("pad_multiple", (4, 8), "pad_multiple: 4 on dp rank 0, 8 on dp rank 1"),
        ("scheduler", ("balanced", "empty"), "scheduler: balanced on dp rank 0, empty on dp rank 1"),
    ],
)
def test_settings_every_plan_depends_on_are_compared_without_validate_ranks(dist_pools, field, values, shown, prefetch):
    outcomes = dist_pools.get(2).run(differing, field, values, prefetch, timeout=60)
    assert outcomes[0] == outcomes[1], outcomes  # one error, the same on every rank
    assert outcomes[0].startswith("ConfigError: ranks of the dp group disagree on wrapper arguments: "), outcomes[0]
    assert shown in outcomes[0], outcomes[0]


def test_ranks_that_differ_in_validate_ranks_get_one_error(dist_pools):
    outcomes = dist_pools.get(2).run(differing, "validate_ranks", (True, False), 0, timeout=60)
    assert outcomes[0] == outcomes[1], outcomes
    assert "validate_ranks: True on dp rank 0, False on dp rank 1" in outcomes[0], outcomes[0]


def test_ranks_may_still_differ_in_what_no_plan_depends_on(dist_pools):
    # samples_per_rank: every rank reads its own count and the length gather carries it.
    assert dist_pools.get(2).run(differing, "samples_per_rank", (6, 7), 0) == ["ok", "ok"]
