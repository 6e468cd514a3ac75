"""Topology validation without processes (constructors over real groups: tests/distributed)."""

import pytest

from seqpack.topology import AXES, Topology


def test_single():
    t = Topology.single()
    assert [t.size(a) for a in AXES] == [1, 1, 1, 1]
    assert [t.rank(a) for a in AXES] == [0, 0, 0, 0]
    assert t.world_size == 1
    assert all(t.group(a) is None for a in AXES)
    assert t.is_first_stage and t.is_last_stage and not t.is_middle_stage
    assert t.global_ranks("tp") == [0]
    assert t.describe() == "dp=0/1 cp=0/1 tp=0/1 pp=0/1"


def test_sizes_must_multiply_to_world_size():
    groups = {a: object() for a in AXES}
    with pytest.raises(ValueError, match=r"dp\(2\) \* cp\(4\) \* tp\(1\) \* pp\(1\) = 8 != world_size\(6\)"):
        Topology(dp_size=2, cp_size=4, world_size=6, groups=groups)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dp_size": 0}, r"dp_size must be a positive integer, got 0"),
        ({"cp_size": 2.0}, r"cp_size must be a positive integer, got 2.0"),
        ({"tp_size": 2, "tp_rank": 2}, r"tp_rank=2 is out of range for tp_size=2 \(valid: 0..1\)"),
        ({"pp_rank": -1}, r"pp_rank=-1 is out of range for pp_size=1"),
    ],
)
def test_bad_sizes_and_ranks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Topology(**kwargs, groups={a: object() for a in AXES})


def test_groups_are_required_exactly_where_an_axis_is_split():
    with pytest.raises(ValueError, match="axis 'cp' has size 2 but no process group"):
        Topology(cp_size=2)
    with pytest.raises(ValueError, match=r"unknown axis name\(s\) \['ep'\]"):
        Topology(groups={"ep": object()})
    # A group for an axis of size 1 is dropped: collectives on it are skipped.
    t = Topology(dp_size=2, dp_rank=1, groups={"dp": "G", "cp": "unused"})
    assert t.group("dp") == "G" and t.group("cp") is None
    with pytest.raises(ValueError, match="unknown axis 'ep'; valid axes: dp, cp, tp, pp"):
        t.group("ep")


def test_stages_and_signature():
    groups = {"pp": "P", "tp": "T"}
    first, middle, last = (Topology(pp_size=3, pp_rank=r, tp_size=2, tp_rank=1, groups=groups) for r in range(3))
    assert first.is_first_stage and not first.is_middle_stage
    assert middle.is_middle_stage and not middle.is_first_stage and not middle.is_last_stage
    assert last.is_last_stage
    assert middle.signature() == {
        "dp_size": 1,
        "cp_size": 1,
        "tp_size": 2,
        "pp_size": 3,
        "dp_rank": 0,
        "cp_rank": 0,
        "tp_rank": 1,
        "pp_rank": 1,
    }
    assert middle.world_size == 6
    assert first != middle  # frozen dataclass, compared by sizes and ranks
    with pytest.raises(AttributeError):
        middle.dp_size = 4


def test_with_groups_keeps_the_grid_and_checks_the_axes():
    from seqpack.collective.groups import destroy_groups, new_axis_groups

    single = Topology.single()
    assert single.with_groups({}) == single and single.with_groups(single).groups == single.groups
    with pytest.raises(ValueError, match=r"unknown axis name\(s\) \['ep'\] in groups"):
        single.with_groups({"ep": None})
    with pytest.raises(ValueError, match=r"groups has no process group for axis 'dp' \(size 2\)"):
        Topology(dp_size=2, dp_rank=1, groups={"dp": "G"}).with_groups({"cp": "H"})
    # One rank needs no groups of its own, with or without torch.distributed.
    assert new_axis_groups(single) == {"dp": None, "cp": None, "tp": None, "pp": None}
    destroy_groups([None])  # nothing to free, no error


# --- which mesh dims make which axis (the pure part of from_device_mesh) -----------------------


def test_mesh_dims_map_to_axes_by_their_framework_names():
    from seqpack.topology import _axis_dims

    def dims(names, sizes, axis_names=None):
        return _axis_dims(tuple(names), dict(zip(names, sizes, strict=True)), axis_names)

    # torchtitan / NeMo Automodel: replicate x shard is seqpack's DP; size-1 dims may be present.
    nemo = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert dims(nemo, (1, 2, 4, 2, 1)) == {
        "dp": ("dp_replicate", "dp_shard"),
        "cp": ("cp",),
        "tp": ("tp",),
        "pp": ("pp",),
    }
    assert dims(("pp", "batch", "cp", "tp"), (2, 8, 2, 4))["dp"] == ("batch",)  # torchtitan's data-loading mesh
    assert dims(("dp", "cp", "tp"), (2, 2, 2))["dp"] == ("dp",)  # NeMo's Megatron-FSDP mesh
    assert dims(("dp_shard_mod_ep", "dp_shard_in_ep", "tp"), (2, 4, 2))["dp"] == ("dp_shard_mod_ep", "dp_shard_in_ep")
    # A dim of size 1 maps to nothing harmlessly, whatever its name.
    assert dims(("ep", "dp_shard"), (1, 8)) == {"dp": ("dp_shard",)}
    # axis_names replaces the automatic reading for the axes it names (one dim or several).
    assert dims(("replica", "shard", "cp"), (2, 2, 2), {"dp": ("replica", "shard")}) == {
        "dp": ("replica", "shard"),
        "cp": ("cp",),
    }
    assert dims(("data", "cp"), (2, 2), {"dp": "data"}) == {"dp": ("data",), "cp": ("cp",)}


@pytest.mark.parametrize(
    "names, sizes, axis_names, message",
    [
        (("dp_replicate", "dp_shard_cp"), (2, 4), None, r"mesh dim 'dp_shard_cp' \(size 4\) folds dp_shard and cp"),
        (("world",), (8,), None, r"mesh dim 'world' \(size 8\) folds every axis into one"),
        (("fsdp", "tp"), (4, 2), None, r"'fsdp' \(size 4\) folds dp_shard and cp into one"),
        (("data", "cp"), (2, 2), None, r"mesh dim 'data' is not one of dp, cp, tp, pp nor a data-parallel dim"),
        (("data",), (2,), {"ep": "data"}, r"axis_names keys must be in"),
        (("data",), (2,), {"dp": "dta"}, r"axis_names maps 'dp' to 'dta', which is not a mesh dim"),
        # One dim named for two axes (it was read as both, then refused as sizes that do not multiply).
        (("x",), (4,), {"dp": "x", "cp": "x"}, r"axis_names maps mesh dim 'x' to both dp and cp"),
        (("x",), (2,), {"dp": ("x", "x")}, r"axis_names maps mesh dim 'x' to dp twice"),
        # A data-parallel dim axis_names leaves out of dp (it was called "not a data-parallel dim").
        (
            ("dp_replicate", "dp_shard"),
            (2, 2),
            {"dp": "dp_shard"},
            r"mesh dim 'dp_replicate' \(size 2\) is part of dp, but axis_names maps dp to \('dp_shard',\) only",
        ),
    ],
)
def test_mesh_dims_that_hide_an_axis_are_refused(names, sizes, axis_names, message):
    from seqpack.topology import _axis_dims

    with pytest.raises(ValueError, match=message):
        _axis_dims(names, dict(zip(names, sizes, strict=True)), axis_names)
