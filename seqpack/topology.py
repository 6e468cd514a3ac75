"""Topology: sizes, ranks and process groups of the dp / cp / tp / pp axes.

seqpack never computes a peer's global rank from its own: every collective runs on the
process group of one axis (``topology.group("cp")``), and where a global rank is needed
(the source of a broadcast) it is read from the group's membership
(``topology.global_ranks("tp")[0]``).

Axes:
    dp: data-parallel replicas (without CP: the DP group of a rank holds the ranks of the
        same CP lane, same TP rank and same pipeline stage, as Megatron's
        ``get_data_parallel_group(with_context_parallel=False)``).
    cp: context-parallel ranks of one replica (they read identical samples).
    tp: tensor-parallel ranks (identical data; only TP rank 0 reads under ``data_owner="tp0"``).
    pp: pipeline stages (first and last read data; middle stages need layout metadata only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import AXES, Axis
from seqpack.validation import check_int, check_mapping, check_optional_int, check_positive_int

__all__ = ["AXES", "Axis", "Topology"]


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this rank sits in the dp x cp x tp x pp grid, and the groups of its axes.

    Build it with :meth:`from_device_mesh`, :meth:`from_groups` or :meth:`single` rather
    than directly. A group is ``None`` exactly when its axis has size 1.

    Attributes:
        dp_size, cp_size, tp_size, pp_size: Axis sizes.
        dp_rank, cp_rank, tp_rank, pp_rank: This rank's index on each axis (its rank in the
            axis group).
        world_size: Ranks the grid spans; must equal ``dp * cp * tp * pp``.
        groups: Axis name to process group (``None`` for axes of size 1).
    """

    dp_size: int = 1
    cp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    dp_rank: int = 0
    cp_rank: int = 0
    tp_rank: int = 0
    pp_rank: int = 0
    world_size: int | None = None
    groups: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for axis in AXES:
            size = check_positive_int(f"{axis}_size", getattr(self, f"{axis}_size"))
            rank = check_int(f"{axis}_rank", getattr(self, f"{axis}_rank"))
            if not 0 <= rank < size:
                raise ConfigError(f"{axis}_rank={rank!r} is out of range for {axis}_size={size} (valid: 0..{size - 1})")
        product = self.dp_size * self.cp_size * self.tp_size * self.pp_size
        check_optional_int("world_size", self.world_size, minimum=1)
        check_mapping("groups", self.groups)
        if self.world_size is None:
            object.__setattr__(self, "world_size", product)
        elif product != self.world_size:
            raise ConfigError(
                f"dp({self.dp_size}) * cp({self.cp_size}) * tp({self.tp_size}) * pp({self.pp_size}) = {product} "
                f"!= world_size({self.world_size})"
            )
        unknown = set(self.groups) - set(AXES)
        if unknown:
            raise ConfigError(f"unknown axis name(s) {sorted(unknown)} in groups; valid axes: {', '.join(AXES)}")
        normalised = {}
        for axis in AXES:
            group = self.groups.get(axis)
            size = getattr(self, f"{axis}_size")
            if size > 1 and group is None:
                raise ConfigError(f"{axis}_size={size}: axis {axis!r} has size {size} but no process group in groups")
            normalised[axis] = group if size > 1 else None
        object.__setattr__(self, "groups", normalised)

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def single(cls) -> Topology:
        """One rank, no parallelism (works without ``torch.distributed``)."""
        return cls()

    @classmethod
    def from_device_mesh(cls, mesh: Any, *, axis_names: Mapping[str, str] | None = None) -> Topology:
        """Read sizes, ranks and groups from a ``DeviceMesh``.

        Args:
            mesh: A ``torch.distributed.device_mesh.DeviceMesh`` whose dims are named
                ``dp``, ``cp``, ``tp``, ``pp`` (any subset, any order; missing axes have
                size 1).
            axis_names: seqpack axis to mesh dim name, for meshes named otherwise
                (e.g. ``{"dp": "dp_shard"}``).

        Raises:
            ValueError: An unnamed mesh, a dim that maps to no axis, or sizes whose product
                is not the mesh size.
        """
        if not (hasattr(mesh, "mesh_dim_names") and hasattr(mesh, "ndim")):
            raise SeqpackTypeError(f"mesh must be a torch DeviceMesh, got {type(mesh).__name__}")
        names = tuple(mesh.mesh_dim_names or ())
        if len(names) != mesh.ndim:
            raise ConfigError(f"the device mesh must name its dims ({', '.join(AXES)}), got mesh_dim_names={names}")
        mapping: dict[str, str] = {str(axis): str(axis) for axis in AXES if axis in names}
        if axis_names:
            bad = set(axis_names) - set(AXES)
            if bad:
                raise ConfigError(f"axis_names keys must be in {AXES}, got {sorted(bad)}")
            mapping.update(axis_names)
        by_dim = {dim: axis for axis, dim in mapping.items()}
        for dim in names:
            if dim not in by_dim:
                raise ConfigError(
                    f"mesh dim {dim!r} is not one of {', '.join(AXES)}; flatten it into one of them or pass "
                    f"axis_names={{'dp': {dim!r}}} (mesh dims: {names})"
                )
        for axis, dim in mapping.items():
            if dim not in names:
                raise ConfigError(f"axis_names maps {axis!r} to {dim!r}, which is not a mesh dim {names}")
        kwargs: dict[str, Any] = {}
        groups: dict[str, Any] = {}
        for axis, dim in mapping.items():
            index = names.index(dim)
            kwargs[f"{axis}_size"] = int(mesh.size(index))
            kwargs[f"{axis}_rank"] = int(mesh.get_local_rank(dim))
            groups[axis] = mesh.get_group(dim)
        return cls(**kwargs, world_size=int(mesh.size()), groups=groups)

    @classmethod
    def from_groups(
        cls,
        *,
        dp: Any = None,
        cp: Any = None,
        tp: Any = None,
        pp: Any = None,
        world_size: int | None = None,
    ) -> Topology:
        """Build from process groups a framework already owns (Megatron-style).

        Sizes and ranks are read from the groups (``None`` = size 1). The groups must meet
        only in this rank: two axes sharing another member would not form a grid.

        Args:
            dp: The data-parallel group *without* context parallelism (one CP lane).
            cp, tp, pp: Context-, tensor- and pipeline-parallel groups (pp ordered by stage).
            world_size: Ranks the grid spans (default: the default group's world size).

        Raises:
            ValueError: A group that does not contain this rank, groups overlapping beyond
                this rank, or sizes whose product is not ``world_size``.
        """
        given = {"dp": dp, "cp": cp, "tp": tp, "pp": pp}
        kwargs: dict[str, Any] = {}
        members: dict[str, set[int]] = {}
        me = dist.get_rank() if dist.is_initialized() else 0
        for axis, group in given.items():
            if group is None:
                continue
            if group is dist.GroupMember.NON_GROUP_MEMBER:
                raise ConfigError(f"the {axis} group does not contain this rank ({me}): pass the group this rank is in")
            ranks = dist.get_process_group_ranks(group)
            if me not in ranks:
                raise ConfigError(f"the {axis} group {ranks} does not contain this rank ({me})")
            kwargs[f"{axis}_size"] = len(ranks)
            kwargs[f"{axis}_rank"] = ranks.index(me)
            members[axis] = set(ranks)
        axes = list(members)
        for i, a in enumerate(axes):
            for b in axes[i + 1 :]:
                shared = members[a] & members[b]
                if shared != {me}:
                    raise ConfigError(
                        f"the {a} group {sorted(members[a])} and the {b} group {sorted(members[b])} share ranks "
                        f"{sorted(shared)}; axis groups must meet only in this rank ({me})"
                    )
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        return cls(**kwargs, world_size=world_size, groups={k: v for k, v in given.items() if v is not None})

    def with_groups(self, groups: Topology | Mapping[str, Any]) -> Topology:
        """The same grid (sizes, ranks) with other process groups over the same ranks.

        The wrapper runs its collectives on such a copy when it prepares steps in the
        background, so that they never interleave with the model's on the original groups.

        Args:
            groups: Axis name to process group (axes of size 1 may be left out), or a
                :class:`Topology` whose groups are taken.

        Raises:
            ConfigError: A group missing for an axis of size > 1, an unknown axis, or a
                group whose members (in group-rank order) differ from the axis group's.
        """
        given = dict(groups.groups) if isinstance(groups, Topology) else dict(groups)
        unknown = set(given) - set(AXES)
        if unknown:
            raise ConfigError(f"unknown axis name(s) {sorted(unknown)} in groups; valid axes: {', '.join(AXES)}")
        chosen: dict[str, Any] = {}
        for axis in AXES:
            if self.size(axis) == 1:
                continue
            group = given.get(axis)
            if group is None:
                raise ConfigError(f"no process group given for axis {axis!r} (size {self.size(axis)})")
            if group is dist.GroupMember.NON_GROUP_MEMBER:
                raise ConfigError(f"the {axis} group given does not contain this rank")
            ranks = list(dist.get_process_group_ranks(group))
            expected = self.global_ranks(axis)
            if ranks != expected:
                raise ConfigError(
                    f"the {axis} group given has ranks {ranks} but the topology's {axis} group has {expected} "
                    "(same ranks in the same order needed)"
                )
            chosen[axis] = group
        return dataclasses.replace(self, groups=chosen)

    # -- lookups --------------------------------------------------------------------------

    def _axis(self, axis: str) -> Axis:
        if axis not in AXES:
            raise ConfigError(f"unknown axis {axis!r}; valid axes: {', '.join(AXES)}")
        return Axis(axis)

    def size(self, axis: str) -> int:
        return int(getattr(self, f"{self._axis(axis)}_size"))

    def rank(self, axis: str) -> int:
        return int(getattr(self, f"{self._axis(axis)}_rank"))

    def group(self, axis: str) -> Any:
        """The process group of ``axis`` (``None`` when its size is 1)."""
        return self.groups[self._axis(axis)]

    def global_ranks(self, axis: str) -> list[int]:
        """Global ranks of the ``axis`` group, in group-rank order (read from membership)."""
        group = self.group(axis)
        if group is None:
            return [dist.get_rank() if dist.is_initialized() else 0]
        return list(dist.get_process_group_ranks(group))

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_middle_stage(self) -> bool:
        """Neither first nor last pipeline stage: needs layout metadata, not tokens."""
        return not (self.is_first_stage or self.is_last_stage)

    def signature(self) -> dict[str, int]:
        """Sizes and ranks: what a resumed iterator must match."""
        return {f"{axis}_{kind}": getattr(self, f"{axis}_{kind}") for kind in ("size", "rank") for axis in AXES}

    def describe(self) -> str:
        """``dp=1/2 cp=0/1 tp=0/1 pp=0/1`` (rank/size per axis)."""
        return " ".join(f"{axis}={self.rank(axis)}/{self.size(axis)}" for axis in AXES)
