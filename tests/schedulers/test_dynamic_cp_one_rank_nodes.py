"""Dynamic CP with groups of any size on nodes of one rank (``ranks_per_node=1``): the
node layout placed single-rank groups twice, and in a round whose groups filled every rank
it searched for a free rank past the last one (issue 39)."""

import numpy as np
import pytest
from dynamic_cp_reference import (
    check_plan_reference,
    layout_in_nodes_reference,
    layout_reference,
    plan_dcp,
    rounds_within,
)
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.schedulers._kernels import cp_planner as _kernels

LENGTHS = [900, 500, 300, 120, 90, 60, 30, 20, 10, 5]


@pytest.mark.slow
def test_plans_on_one_rank_nodes_keep_every_group_in_the_ranks():
    cost = CostModel(0.1, 0.01, 0.0, ring_step=0.5, ring_token=0.05, ranks_per_node=1, reference_size=1)
    for sync in ("lockstep", "replica"):
        for _ in range(3):  # repeated plans aborted the process ("double free or corruption")
            plan = plan_dcp(LENGTHS, dp_size=4, cp_size=2, max_tokens_per_rank=128, cost=cost, sync=sync,
                            group_sizes="any")  # fmt: skip
            check_plan_reference(plan, LENGTHS, 8, 128, 1, aligned=False)
    assert (plan.group_size == 1).any() and (plan.group_size > 1).any()  # singles beside wider groups


@pytest.mark.kernels
@pytest.mark.slow
@given(groups=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), max_size=24), ranks=st.integers(1, 12))
def test_node_layout_on_one_rank_nodes_is_the_plain_layout(groups, ranks):
    rnd, size = rounds_within(groups, ranks)
    rnd_a, size_a = np.array(rnd, dtype=np.int64), np.array(size, dtype=np.int64)
    order = np.lexsort((np.arange(len(size)), -size_a, rnd_a))
    start = _kernels.layout_in_nodes(order, rnd_a, size_a, 1, ranks)
    assert start.tolist() == layout_in_nodes_reference(rnd, size, 1, ranks) == layout_reference(rnd, size)


@pytest.mark.kernels
def test_full_round_of_a_group_and_single_ranks():
    rnd, size = np.zeros(3, dtype=np.int64), np.array([2, 1, 1])
    order = np.lexsort((np.arange(3), -size, rnd))
    assert _kernels.layout_in_nodes(order, rnd, size, 1, 4).tolist() == [0, 2, 3]
