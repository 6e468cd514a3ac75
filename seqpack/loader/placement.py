"""Where a step's samples go and how this rank packs them: the exchange and pack stages of a
wrapper step, one interface (:class:`Placement`) for static and dynamic CP.

The loader decides the mode once (:func:`placement`, when the iterator is built); the producer
(:mod:`seqpack.loader.producer`) calls the same four methods either way:

- :meth:`Placement.exchange`: move the samples to the ranks that run them;
- :meth:`Placement.pack`: this rank's microbatch of every round;
- :meth:`Placement.group_starts`: the plane rank this rank's group starts at, every round,
  when the wire must carry it (dynamic CP);
- :meth:`Placement.attach`: batches decoded from the wire with this rank's process group of
  each one's block (TP receivers, middle pipeline stages).

:class:`StaticCp` (every group a replica's CP block): the exchange of
:func:`seqpack.loader.phases.exchange` over this rank's DP group (one CP lane), then
:func:`seqpack.loader.phases.pack` cuts this rank's CP shard of its replica's microbatches in
``config.cp_layout``; a middle pipeline stage without position ids packs the layout alone.

:class:`DynamicCp` (``PackingConfig(dynamic_cp=True)``): every rank of a sequence's group
gets its DualChunkSwap shard (:func:`~seqpack.collective.cp_exchange.exchange_shards`, on the
wrapper's plane group); per round, this rank's shard of its group's microbatch, carrying
``cp_size``, ``cp_rank`` and ``cp_group`` (the model's process group of that block; ``None``
alone). An idle rank runs a padding-only filler alone. Receivers of the TP broadcast and
middle pipeline stages get the groups from the wire header: each pipeline stage runs the same
plan on its own plane's groups.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.collective import Exchanged
from seqpack.collective.cp_exchange import exchange_shards
from seqpack.collective.cp_groups import CpGroups, new_cp_groups, static_cp_groups
from seqpack.cost import GroupCost
from seqpack.errors import ConfigError
from seqpack.loader import phases
from seqpack.loader.config import PackingConfig
from seqpack.loader.grouping import GROUP_KEY
from seqpack.loader.phases import Gathered, Sample, carries_position_ids
from seqpack.schedulers import Schedule
from seqpack.thd import PackedBatch, batch_from_layout, group_padded_lengths, padding_only_batch
from seqpack.topology import Topology

__all__ = ["DynamicCp", "Placement", "StaticCp", "placement"]


class Placement(abc.ABC):
    """The exchange and pack stages of this rank's steps (module docstring).

    Attributes:
        groups: The model's CP process groups of every block the plans use (and the whole
            plane's), which the batches carry and ``Step.to_origin`` runs on.
    """

    groups: CpGroups

    @abc.abstractmethod
    def exchange(self, pool: Sequence[Sample], plan: Schedule, gathered: Gathered) -> Exchanged | None:
        """Every sample (or shard) of the step to the rank that runs it; ``None`` where this
        rank needs none (a middle pipeline stage packing the layout alone)."""

    @abc.abstractmethod
    def pack(self, plan: Schedule, exchanged: Exchanged | None, gathered: Gathered) -> list[PackedBatch]:
        """This rank's microbatch of every round; ``num_loss_tokens`` of each is the gathered
        count of its whole pack."""

    def group_starts(self, plan: Schedule) -> tuple[int, ...] | None:
        """The plane rank this rank's group starts at, every round, when the wire carries it."""
        return None

    def attach(self, batches: Sequence[PackedBatch], starts: Sequence[int]) -> list[PackedBatch]:
        """Batches decoded from the wire with this rank's process group of each one's block."""
        return list(batches)


def placement(
    config: PackingConfig, topology: Topology, comm: Topology, *, timeout: datetime.timedelta | None = None
) -> Placement:
    """The stages ``config`` runs on this rank, with their CP process groups: :class:`DynamicCp`
    under ``dynamic_cp`` (:func:`~seqpack.collective.cp_groups.new_cp_groups`), else
    :class:`StaticCp` (:func:`~seqpack.collective.cp_groups.static_cp_groups`). Collective
    over the default group where it creates groups (every rank, the same config); ``comm``: the
    topology whose groups the wrapper's collectives use; ``timeout``: of the wrapper's groups."""
    if config.dynamic_cp:
        return DynamicCp(config, topology, new_cp_groups(topology, config.cp_group_sizes, timeout=timeout))
    return StaticCp(config, comm, static_cp_groups(topology))


class StaticCp(Placement):
    """Static CP's stages (module docstring).

    Args:
        config: The resolved config.
        comm: The topology whose groups the exchange runs on (the wrapper's own under prefetch).
        groups: Static CP's process groups (:func:`~seqpack.collective.cp_groups.static_cp_groups`).
    """

    def __init__(self, config: PackingConfig, comm: Topology, groups: CpGroups) -> None:
        self.config, self.comm, self.groups = config, comm, groups

    def exchange(self, pool: Sequence[Sample], plan: Schedule, gathered: Gathered) -> Exchanged | None:
        if self.comm.is_middle_stage and not carries_position_ids(gathered.key_mask):
            return None  # the layout is all a middle stage needs
        return phases.exchange(pool, plan, gathered, self.comm)

    def pack(self, plan: Schedule, exchanged: Exchanged | None, gathered: Gathered) -> list[PackedBatch]:
        config = self.config
        return phases.pack(
            plan,
            exchanged,
            self.comm,
            config.pad_multiple or 1,
            gathered.loss_tokens,
            config.cp_layout,
            config.static_shapes,
        )


class DynamicCp(Placement):
    """The dynamic-CP stages of this rank's steps (module docstring).

    Args:
        config: The resolved config (``dynamic_cp=True``).
        topology: This rank's grid.
        groups: The dynamic-CP process groups (:func:`~seqpack.collective.cp_groups.new_cp_groups`).
    """

    def __init__(self, config: PackingConfig, topology: Topology, groups: CpGroups) -> None:
        assert isinstance(config.group_cost, GroupCost) and config.pad_multiple is not None
        self.config, self.topology, self.groups = config, topology, groups

    def exchange(self, pool: Sequence[Sample], plan: Schedule, gathered: Gathered) -> Exchanged:
        """Every piece of the step to the rank that runs it, over the plane group (a
        sample's ``group_id`` is read at the gather and not moved)."""
        if any(GROUP_KEY in sample for sample in pool):
            pool = [{key: value for key, value in sample.items() if key != GROUP_KEY} for sample in pool]
        return exchange_shards(
            pool,
            plan,
            gathered.lengths.counts,
            self.groups.plane,
            rank=self.groups.plane_rank,
            position_ids=carries_position_ids(gathered.key_mask),
        )

    def pack(self, plan: Schedule, exchanged: Exchanged | None, gathered: Gathered) -> list[PackedBatch]:
        """This rank's microbatch of every round (module docstring); ``num_loss_tokens`` of
        each is the gathered count of its whole group's pack."""
        assert exchanged is not None  # every rank of the plane exchanges
        me, pad, loss_tokens = self.groups.plane_rank, plan.pad_multiple, gathered.loss_tokens
        out = []
        for g in plan.rank_group()[:, me].tolist():
            ids = plan.group_ids(g)
            if ids.size == 0:
                out.append(padding_only_batch(pad))
                continue
            start, size = int(plan.group_start[g]), int(plan.group_size[g])
            lengths = plan.lengths[ids]
            padded = group_padded_lengths(lengths, size, pad)
            shards = [exchanged.samples[gid] for gid in ids.tolist()]
            fields = {key: torch.cat([shard[key] for shard in shards]) for key in shards[0]}
            batch = batch_from_layout(
                np.concatenate([[0], np.cumsum(lengths)]),
                np.concatenate([[0], np.cumsum(padded)]),
                int(padded.max()),
                ids,
                size,
                me - start,
                input_ids=fields["input_ids"],
                labels=fields["labels"],
                loss_mask=fields["loss_mask"],
                position_ids=fields.get("position_ids"),
            )
            group = self.groups.group(start, size)
            count = int(loss_tokens[ids].sum())
            out.append(dataclasses.replace(batch, num_loss_tokens=count, cp_group=group))
        if self.topology.is_middle_stage:  # under data_owner="all": the layout is all it needs
            out = [dataclasses.replace(b, input_ids=None, labels=None, loss_mask=None) for b in out]
        return out

    def group_starts(self, plan: Schedule) -> tuple[int, ...]:
        """The plane rank this rank's group starts at, every round (what the wire carries)."""
        rounds = plan.rank_group()[:, self.groups.plane_rank]
        return tuple(int(v) for v in plan.group_start[rounds])

    def attach(self, batches: Sequence[PackedBatch], starts: Sequence[int]) -> list[PackedBatch]:
        """Batches decoded from the wire with this rank's process group of each one's block
        (``starts``: the plane rank each group begins at, from the header).

        Raises:
            ConfigError: A shard that is not this plane rank's (the TP group pairs ranks at
                different places of their planes).
        """
        me, out = self.groups.plane_rank, []
        for m, (batch, start) in enumerate(zip(batches, starts, strict=True)):
            if start + batch.cp_rank != me:
                raise ConfigError(
                    f"microbatch {m} arrived as CP rank {batch.cp_rank} of a group starting at plane rank {start}, but "
                    f"this rank is plane rank {me}: the tp / pp group pairs ranks of different dp/cp positions"
                )
            out.append(dataclasses.replace(batch, cp_group=self.groups.group(start, batch.cp_size)))
        return out
