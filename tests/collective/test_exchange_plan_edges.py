"""The pure parts of seqpack.collective without process groups: plan_shard_exchange refuses
inputs that leave the plane and plans, at cp_size=1, what a loop over the ids gives; the group
helpers refuse to build groups without torch.distributed and never raise when freeing them."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from seqpack import Topology
from seqpack.collective.exchange import plan_shard_exchange
from seqpack.collective.groups import all_gather_objects, destroy_groups, new_axis_groups
from seqpack.errors import ConfigError


def _plan(start, size, tokens, origin, *, cp_size=1, num_ranks=2, rank=0):
    return plan_shard_exchange(np.array(start), np.array(size), np.array(tokens), np.array(origin), cp_size=cp_size,
                               num_ranks=num_ranks, rank=rank)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0, 1], [1, 1], [5, 5], [0]), {}, r"start, size, tokens and origin must have one entry per id"),
        (([0], [1], [5], [0]), {"rank": 2}, r"rank=2 is out of range for 2 plane ranks"),
        (([0], [1], [5], [0]), {"rank": -1}, r"rank=-1 is out of range for 2 plane ranks"),
        (([1], [2], [5], [0]), {}, r"a group reaches outside the 2 plane ranks"),
        (([-1], [1], [5], [0]), {}, r"a group reaches outside the 2 plane ranks"),
        (([0], [1], [5], [2]), {}, r"origin holds DP ranks outside 0\.\.1"),
        (([0], [1], [5], [1]), {"cp_size": 2}, r"origin holds DP ranks outside 0\.\.0"),
    ],
)  # fmt: skip
def test_inputs_that_leave_the_plane_are_refused_naming_it(args, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _plan(*args, **kwargs)


@pytest.mark.parametrize("seed", range(6))
def test_at_cp_1_each_id_moves_from_its_origin_to_its_rank_unless_they_are_one(seed):
    rng = np.random.default_rng(seed)
    ranks, n = int(rng.integers(1, 5)), int(rng.integers(0, 30))
    origin = rng.integers(0, ranks, n)
    start = rng.integers(0, ranks, n)
    size = np.where(rng.random(n) < 0.2, -1, 1)  # some not assigned: they go nowhere
    tokens = rng.integers(1, 100, n)
    moved = sum(int(tokens[i]) for i in range(n) if size[i] > 0 and origin[i] != start[i])
    for rank in range(ranks):
        plan = _plan(start, size, tokens, origin, num_ranks=ranks, rank=rank)
        for peer in range(ranks):
            send = [i for i in range(n) if size[i] > 0 and origin[i] == rank and start[i] == peer != rank]
            recv = [i for i in range(n) if size[i] > 0 and start[i] == rank and origin[i] == peer != rank]
            assert plan.send_ids[peer].tolist() == send and plan.recv_ids[peer].tolist() == recv
            assert plan.send_tokens[peer] == sum(int(tokens[i]) for i in send)
            assert plan.recv_tokens[peer] == sum(int(tokens[i]) for i in recv)
        keep = [i for i in range(n) if size[i] > 0 and origin[i] == start[i] == rank]
        assert plan.keep_ids.tolist() == keep and plan.moved_tokens == moved


def test_axis_groups_need_torch_distributed_when_an_axis_is_split():
    assert new_axis_groups(Topology.single()) == {"dp": None, "cp": None, "tp": None, "pp": None}
    split = Topology(dp_size=2, cp_size=2, groups={"dp": "G", "cp": "H"})
    assert new_axis_groups(split, axes=("tp",)) == {"dp": None, "cp": None, "tp": None, "pp": None}  # none to make
    with pytest.raises(ConfigError, match=r"new_axis_groups needs torch.distributed to be initialised"):
        new_axis_groups(split)


def test_one_rank_gathers_its_own_object_and_freeing_a_bad_group_only_logs(caplog):
    obj = {"lengths": [3, 1]}
    assert all_gather_objects(obj, None) == [obj]
    with caplog.at_level(logging.DEBUG, logger="seqpack.collective.groups"):
        destroy_groups([None, object()])  # not a group (or torch.distributed torn down): never raises
    assert "could not destroy a process group" in caplog.text
