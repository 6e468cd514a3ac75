"""Topology: sizes, ranks and process groups of the dp / cp / tp / pp axes.

seqpack never computes a peer's global rank from its own: every collective runs on the
process group of one axis (``topology.group("cp")``), and where a global rank is needed
(the source of a broadcast) it is read from the group's membership
(``topology.global_ranks("tp")[0]``). The DP group holds one CP lane (Megatron's
``get_data_parallel_group(with_context_parallel=False)``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import AXES, Axis
from seqpack.validation import check_bool, check_int, check_mapping, check_optional_int, check_positive_int

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["AXES", "DP_DIM_NAMES", "Axis", "Topology"]

logger = logging.getLogger(__name__)


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
        partial: The grid covers part of the initialised job on purpose (``partial=True``
            of the constructors, ``single(allow_distributed=True)``): the wrapper then runs
            on it instead of refusing it, and does not warn about a one-rank topology.
        mesh_hint: For a topology read from a mesh sliced out of a larger one: the mesh to
            pass instead, which the wrapper's refusal of a partial topology names.
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
    partial: bool = dataclasses.field(default=False, compare=False, repr=False)
    mesh_hint: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for axis in AXES:
            size = check_positive_int(f"{axis}_size", getattr(self, f"{axis}_size"))
            rank = check_int(f"{axis}_rank", getattr(self, f"{axis}_rank"))
            if not 0 <= rank < size:
                raise ConfigError(f"{axis}_rank={rank!r} is out of range for {axis}_size={size} (valid: 0..{size - 1})")
        product = self.dp_size * self.cp_size * self.tp_size * self.pp_size
        check_optional_int("world_size", self.world_size, minimum=1)
        check_mapping("groups", self.groups)
        object.__setattr__(self, "partial", check_bool("partial", self.partial))
        if not isinstance(self.mesh_hint, str):
            raise SeqpackTypeError(f"mesh_hint must be a str, got {type(self.mesh_hint).__name__}")
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
    def single(cls, *, allow_distributed: bool = False) -> Topology:
        """One rank, no parallelism (works without ``torch.distributed``).

        Args:
            allow_distributed: Build it even while a process group of several ranks is
                initialised (each rank then packs its own data alone, with no exchange).

        Raises:
            ConfigError: A multi-rank process group is initialised and ``allow_distributed``
                is not set: the caller most likely meant :meth:`from_device_mesh`.
        """
        allow_distributed = check_bool("allow_distributed", allow_distributed)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            if not allow_distributed:
                raise ConfigError(
                    f"Topology.single() on rank {dist.get_rank()} of {dist.get_world_size()} initialised ranks: every "
                    "rank would pack its own data alone; build the topology from your mesh "
                    "(Topology.from_device_mesh(mesh)) or groups (Topology.from_groups(dp=...)), or pass "
                    "Topology.single(allow_distributed=True) if each rank really trains alone"
                )
            logger.info("Topology.single() on one of %d ranks: this rank packs its data alone", dist.get_world_size())
        return cls(partial=allow_distributed)

    @classmethod
    def from_device_mesh(
        cls,
        mesh: DeviceMesh,
        *,
        axis_names: Mapping[str, str | Sequence[str]] | None = None,
        partial: bool = False,
    ) -> Topology:
        """Read sizes, ranks and groups from a ``DeviceMesh``, as the frameworks build it.

        Mesh dims are read by name: ``cp``, ``tp``, ``pp`` are those axes; every
        data-parallel dim (:data:`DP_DIM_NAMES`: ``dp``, torchtitan's and NeMo Automodel's
        ``dp_replicate`` and ``dp_shard``, torchtitan's ``batch``, ...) is part of seqpack's
        DP, whose group is the mesh's flattened ``dp`` when it has one and is flattened here
        otherwise (HSDP's replicate x shard is one DP axis for data). Flattened dims that
        fold CP in (``dp_shard_cp``, ``dp_cp``) are not mesh dims and are never read; a mesh
        *made of* such a dim is refused, since CP could not be told apart. Dims of size 1
        are ignored whatever their name.

        Pass the mesh of the whole job: a mesh sliced from it (HSDP's ``mesh["dp_shard"]``,
        a flattened ``mesh["dp"]`` beside CP) covers part of the ranks, and the wrapper
        refuses such a topology unless ``partial=True``.

        Args:
            mesh: A ``torch.distributed.device_mesh.DeviceMesh`` with named dims.
            axis_names: seqpack axis to mesh dim name(s), for meshes named otherwise
                (e.g. ``{"dp": "data"}`` or ``{"dp": ("replica", "shard")}``); it replaces
                the automatic reading for the axes it names.
            partial: The mesh covers part of the initialised job on purpose (one wrapper
                per pipeline stage, say): the wrapper runs on it, each copy packing alone.

        Raises:
            SeqpackTypeError: Not a DeviceMesh.
            ConfigError: An unnamed mesh, a dim of size > 1 that maps to no axis or to two,
                sizes whose product is not the mesh size, or a mesh this rank is not in.
        """
        if not (hasattr(mesh, "mesh_dim_names") and hasattr(mesh, "ndim")):
            raise SeqpackTypeError(f"mesh must be a torch DeviceMesh, got {type(mesh).__name__}")
        names = tuple(mesh.mesh_dim_names or ())
        if len(names) != mesh.ndim:
            raise ConfigError(f"the device mesh must name its dims ({', '.join(AXES)}), got mesh_dim_names={names}")
        sizes = {dim: int(mesh.size(index)) for index, dim in enumerate(names)}
        dims_of = _axis_dims(names, sizes, axis_names)
        coordinate_of = getattr(mesh, "get_coordinate", None)  # None: this rank is not in the mesh
        if coordinate_of is not None and coordinate_of() is None:
            members = [int(rank) for rank in mesh.mesh.reshape(-1).tolist()]
            raise ConfigError(
                f"this rank ({dist.get_rank()}) is not in the device mesh (its ranks: {members}, dims {names}): "
                "build the topology, on every rank, from a mesh that holds it (the mesh of the whole job)"
            )
        kwargs: dict[str, Any] = {}
        groups: dict[str, Any] = {}
        for axis, dims in dims_of.items():
            active = [dim for dim in dims if sizes[dim] > 1]
            if not active:
                continue
            if len(active) == 1:
                kwargs[f"{axis}_size"] = sizes[active[0]]
                kwargs[f"{axis}_rank"] = int(mesh.get_local_rank(active[0]))
                groups[axis] = mesh.get_group(active[0])
            else:
                ranks, groups[axis] = _joined_group(mesh, active)
                kwargs[f"{axis}_size"] = len(ranks)
                kwargs[f"{axis}_rank"] = ranks.index(dist.get_rank())
        hint = _whole_mesh_hint(mesh)
        return cls(**kwargs, world_size=int(mesh.size()), groups=groups, partial=partial, mesh_hint=hint)

    @classmethod
    def from_groups(
        cls,
        *,
        dp: Any = None,
        cp: Any = None,
        tp: Any = None,
        pp: Any = None,
        world_size: int | None = None,
        partial: bool = False,
    ) -> Topology:
        """Build from process groups a framework already owns (Megatron-style).

        Sizes and ranks are read from the groups (``None`` = size 1). The groups must meet
        only in this rank: two axes sharing another member would not form a grid.

        Args:
            dp: The data-parallel group *without* context parallelism (one CP lane).
            cp, tp, pp: Context-, tensor- and pipeline-parallel groups (pp ordered by stage).
            world_size: Ranks the grid spans (default: the default group's world size).
            partial: A ``world_size`` below the job's is on purpose (one wrapper per
                pipeline stage, say): the wrapper runs on it instead of refusing it.

        Raises:
            SeqpackTypeError: A group that is not a ``ProcessGroup``.
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
            _check_group(axis, group)
            ranks = dist.get_process_group_ranks(group)
            if me not in ranks:
                raise ConfigError(f"the {axis} group {ranks} does not contain this rank ({me})")
            kwargs[f"{axis}_size"] = len(ranks)
            kwargs[f"{axis}_rank"] = ranks.index(me)
            members[axis] = set(ranks)
        for a, b in itertools.combinations(members, 2):
            shared = members[a] & members[b]
            if shared != {me}:
                raise ConfigError(
                    f"the {a} group {sorted(members[a])} and the {b} group {sorted(members[b])} share ranks "
                    f"{sorted(shared)}; axis groups must meet only in this rank ({me})"
                )
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        groups = {k: v for k, v in given.items() if v is not None}
        return cls(**kwargs, world_size=world_size, groups=groups, partial=partial)

    def with_groups(self, groups: Topology | Mapping[str, Any]) -> Topology:
        """The same grid (sizes, ranks) with other process groups over the same ranks.

        The wrapper runs its collectives on such a copy when it prepares steps in the
        background, so that they never interleave with the model's on the original groups.

        Args:
            groups: Axis name to process group (axes of size 1 may be left out), or a
                :class:`Topology` whose groups are taken.

        Raises:
            SeqpackTypeError: ``groups`` not a mapping, or a group not a ``ProcessGroup``.
            ConfigError: A group missing for an axis of size > 1, an unknown axis, or a
                group whose members (in group-rank order) differ from the axis group's.
        """
        given = dict(groups.groups) if isinstance(groups, Topology) else dict(check_mapping("groups", groups))
        unknown = set(given) - set(AXES)
        if unknown:
            raise ConfigError(f"unknown axis name(s) {sorted(unknown)} in groups; valid axes: {', '.join(AXES)}")
        chosen: dict[str, Any] = {}
        for axis in AXES:
            if self.size(axis) == 1:
                continue
            group = given.get(axis)
            if group is None:
                raise ConfigError(f"groups has no process group for axis {axis!r} (size {self.size(axis)})")
            if group is dist.GroupMember.NON_GROUP_MEMBER:
                raise ConfigError(f"the {axis} group given does not contain this rank")
            _check_group(f"groups[{axis!r}]", group)
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


DP_DIM_NAMES: tuple[str, ...] = ("dp", "dp_replicate", "dp_shard", "batch", "dp_shard_mod_ep", "dp_shard_in_ep")
"""Mesh dims :meth:`Topology.from_device_mesh` reads as data-parallel: ``dp`` (NeMo
Automodel's Megatron-FSDP mesh), ``dp_replicate`` x ``dp_shard`` (torchtitan, NeMo Automodel
FSDP2 / HSDP), torchtitan's ``batch`` (its data-loading mesh) and ``dp_shard_mod_ep`` x
``dp_shard_in_ep`` (torchtitan's expert-parallel mesh)."""

_FOLDED_DIMS: Mapping[str, str] = {
    "dp_shard_cp": "dp_shard and cp",
    "dp_cp": "dp and cp",
    "fsdp": "dp_shard and cp",
    "loss": "dp and cp",
    "loss_mesh": "dp and cp",
    "world": "every axis",
}
"""Dims that fold CP (or everything) into one: seqpack cannot tell the axes apart in them."""


def _axis_dims(
    names: tuple[str, ...], sizes: Mapping[str, int], axis_names: Mapping[str, str | Sequence[str]] | None
) -> dict[str, tuple[str, ...]]:
    """seqpack axis to the mesh dims it spans (several only for DP); checks every dim is used."""
    dims_of: dict[str, tuple[str, ...]] = {}
    if axis_names is not None:
        check_mapping("axis_names", axis_names)
        bad = set(axis_names) - set(AXES)
        if bad:
            raise ConfigError(f"axis_names keys must be in {AXES}, got {sorted(bad, key=repr)}")
        axis_of: dict[str, str] = {}
        for axis, dims in axis_names.items():
            chosen = (dims,) if isinstance(dims, str) else tuple(dims) if isinstance(dims, (list, tuple)) else None
            if not chosen or not all(isinstance(dim, str) for dim in chosen):
                raise SeqpackTypeError(
                    f"axis_names[{axis!r}] must be a mesh dim name or a non-empty list of them, got {dims!r}"
                )
            dims_of[str(axis)] = chosen
            for dim in dims_of[str(axis)]:
                if dim not in names:
                    raise ConfigError(f"axis_names maps {axis!r} to {dim!r}, which is not a mesh dim {names}")
                if dim in axis_of:
                    both = f"both {axis_of[dim]} and {axis}" if axis_of[dim] != axis else f"{axis} twice"
                    raise ConfigError(
                        f"axis_names maps mesh dim {dim!r} to {both} ({dict(axis_names)}): each mesh dim is part of "
                        "one axis only"
                    )
                axis_of[dim] = str(axis)
    claimed = {dim for dims in dims_of.values() for dim in dims}
    for axis in AXES:
        if axis in dims_of:
            continue
        wanted = DP_DIM_NAMES if axis == Axis.DP else (str(axis),)
        found = tuple(dim for dim in names if dim in wanted and dim not in claimed)
        if found:
            dims_of[str(axis)] = found
            claimed.update(found)
    for dim in names:
        if dim in claimed or sizes[dim] == 1:
            continue
        if dim in _FOLDED_DIMS:
            raise ConfigError(
                f"mesh dim {dim!r} (size {sizes[dim]}) folds {_FOLDED_DIMS[dim]} into one, so seqpack cannot tell DP "
                f"from CP; pass the mesh whose dims keep them apart (mesh dims: {names}), e.g. torchtitan's "
                "data-loading mesh (pp, batch, cp, tp: seqpack.interop.torchtitan.topology(parallel_dims)), or NeMo "
                "Automodel's device_mesh"
            )
        if dim in DP_DIM_NAMES or dim in AXES:  # read automatically, but axis_names took its axis
            axis = Axis.DP if dim in DP_DIM_NAMES else Axis(dim)
            raise ConfigError(
                f"mesh dim {dim!r} (size {sizes[dim]}) is part of {axis}, but axis_names maps {axis} to "
                f"{dims_of[axis]} only: add {dim!r} there (mesh dims: {names})"
            )
        raise ConfigError(
            f"mesh dim {dim!r} is not one of {', '.join(AXES)} nor a data-parallel dim ({', '.join(DP_DIM_NAMES)}); "
            f"flatten it into one of them or pass axis_names={{'dp': {dim!r}}} (mesh dims: {names})"
        )
    return dims_of


def _check_group(name: str, group: object) -> None:
    if not isinstance(group, dist.ProcessGroup):
        raise SeqpackTypeError(f"{name} must be a torch.distributed ProcessGroup (or None), got {type(group).__name__}")


def _whole_mesh_hint(mesh: DeviceMesh) -> str:
    """For a mesh sliced (or flattened) out of a larger one: that mesh, and its dims of size
    > 1 (slicing those covers the same ranks), as the wrapper's refusal names them; else ""."""
    root_of = getattr(mesh, "_get_root_mesh", None)  # torch's own (private) record of the slicing
    root = root_of() if root_of is not None else mesh
    if root is mesh or int(root.size()) <= int(mesh.size()):
        return ""
    names = tuple(root.mesh_dim_names or ())
    if len(names) != root.ndim:
        return f"the whole mesh ({int(root.size())} ranks)"
    shape = ", ".join(f"{dim}={int(root.size(i))}" for i, dim in enumerate(names))
    active = ", ".join(repr(dim) for i, dim in enumerate(names) if int(root.size(i)) > 1)
    return f"the whole mesh ({shape}) or mesh[{active}]"


def _joined_group(mesh: DeviceMesh, dims: Sequence[str]) -> tuple[list[int], Any]:
    """Global ranks (row-major over ``dims``) and process group of this rank's slice of the
    mesh along ``dims``: the mesh's own flattened dim when one has exactly these ranks, else
    a new one (``DeviceMesh._flatten``; every rank of the mesh must get here)."""
    names = tuple(mesh.mesh_dim_names or ())
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ConfigError(f"this rank ({dist.get_rank()}) is not in the device mesh")
    index = tuple(slice(None) if name in dims else coordinate[i] for i, name in enumerate(names))
    expected = [int(rank) for rank in mesh.mesh[index].reshape(-1).tolist()]
    # Frameworks flatten these dims themselves (torchtitan and NeMo Automodel name it "dp"):
    # reuse that group rather than open another communicator. DeviceMesh keeps flattened
    # dims in its root's private _flatten_mapping (slicing them by name is deprecated).
    flattened_dims = getattr(mesh._get_root_mesh(), "_flatten_mapping", {})
    for candidate in flattened_dims.values():
        if candidate.ndim == 1 and dist.get_process_group_ranks(candidate.get_group()) == expected:
            return expected, candidate.get_group()
    flattened = mesh[tuple(dims)]._flatten()
    return expected, flattened.get_group()
