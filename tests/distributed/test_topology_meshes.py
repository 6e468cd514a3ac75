"""Topology.from_device_mesh on the meshes torchtitan and NeMo Automodel build, taken as they
are, and Topology.single() under an initialised process group (gloo, 2 and 4 ranks).

The meshes are built here the way those frameworks build them (facts read from their code):
- torchtitan ``ParallelDims`` (2025): one mesh over the enabled dims of
  (pp, dp_replicate, dp_shard, cp, tp), size-1 dims left out; then the flattened ``dp``
  (dp_replicate x dp_shard, data loading), ``dp_shard_cp`` (FSDP) and ``dp_cp`` (loss). With
  expert parallelism dp_shard is split into ``dp_shard_mod_ep`` x ``dp_shard_in_ep``.
- torchtitan (2026): a 1-D ``world`` mesh unflattened into views, among them the data-loading
  mesh (pp, batch, cp, tp).
- NeMo Automodel FSDP2: always the 5-D (pp, dp_replicate, dp_shard, cp, tp), size-1 dims
  kept, with flattened ``dp``, ``dp_shard_cp``, ``dp_cp``; Megatron-FSDP: (dp, cp, tp) with
  ``dp_cp``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from seqpack.loader import wrap_data_iterator
from seqpack.options import AXES
from seqpack.topology import Topology


def _titan_2025(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1):
    sizes = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
    enabled = {name: size for name, size in sizes.items() if size > 1}
    mesh = init_device_mesh("cpu", tuple(enabled.values()), mesh_dim_names=tuple(enabled))
    flat = {
        "dp": [d for d in ("dp_replicate", "dp_shard") if d in enabled],
        "dp_shard_cp": [d for d in ("dp_shard", "cp") if d in enabled],
        "dp_cp": [d for d in ("dp_replicate", "dp_shard", "cp") if d in enabled],
    }
    for name, dims in flat.items():
        if dims:
            mesh[tuple(dims)]._flatten(mesh_dim_name=name)
    return mesh


def _titan_2025_ep(dp_shard_mod_ep, dp_shard_in_ep):
    names = ("dp_shard_mod_ep", "dp_shard_in_ep")
    mesh = init_device_mesh("cpu", (dp_shard_mod_ep, dp_shard_in_ep), mesh_dim_names=names)
    mesh[names]._flatten(mesh_dim_name="dp")
    mesh[names]._flatten(mesh_dim_name="dp_shard_cp")
    mesh[("dp_shard_in_ep",)]._flatten(mesh_dim_name="ep")
    return mesh


def _titan_2026_dataloading(pp, batch, cp, tp):
    world = init_device_mesh("cpu", (pp * batch * cp * tp,), mesh_dim_names=("world",))
    return world, world._unflatten(0, (pp, batch, cp, tp), ("pp", "batch", "cp", "tp"))


def _nemo_fsdp2(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1):
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    mesh = init_device_mesh("cpu", (pp, dp_replicate, dp_shard, cp, tp), mesh_dim_names=names)
    for name, dims in (
        ("dp", ("dp_replicate", "dp_shard")),
        ("dp_shard_cp", ("dp_shard", "cp")),
        ("dp_cp", ("dp_replicate", "dp_shard", "cp")),
    ):
        mesh[dims]._flatten(mesh_dim_name=name)
    return mesh


def _nemo_megatron_fsdp(dp, cp, tp):
    mesh = init_device_mesh("cpu", (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
    if cp > 1:
        mesh[("dp", "cp")]._flatten(mesh_dim_name="dp_cp")
    return mesh


def _read(topology: Topology, mesh) -> dict:
    out = {"signature": topology.signature(), "ranks": {a: topology.global_ranks(a) for a in AXES}}
    flattened = getattr(mesh._get_root_mesh(), "_flatten_mapping", {})
    dp_dims = [d for d in mesh.mesh_dim_names if d.startswith("dp_") and mesh[d].size() > 1]
    if "dp" in flattened and len(dp_dims) > 1:  # DP spans several dims the framework flattened
        out["uses_mesh_dp_group"] = topology.group("dp") is flattened["dp"].get_group()
    return out


UNFLATTENED = ("dp_replicate", "dp_shard", "cp")  # no flattened dp: seqpack flattens it


def mesh_cases() -> dict:
    rank = dist.get_rank()
    out = {"rank": rank}
    for name, build in (
        ("titan_hsdp", lambda: _titan_2025(dp_replicate=2, dp_shard=2)),
        ("titan_fsdp_cp", lambda: _titan_2025(dp_shard=2, cp=2)),
        ("titan_fsdp_tp", lambda: _titan_2025(dp_shard=2, tp=2)),
        ("titan_pp_fsdp", lambda: _titan_2025(pp=2, dp_shard=2)),
        ("titan_ep", lambda: _titan_2025_ep(2, 2)),
        ("nemo_hsdp", lambda: _nemo_fsdp2(dp_replicate=2, dp_shard=2)),
        ("nemo_fsdp_cp", lambda: _nemo_fsdp2(dp_shard=2, cp=2)),
        ("nemo_megatron_fsdp", lambda: _nemo_megatron_fsdp(2, 2, 1)),
        ("unflattened_hsdp", lambda: init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=UNFLATTENED)),
    ):
        mesh = build()
        out[name] = _read(Topology.from_device_mesh(mesh), mesh)
    world, loading = _titan_2026_dataloading(1, 2, 2, 1)
    out["titan_2026_loading"] = _read(Topology.from_device_mesh(loading), loading)
    errors = {}
    folded = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard_cp"))
    for label, mesh in (("world", world), ("folded", folded)):
        try:
            Topology.from_device_mesh(mesh)
            errors[label] = None
        except ValueError as exc:
            errors[label] = str(exc)
    custom = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replica", "shard"))
    out["custom"] = _read(Topology.from_device_mesh(custom, axis_names={"dp": ("replica", "shard")}), custom)
    out["errors"] = errors
    return out


def _axis_ranks(rank: int, shape: dict[str, int], dims: list[str]) -> list[int]:
    """Global ranks of ``rank``'s slice along ``dims`` of a row-major grid of ``shape``."""
    grid = np.arange(int(np.prod(list(shape.values())))).reshape(tuple(shape.values()))
    coordinate = np.unravel_index(rank, grid.shape)
    index = tuple(slice(None) if name in dims else coordinate[i] for i, name in enumerate(shape))
    return grid[index].reshape(-1).tolist()


CASES = {
    # name: (mesh shape in mesh order, seqpack axis -> mesh dims)
    "titan_hsdp": ({"dp_replicate": 2, "dp_shard": 2}, {"dp": ["dp_replicate", "dp_shard"]}),
    "titan_fsdp_cp": ({"dp_shard": 2, "cp": 2}, {"dp": ["dp_shard"], "cp": ["cp"]}),
    "titan_fsdp_tp": ({"dp_shard": 2, "tp": 2}, {"dp": ["dp_shard"], "tp": ["tp"]}),
    "titan_pp_fsdp": ({"pp": 2, "dp_shard": 2}, {"pp": ["pp"], "dp": ["dp_shard"]}),
    "titan_ep": ({"dp_shard_mod_ep": 2, "dp_shard_in_ep": 2}, {"dp": ["dp_shard_mod_ep", "dp_shard_in_ep"]}),
    "nemo_hsdp": ({"dp_replicate": 2, "dp_shard": 2}, {"dp": ["dp_replicate", "dp_shard"]}),
    "nemo_fsdp_cp": ({"dp_shard": 2, "cp": 2}, {"dp": ["dp_shard"], "cp": ["cp"]}),
    "nemo_megatron_fsdp": ({"dp": 2, "cp": 2}, {"dp": ["dp"], "cp": ["cp"]}),
    "unflattened_hsdp": ({"dp_replicate": 2, "dp_shard": 2}, {"dp": ["dp_replicate", "dp_shard"]}),
    "titan_2026_loading": ({"batch": 2, "cp": 2}, {"dp": ["batch"], "cp": ["cp"]}),
    "custom": ({"replica": 2, "shard": 2}, {"dp": ["replica", "shard"]}),
}


def test_framework_meshes_are_read_as_they_are(dist_pools):
    results = dist_pools.get(4).run(mesh_cases)
    for r in results:
        rank = r["rank"]
        for name, (shape, axes) in CASES.items():
            got = r[name]
            for axis in AXES:
                dims = axes.get(axis, [])
                size = 1
                for d in dims:
                    size *= shape[d]
                want_ranks = _axis_ranks(rank, shape, dims) if dims else [rank]
                assert got["signature"][f"{axis}_size"] == size, (name, axis)
                assert got["ranks"][axis] == want_ranks, (name, axis)
                assert got["signature"][f"{axis}_rank"] == want_ranks.index(rank), (name, axis)
            if "uses_mesh_dp_group" in got:  # the framework's own flattened dp group is reused
                assert got["uses_mesh_dp_group"], name
        assert r["titan_hsdp"]["signature"]["dp_size"] == 4 and "uses_mesh_dp_group" in r["titan_hsdp"]
        assert "mesh dim 'world' (size 4) folds every axis into one" in r["errors"]["world"]
        assert "mesh dim 'dp_shard_cp' (size 2) folds dp_shard and cp into one" in r["errors"]["folded"]


# --- Topology.single() under a process group ----------------------------------------------


def single_cases() -> dict:
    out = {}
    try:
        Topology.single()
        out["refused"] = None
    except ValueError as exc:
        out["refused"] = str(exc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out["allowed"] = Topology.single(allow_distributed=True).signature()
    return out


def test_single_refuses_a_multi_rank_process_group_unless_told(dist_pools):
    results = dist_pools.get(2).run(single_cases)
    for rank, r in enumerate(results):
        assert f"Topology.single() on rank {rank} of 2 initialised ranks" in r["refused"]
        assert "Topology.from_device_mesh(mesh)" in r["refused"] and "allow_distributed=True" in r["refused"]
        assert r["allowed"]["dp_size"] == 1 and r["allowed"]["dp_rank"] == 0


def test_single_without_a_process_group_needs_no_flag():
    assert not dist.is_initialized()
    assert Topology.single().world_size == 1
    with pytest.raises(ValueError, match="allow_distributed must be True or False"):
        Topology.single(allow_distributed="yes")


# --- a topology over part of the job -------------------------------------------------------


def _outcome(call) -> str:
    try:
        call()
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _delivered(topology: Topology, prefetch: int, **kwargs) -> list[int]:
    """First tokens of every sequence this rank trains on (data keyed by DP rank)."""
    from wrapper_data import items

    it = wrap_data_iterator(
        items(5, topology.dp_rank, 12),
        topology,
        samples_per_rank=6,
        max_tokens_per_rank=96,
        pad_multiple=2,
        scheduler="empty",
        prefetch=prefetch,
        **kwargs,
    )
    with it:
        return [
            int(b.input_ids[b.cu_seqlens_padded[k]])
            for s in it
            for b in s.microbatches
            for k in range(b.cu_seqlens.shape[0] - 1)
            if b.cu_seqlens[k + 1] > b.cu_seqlens[k]
        ]


def partial_cases() -> dict:
    """HSDP's mesh["dp_shard"] (2 x 2 job) and NeMo's flattened mesh["dp"] (dp_shard 2 x cp 2):
    each a topology over 2 of the 4 ranks, in both prefetch modes; then the opt-in."""
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    nemo = _nemo_fsdp2(dp_shard=2, cp=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates slicing a flattened dim from the root mesh
        nemo_dp = nemo["dp"]
    out: dict = {}
    for name, sub in (("hsdp_shard", hsdp["dp_shard"]), ("nemo_dp", nemo_dp)):
        topology = Topology.from_device_mesh(sub)
        out[f"{name}_world"] = topology.world_size
        for prefetch in (0, 1):
            out[f"{name}_{prefetch}"] = _outcome(lambda t=topology, k=prefetch: _delivered(t, k))
    # What was suggested instead: the whole mesh delivers every sample once.
    out["whole"] = _delivered(Topology.from_device_mesh(hsdp), 0)
    # A deliberate partial topology (one wrapper per replicate pair here) runs when it says so.
    chosen = Topology.from_device_mesh(hsdp["dp_shard"], partial=True)
    out["partial_0"] = _delivered(chosen, 0)
    out["partial_1"] = _outcome(lambda: _delivered(chosen, 1))
    out["partial_1_groups"] = _delivered(chosen, 1, wrapper_groups=chosen)
    return out


def test_a_topology_over_part_of_the_job_is_refused_unless_chosen(dist_pools):
    results = dist_pools.get(4).run(partial_cases)
    hsdp_hint = "the whole mesh (dp_replicate=2, dp_shard=2) or mesh['dp_replicate', 'dp_shard']"
    nemo_hint = "the whole mesh (pp=1, dp_replicate=1, dp_shard=2, cp=2, tp=1) or mesh['dp_shard', 'cp']"
    for r in results:
        assert r["hsdp_shard_world"] == r["nemo_dp_world"] == 2  # not vacuous: both cover half the job
        for name, hint in (("hsdp_shard", hsdp_hint), ("nemo_dp", nemo_hint)):
            for prefetch in (0, 1):
                message = r[f"{name}_{prefetch}"]
                assert message.startswith("ConfigError: the topology spans 2 of the 4 initialised ranks"), message
                assert hint in message and "partial=True" in message, message
                assert "prefetch=0" not in message, message
        assert r["partial_1"].startswith("ConfigError") and "wrapper_groups" in r["partial_1"], r["partial_1"]
        assert r["partial_1_groups"] == r["partial_0"]
    # The whole mesh: 4 DP ranks' data, every sequence once over the job. The chosen partial
    # topology: each replicate pair packs its DP ranks 0 and 1 alone, so each sequence twice.
    whole = [token for r in results for token in r["whole"]]
    assert len(whole) == len(set(whole)) and {t // 10**7 for t in whole} == {0, 1, 2, 3}
    halves = [token for r in results for token in r["partial_0"]]
    assert len(halves) == 2 * len(set(halves)) and {t // 10**7 for t in halves} == {0, 1}


# --- mistakes in the mesh, named -------------------------------------------------------------


def mesh_mistakes() -> dict:
    from torch.distributed.device_mesh import DeviceMesh

    out = {}
    # A mesh over ranks 0 and 1 only, built on every rank: ranks 2 and 3 are outside it.
    part = DeviceMesh("cpu", [0, 1], mesh_dim_names=("dp",))
    out["outside"] = _outcome(lambda: Topology.from_device_mesh(part))
    both = init_device_mesh("cpu", (4,), mesh_dim_names=("x",))
    out["both"] = _outcome(lambda: Topology.from_device_mesh(both, axis_names={"dp": "x", "cp": "x"}))
    return out


def test_mesh_mistakes_are_named(dist_pools):
    results = dist_pools.get(4).run(mesh_mistakes)
    for rank, r in enumerate(results):
        if rank < 2:
            assert r["outside"] == "ok", r["outside"]
        else:
            want = f"ConfigError: this rank ({rank}) is not in the device mesh (its ranks: [0, 1], dims ('dp',))"
            assert r["outside"].startswith(want), r["outside"]
        assert r["both"].startswith("ConfigError: axis_names maps mesh dim 'x' to both dp and cp"), r["both"]
