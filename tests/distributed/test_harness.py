import pytest
import torch
import torch.distributed as dist
from harness import RankFailure, run_script


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


_SCRIPT = """
import sys
import torch.distributed as dist

dist.init_process_group("gloo")  # env://, as under torchrun
total = dist.get_world_size()
print(f"rank {dist.get_rank()} of {total}, args {sys.argv[1:]}, main {__name__}")
if "--fail" in sys.argv and dist.get_rank() == 1:
    raise ValueError("rank 1 was told to fail")
dist.destroy_process_group()
"""


def test_run_script_starts_ranks_as_torchrun_does_and_names_the_failing_rank(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    out = run_script(str(script), ["--x", "1"], nproc=3)
    assert out.splitlines() == [f"rank {r} of 3, args ['--x', '1'], main __main__" for r in range(3)]
    with pytest.raises(AssertionError) as info:
        run_script(str(script), ["--fail"], nproc=2)
    assert "failed on 1 of 2 ranks" in str(info.value) and "--- rank 1: exit code 1" in str(info.value)
    assert "rank 1 was told to fail" in str(info.value) and "--- rank 0" not in str(info.value)


PRELOADED = ["harness", "forkserver_preload", "torch.distributed.fsdp", "numba"]


def _preloaded():
    import sys

    return [name for name in PRELOADED if name in sys.modules]


def test_the_fork_server_preloads_what_every_process_would_import(dist_pools):
    """The pool's workers start from a fork server that imported these (harness.context):
    a preload module it could not import would be skipped without a word."""
    assert dist_pools.get(2).run(_preloaded) == [PRELOADED] * 2
