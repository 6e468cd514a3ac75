"""Topology's refusals that need no process group: a mesh that is none or names no dims, an
axis_names entry that names no dim, a group that is no ProcessGroup or does not hold this rank,
a mesh_hint that is no str; each names the argument and what it got."""

from __future__ import annotations

import types

import pytest
import torch.distributed as dist

from seqpack import Topology
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.topology import _axis_dims

NOT_A_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def test_a_mesh_hint_that_is_no_str_is_refused():
    with pytest.raises(SeqpackTypeError, match=r"mesh_hint must be a str, got int"):
        Topology(mesh_hint=3)


def test_something_that_is_no_device_mesh_is_refused_naming_its_type():
    with pytest.raises(SeqpackTypeError, match=r"mesh must be a torch DeviceMesh, got dict"):
        Topology.from_device_mesh({"dp": 2})


@pytest.mark.parametrize(("names", "shown"), [(None, r"\(\)"), (("dp",), r"\('dp',\)")])
def test_a_mesh_that_does_not_name_each_dim_is_refused(names, shown):
    mesh = types.SimpleNamespace(mesh_dim_names=names, ndim=2)
    with pytest.raises(ConfigError, match=rf"the device mesh must name its dims .*got mesh_dim_names={shown}$"):
        Topology.from_device_mesh(mesh)


@pytest.mark.parametrize("dims", [3, [], ("data", 1), None])
def test_an_axis_names_entry_that_names_no_dim_is_refused_naming_it(dims):
    with pytest.raises(SeqpackTypeError, match=r"axis_names\['dp'\] must be a mesh dim name or a non-empty list"):
        _axis_dims(("data",), {"data": 2}, {"dp": dims})


def test_a_group_that_is_no_process_group_is_refused_naming_the_axis():
    with pytest.raises(SeqpackTypeError, match=r"^cp must be a torch.distributed ProcessGroup \(or None\), got str"):
        Topology.from_groups(cp="world")
    split = Topology(dp_size=2, groups={"dp": "G"})
    with pytest.raises(SeqpackTypeError, match=r"groups\['dp'\] must be a torch.distributed ProcessGroup .*got object"):
        split.with_groups({"dp": object()})


def test_a_group_without_this_rank_is_refused_naming_the_axis():
    with pytest.raises(ConfigError, match=r"the tp group does not contain this rank \(0\)"):
        Topology.from_groups(tp=NOT_A_MEMBER)
    split = Topology(dp_size=2, dp_rank=1, groups={"dp": "G"})
    with pytest.raises(ConfigError, match=r"the dp group given does not contain this rank"):
        split.with_groups({"dp": NOT_A_MEMBER})
