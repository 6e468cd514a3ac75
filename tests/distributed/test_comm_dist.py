"""seqpack.collective pieces on their own, and Topology constructors, over gloo (4 ranks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from harness import TASK_CACHE
from torch.distributed.device_mesh import init_device_mesh
from wrapper_data import batch_arrays

from seqpack.collective import (
    Status,
    StepEnd,
    StepOk,
    agree,
    broadcast_pp,
    broadcast_tp,
    gather_lengths,
)
from seqpack.schedulers import get_scheduler
from seqpack.thd import pack_sequences, pad_multiple_for, padding_only_batch
from seqpack.thd.cp import shard_for_cp
from seqpack.topology import Topology

_CACHE = TASK_CACHE


def _cached(key, build):
    # Groups are created once per pool task, in the same order on every rank.
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def _dp4() -> Topology:
    return _cached("dp4", lambda: Topology.from_device_mesh(init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))))


# --- gather_lengths --------------------------------------------------------------------------


def gather_uneven(error_rank):
    rank = dist.get_rank()
    lengths = [10 * rank + i + 1 for i in range((3, 1, 0, 2)[rank])]
    error = f"rank {rank} saw a bad sample" if rank == error_rank else None
    try:
        columns = np.array([[2 * n, rank] for n in lengths], dtype=np.int64).reshape(len(lengths), 2)
        got = gather_lengths(lengths, _dp4().group("dp"), error=error, extras=[rank * 7, 1], columns=columns)
    except ValueError as exc:
        return str(exc)
    return got.lengths.tolist(), got.counts.tolist(), got.extras.tolist(), got.origin().tolist(), got.columns.tolist()


def test_gather_lengths_in_global_order_with_an_empty_rank(dist_pools):
    results = dist_pools.get(4).run(gather_uneven, None)
    assert all(r == results[0] for r in results)
    lengths, counts, extras, origin, columns = results[0]
    assert lengths == [1, 2, 3, 11, 31, 32] and counts == [3, 1, 0, 2]
    assert extras == [[0, 1], [7, 1], [14, 1], [21, 1]]
    assert origin == [0, 0, 0, 1, 3, 3]
    assert columns == [[2 * n, r] for n, r in zip(lengths, origin, strict=True)]  # each sample's row, in global order


def test_gather_lengths_error_reaches_every_rank(dist_pools):
    assert dist_pools.get(4).run(gather_uneven, 2) == ["rank 2 saw a bad sample"] * 4


# --- agree ---------------------------------------------------------------------------------


def agree_cases():
    group = _dp4().group("dp")
    rank = dist.get_rank()
    out = [agree(Status.END if rank == 3 else Status.OK, None, group)]
    out.append(agree(Status.ERROR if rank in (1, 2) else Status.END, f"from {rank}", group))
    out.append(agree(Status.OK, None, group, fingerprint=5 if rank == 2 else 4, axis="dp"))
    out.append(agree(Status.OK, None, group, fingerprint=None if rank == 0 else 9))
    return [(int(r.status), r.message if r.status == Status.ERROR else None) for r in out]


def test_agree(dist_pools):
    results = dist_pools.get(4).run(agree_cases)
    assert all(r == results[0] for r in results)
    end, error, mismatch, partial = results[0]
    assert end == (Status.END, None)
    assert error == (Status.ERROR, "from 1")  # the lowest failing rank's message
    assert mismatch[0] == Status.ERROR
    assert (
        mismatch[1] == "ranks of the dp group disagree on schedules "
        "(fingerprints dp rank 0: 4, dp rank 1: 4, dp rank 2: 5, dp rank 3: 4)"
    )
    assert partial == (Status.OK, None)  # ranks without a fingerprint do not count


# --- TP / PP broadcast -----------------------------------------------------------------------


def _message(cp, cp_rank, tokens=True, positions=False):
    lengths = np.array([5, 9, 3, 12, 7, 1], dtype=np.int64)
    pm = pad_multiple_for(cp)
    schedule = get_scheduler("empty").schedule(
        lengths,
        dp_size=2,
        cp_size=cp,
        max_tokens_per_rank=12 // cp * 2,
        pad_multiple=pm,
        origin=np.array([0, 0, 0, 0, 1, 1]),
    )
    batches = []
    for row in schedule.assignment:
        ids = row[0]
        samples = [
            {
                "input_ids": torch.arange(int(n)) + 7 * int(g),
                **({"position_ids": torch.arange(int(n)) * 2} if positions else {}),
            }
            for g, n in zip(ids, lengths[ids], strict=True)
        ]
        batch = pack_sequences(samples, pad_multiple=pm, sample_ids=ids) if ids.size else padding_only_batch(pm)
        batches.append(shard_for_cp(batch, cp, cp_rank))
    # The counts ride the TP and PP headers (flag 4); the step's is any int here.
    return StepOk(
        step=4,
        schedule=schedule,
        microbatches=batches,
        empty_samples=1,
        position_ids=positions,
        num_loss_tokens=sum(b.num_loss_tokens for b in batches),
    )


def broadcast_case(positions):
    topo = _cached(
        "cp2tp2", lambda: Topology.from_device_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp")))
    )
    src = _message(2, topo.cp_rank, positions=positions) if topo.tp_rank == 0 else None
    got = broadcast_tp(src, topo.group("tp"))
    pp = _cached("pp4", lambda: Topology.from_device_mesh(init_device_mesh("cpu", (4,), mesh_dim_names=("pp",))))
    first = _message(1, 0, positions=positions) if pp.is_first_stage else None
    layout = broadcast_pp(first, pp.group("pp"), decode=pp.pp_rank != 3)
    end = broadcast_tp(StepEnd(9, dropped_at_end=5) if topo.tp_rank == 0 else None, topo.group("tp"))
    return (
        topo.cp_rank,
        [batch_arrays(b) for b in got.microbatches],
        got.schedule.fingerprint(),
        None if layout is None else [batch_arrays(b) for b in layout.microbatches],
        (end.status, end.step, end.dropped_at_end),
    )


@pytest.mark.parametrize("positions", [False, True])
def test_tp_and_pp_broadcast(dist_pools, positions):
    results = dist_pools.get(4).run(broadcast_case, positions)
    for cp_rank, batches, fp, _, end in results:
        reference = _message(2, cp_rank, positions=positions)
        assert fp == reference.schedule.fingerprint()
        assert end == (Status.END, 9, 5)
        assert len(batches) == len(reference.microbatches) > 1
        for got, want in zip(batches, reference.microbatches, strict=True):
            want = batch_arrays(want)
            for name, value in want.items():
                assert np.array_equal(value, got[name]) if isinstance(value, np.ndarray) else value == got[name], name
    first_stage = [batch_arrays(b) for b in _message(1, 0, positions=positions).microbatches]
    for rank, (_, _, _, layout, _) in enumerate(results):
        if rank == 3:
            assert layout is None  # took part without decoding
            continue
        for got, want in zip(layout, first_stage, strict=True):
            for name, value in want.items():
                if name in ("input_ids", "labels", "loss_mask"):
                    assert (got[name] is None) == (rank != 0)
                elif name != "dtypes":
                    assert np.array_equal(value, got[name]) if isinstance(value, np.ndarray) else value == got[name], (
                        name
                    )


# --- Topology constructors over real groups ---------------------------------------------------


def topology_cases():
    mesh_topo = _cached(
        "dp2cp2", lambda: Topology.from_device_mesh(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp")))
    )

    # The same grid from framework-owned groups (Megatron style): every rank creates every group.
    def build():
        dp_groups = [([0, 2], dist.new_group([0, 2])), ([1, 3], dist.new_group([1, 3]))]
        cp_groups = [([0, 1], dist.new_group([0, 1])), ([2, 3], dist.new_group([2, 3]))]
        return dp_groups, cp_groups

    dp_groups, cp_groups = _cached("groups", build)
    rank = dist.get_rank()
    mine = lambda groups: next(g for ranks, g in groups if rank in ranks)  # noqa: E731
    other = lambda groups: next(g for ranks, g in groups if rank not in ranks)  # noqa: E731
    from_groups = Topology.from_groups(dp=mine(dp_groups), cp=mine(cp_groups))
    out = {
        "mesh": mesh_topo.signature(),
        "groups": from_groups.signature(),
        "cp_peers": from_groups.global_ranks("cp"),
        "mesh_cp_peers": mesh_topo.global_ranks("cp"),
    }
    errors = []
    for kwargs in ({"dp": mine(cp_groups), "cp": mine(cp_groups)}, {"dp": mine(dp_groups)}, {"dp": other(dp_groups)}):
        try:
            Topology.from_groups(**kwargs)
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    mesh = _cached("mesh_other", lambda: init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "cp")))
    try:
        Topology.from_device_mesh(mesh)
    except ValueError as exc:
        out["unnamed"] = str(exc)
    out["mapped"] = Topology.from_device_mesh(mesh, axis_names={"dp": "data"}).signature()
    return out


def test_topology_from_groups_matches_the_mesh(dist_pools):
    results = dist_pools.get(4).run(topology_cases)
    for rank, r in enumerate(results):
        assert r["groups"] == r["mesh"] == r["mapped"]
        assert r["mesh"]["dp_size"] == r["mesh"]["cp_size"] == 2
        assert r["cp_peers"] == r["mesh_cp_peers"] and rank in r["cp_peers"]
        overlap, missing_world, foreign = r["errors"]
        assert "share ranks" in overlap and "must meet only in this rank" in overlap
        assert missing_world == "dp(2) * cp(1) * tp(1) * pp(1) = 2 != world_size(4)"
        assert f"the dp group does not contain this rank ({rank})" in foreign
        assert "mesh dim 'data' is not one of dp, cp, tp, pp nor a data-parallel dim" in r["unnamed"]
