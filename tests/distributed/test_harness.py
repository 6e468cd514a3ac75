import pytest
import torch
import torch.distributed as dist
from harness import RankFailure


def _allreduce_rank():
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t)
    return int(t), dist.get_world_size()


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("bad input on rank 1")
    return dist.get_rank()


def test_pool_runs_collectives(dist_pools):
    assert dist_pools.get(4).run(_allreduce_rank) == [(10, 4)] * 4


def test_pool_reports_failing_rank_and_keeps_serving(dist_pools):
    pool = dist_pools.get(2)
    with pytest.raises(RankFailure) as info:
        pool.run(_fail_on_rank_one)
    assert set(info.value.errors) == {1}
    assert "bad input on rank 1" in str(info.value)
    assert pool.run(_allreduce_rank) == [(3, 2)] * 2
