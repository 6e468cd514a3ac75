"""Process groups of context parallelism: one per block of ranks a plan can use.

Under dynamic CP (docs/dynamic_cp.md) the ``R = dp x cp`` ranks of one TP/PP lane, the
*plane*, are numbered DP-major (plane rank ``d * cp + k``) and re-cut into CP groups, blocks
``[start, start + size)`` of plane ranks, every microbatch round. Static CP's groups are the
DP replicas' CP blocks in every round (:func:`static_cp_groups`).

:func:`new_cp_groups` creates, once and collectively over the default group, one process group
per block of size > 1 of every plane (on the model's backend, for the compute stages) and one
gloo group per plane for the wrapper's own exchange (which must never interleave with the
model's collectives). Members are read from an all-gather of every rank's coordinates, never
computed from global ranks.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from seqpack.collective.groups import all_gather_objects, new_group
from seqpack.errors import ConfigError
from seqpack.options import GroupSizes
from seqpack.validation import check_choice, check_positive_int

if TYPE_CHECKING:
    from seqpack.topology import Topology

__all__ = ["MAX_CP_GROUPS", "CpGroups", "new_cp_groups", "plane_blocks", "static_cp_groups"]

logger = logging.getLogger(__name__)

MAX_CP_GROUPS = 8192
"""Most process groups :func:`new_cp_groups` creates over the whole world (every rank calls
``new_group`` for each); dynamic CP's ``group_sizes="any"`` on large planes exceeds it."""


def plane_blocks(num_ranks: int, group_sizes: GroupSizes | str) -> list[tuple[int, int]]:
    """Every block ``(start, size)`` of size > 1 a plan over ``num_ranks`` ranks may use, by
    size then start: under ``"pow2"`` the aligned powers of two (``start % size == 0``) and
    the whole plane; under ``"any"`` every contiguous block."""
    num_ranks = check_positive_int("num_ranks", num_ranks)
    mode = check_choice("group_sizes", group_sizes, GroupSizes)
    if mode == GroupSizes.ANY:
        return [(start, size) for size in range(2, num_ranks + 1) for start in range(num_ranks - size + 1)]
    sizes = [1 << k for k in range(1, num_ranks.bit_length()) if (1 << k) <= num_ranks]
    blocks = [(start, size) for size in sizes for start in range(0, num_ranks - size + 1, size)]
    if num_ranks > 1 and num_ranks & (num_ranks - 1):
        blocks.append((0, num_ranks))
    return blocks


@dataclasses.dataclass
class CpGroups:
    """This rank's dynamic-CP process groups.

    Attributes:
        plane_rank: This rank's position in its plane (``dp_rank * cp_size + cp_rank``).
        num_ranks: Ranks of the plane (``dp_size * cp_size``).
        group_sizes: The block family the groups were made for.
        plane: The wrapper's gloo group over the plane, in plane-rank order (``None`` when
            the plane is one rank).
        blocks: ``(start, size)`` to process group, for every block of size > 1 holding
            this rank.
        external: Groups among ``blocks`` that the topology owns (static CP's replica
            group): held, never destroyed with the rest.
        released: The groups were destroyed (the iterator that made them ended or was
            closed).
    """

    plane_rank: int = 0
    num_ranks: int = 1
    group_sizes: GroupSizes = GroupSizes.POW2
    plane: Any = None
    blocks: dict[tuple[int, int], Any] = dataclasses.field(default_factory=dict)
    external: list[Any] = dataclasses.field(default_factory=list)
    released: bool = False

    def group(self, start: int, size: int) -> Any:
        """The process group of block ``[start, start + size)`` (``None`` for one rank).

        Raises:
            ConfigError: A block that does not hold this rank or was never created.
        """
        if size == 1 and start == self.plane_rank:
            return None
        group = self.blocks.get((int(start), int(size)))
        if group is None:
            raise ConfigError(
                f"no CP group for block start={start} size={size} on plane rank {self.plane_rank} of {self.num_ranks} "
                f"(group sizes {self.group_sizes.value!r}): the plan uses a block the wrapper did not create"
            )
        return group

    def owned(self) -> list[Any]:
        """Every group this rank created and holds (to destroy them)."""
        groups = (self.plane, *self.blocks.values())
        return [g for g in groups if g is not None and not any(g is e for e in self.external)]


def _planes(topology: Topology) -> dict[tuple[int, int], list[int]]:
    """Every plane of the world, keyed by (tp rank, pp rank): its global ranks DP-major,
    read from one all-gather of every rank's coordinates."""
    mine = (topology.tp_rank, topology.pp_rank, topology.dp_rank, topology.cp_rank)
    everyone = all_gather_objects(mine, dist.group.WORLD)
    cp = topology.cp_size
    planes: dict[tuple[int, int], list[int | None]] = {}
    for rank, (tp, pp, d, k) in enumerate(everyone):
        empty: list[int | None] = [None] * (topology.dp_size * cp)
        plane = planes.setdefault((int(tp), int(pp)), empty)
        if plane[d * cp + k] is not None:
            raise ConfigError(f"ranks {plane[d * cp + k]} and {rank} both claim dp={d} cp={k} tp={tp} pp={pp}")
        plane[d * cp + k] = rank
    out = {}
    for key, plane in planes.items():
        if any(rank is None for rank in plane):
            raise ConfigError(f"the dp x cp plane of tp={key[0]} pp={key[1]} is incomplete: {plane}")
        out[key] = [int(rank) for rank in plane if rank is not None]
    return out


def new_cp_groups(
    topology: Topology,
    group_sizes: GroupSizes | str = GroupSizes.POW2,
    *,
    backend: str | None = None,
    timeout: datetime.timedelta | None = None,
) -> CpGroups:
    """Create the dynamic-CP groups (module docstring) for the blocks of ``group_sizes``;
    collective over the default group, which ``topology`` must span. ``backend`` is the block
    groups' (``None``: the default group's), ``timeout`` the gloo plane groups'.

    Raises:
        ConfigError: ``torch.distributed`` not initialised while the plane has several
            ranks, a topology that does not span the default group, or more than
            :data:`MAX_CP_GROUPS` groups.
    """
    mode = check_choice("group_sizes", group_sizes, GroupSizes)
    num_ranks = topology.dp_size * topology.cp_size
    plane_rank = topology.dp_rank * topology.cp_size + topology.cp_rank
    out = CpGroups(plane_rank=plane_rank, num_ranks=num_ranks, group_sizes=mode)
    if num_ranks == 1:
        return out
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("dynamic CP over several ranks needs torch.distributed to be initialised")
    world = dist.get_world_size()
    if topology.world_size != world:
        raise ConfigError(
            f"dynamic CP creates its process groups over the whole default group ({world} ranks) but this topology "
            f"spans {topology.world_size}"
        )
    blocks = plane_blocks(num_ranks, mode)
    planes = _planes(topology)
    count = len(planes) * (len(blocks) + 1)
    if count > MAX_CP_GROUPS:
        raise ConfigError(
            f"dynamic CP's group_sizes={mode.value!r} over {num_ranks} ranks needs {count} process groups (more "
            f"than {MAX_CP_GROUPS}); use scheduler_options={{'group_sizes': 'pow2'}}"
        )
    me = dist.get_rank()
    for key in sorted(planes):
        ranks = planes[key]
        mine = me in ranks
        group = new_group(ranks, "gloo", timeout)
        if mine:
            out.plane = group
        for start, size in blocks:
            group = new_group(ranks[start : start + size], backend, None)
            if mine and start <= plane_rank < start + size:
                out.blocks[(start, size)] = group
    logger.info("dynamic CP: created %d process groups (%d planes of %d ranks)", count, len(planes), num_ranks)
    return out


def static_cp_groups(topology: Topology) -> CpGroups:
    """Static CP's groups: this rank's DP replica's CP block (the topology's CP group) and
    the whole plane's group, which ``Step.to_origin`` runs on (the topology's DP group when
    cp is 1, else one created here, collectively over the default group). The topology's
    groups are external: held, never destroyed here.
    """
    cp, dp = topology.cp_size, topology.dp_size
    out = CpGroups(
        plane_rank=topology.dp_rank * cp + topology.cp_rank,
        num_ranks=dp * cp,
        group_sizes=GroupSizes.STATIC,
    )
    own = topology.group("cp") if cp > 1 else None
    if own is not None:
        out.blocks[(topology.dp_rank * cp, cp)] = own
        out.external.append(own)
    if dp > 1 and cp == 1 and topology.group("dp") is not None:
        out.blocks[(0, dp)] = topology.group("dp")
        out.external.append(out.blocks[(0, dp)])
    if dp > 1 and cp > 1 and own is not None and topology.group("dp") is not None:
        # This plane's global ranks, DP-major, from the DP peers' CP lanes; then every plane.
        lanes = all_gather_objects(topology.global_ranks("cp"), topology.group("dp"))
        plane = [int(rank) for lane in lanes for rank in lane]
        planes = sorted({tuple(p) for p in all_gather_objects(plane, dist.group.WORLD)})
        for ranks in planes:
            group = new_group(list(ranks), None, None)
            if list(ranks) == plane:
                out.blocks[(0, dp * cp)] = group
        logger.info("static CP: created %d plane process groups of %d ranks", len(planes), dp * cp)
    return out
