"""seqpack.interop.torchtitan.topology on torchtitan 0.3's meshes, 2 gloo ranks: batch=2,
cp=2 and tp=2, with ``shard_cp`` off (the trainer's path: DP over the ``batch`` mesh) and on
(the enabled axes of ``(pp, batch, cp, tp)``); its ``world`` and ``loss_mesh`` meshes refused.

With torchtitan installed (its own venv) the real ``ParallelDims`` builds the meshes (on CPU:
``device_type`` set to ``"cpu"`` and the ``fake`` backend registered, as torchtitan's
size-1 axes need). Without it a stand-in builds them as ``ParallelDims.build_mesh`` does: a
1-D ``world`` mesh unflattened into ``(pp, batch, cp, tp)``, ``batch`` x ``cp`` flattened
into ``loss_mesh``, ``get_optional_mesh`` answering ``None`` for an axis of size 1."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from seqpack.errors import ConfigError
from seqpack.interop import torchtitan as tt
from seqpack.topology import Topology

try:
    import torchtitan  # noqa: F401
except ImportError:
    HAVE_TORCHTITAN = False
else:
    HAVE_TORCHTITAN = True


class StandInDims:
    """torchtitan 0.3's mesh layout and ``get_optional_mesh`` / ``get_mesh`` contract."""

    def __init__(self, *, pp: int = 1, batch: int = 1, cp: int = 1, tp: int = 1) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        world = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("world",))
        self.world_mesh = world
        self.data = world._unflatten(0, (pp, batch, cp, tp), tt.DATA_AXES)
        self.loss = self.data["batch", "cp"]._flatten("loss_mesh")
        self.sizes = {"pp": pp, "batch": batch, "cp": cp, "tp": tp, "loss": batch * cp}

    def get_optional_mesh(self, dims):
        dims = [dims] if isinstance(dims, str) else list(dims)
        if any(self.sizes[d] == 1 for d in dims):
            return None
        if dims == ["loss"]:
            return self.loss
        return self.data[tuple(dims)] if len(dims) > 1 else self.data[dims[0]]

    def get_mesh(self, dims):
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            raise ValueError(f"Mesh '{dims}' is not available.")
        return mesh


def parallel_dims(**degrees: int):
    if not HAVE_TORCHTITAN:
        return StandInDims(**degrees)
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    import torchtitan.distributed.parallel_dims as titan_dims

    titan_dims.device_type = "cpu"  # torchtitan falls back to "cuda" without a GPU
    dims = titan_dims.ParallelDims(
        dp_replicate=1, dp_shard=degrees.get("batch", 1), cp=degrees.get("cp", 1), tp=degrees.get("tp", 1),
        pp=degrees.get("pp", 1), ep=1, world_size=dist.get_world_size(),
    )  # fmt: skip
    dims.build_mesh()
    return dims


def read(degrees: dict[str, int]):
    dims = parallel_dims(**degrees)
    out = {"trainer": tt.topology(dims), "own_loop": tt.topology(dims, shard_cp=True)}
    for name, axes in (("world", None), ("loss", "loss")):
        mesh = dims.world_mesh if axes is None else dims.get_optional_mesh(axes)
        if mesh is None:
            continue
        try:
            Topology.from_device_mesh(mesh)
        except ConfigError as error:
            out[f"{name}_refused"] = str(error)
    return {k: (v.signature() | {"partial": v.partial}) if isinstance(v, Topology) else v for k, v in out.items()}


@pytest.mark.parametrize(
    "degrees, trainer, own_loop",
    [
        ({"batch": 2}, {"dp_size": 2}, {"dp_size": 2}),
        ({"cp": 2}, {"dp_size": 1, "partial": True}, {"cp_size": 2}),
        ({"tp": 2}, {"dp_size": 1, "partial": True}, {"tp_size": 2}),
    ],
)
def test_topology_of_torchtitan_meshes_on_two_ranks(dist_pools, degrees, trainer, own_loop):
    results = dist_pools.get(2).run(read, degrees)
    for rank, got in enumerate(results):
        for key, value in trainer.items():
            assert got["trainer"][key] == value, (key, got)
        for key, value in own_loop.items():
            assert got["own_loop"][key] == value, (key, got)
        axis = next(iter(own_loop)).removesuffix("_size")
        assert got["own_loop"][f"{axis}_rank"] == rank
        assert "folds every axis" in got["world_refused"]
        if "batch" in degrees or "cp" in degrees:
            assert "folds dp and cp" in got["loss_refused"]


def test_topology_on_one_rank(dist_pools):
    [got] = dist_pools.get(1).run(read, {})
    assert got["trainer"]["dp_size"] == got["own_loop"]["dp_size"] == 1
    assert not got["trainer"]["partial"]
