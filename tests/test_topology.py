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
        "dp_size": 1, "cp_size": 1, "tp_size": 2, "pp_size": 3,
        "dp_rank": 0, "cp_rank": 0, "tp_rank": 1, "pp_rank": 1,
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
    with pytest.raises(ValueError, match=r"no process group given for axis 'dp' \(size 2\)"):
        Topology(dp_size=2, dp_rank=1, groups={"dp": "G"}).with_groups({"cp": "H"})
    # One rank needs no groups of its own, with or without torch.distributed.
    assert new_axis_groups(single) == {"dp": None, "cp": None, "tp": None, "pp": None}
    destroy_groups([None])  # nothing to free, no error
