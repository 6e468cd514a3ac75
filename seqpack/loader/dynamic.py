"""Dynamic context parallelism as stages of a wrapper step (``PackingConfig(dynamic_cp=True)``).

The producer (:mod:`seqpack.loader.producer`) runs these instead of phases 4-5 of
:mod:`seqpack.loader.phases` (read, gather and schedule are the same):

3. the schedule phase is :func:`seqpack.loader.phases.schedule` with the config's
   :class:`~seqpack.schedulers.DynamicCpScheduler` (the same plan on every rank);
4. :meth:`DynamicCp.exchange`: every rank of a sequence's group gets its shard
   (:func:`~seqpack.collective.cp_exchange.exchange_shards`, on the wrapper's plane group);
5. :meth:`DynamicCp.pack`: per round, this rank's shard of its group's microbatch, carrying
   ``cp_size``, ``cp_rank`` and ``cp_group`` (the model's process group of that block;
   ``None`` alone). An idle rank runs a padding-only filler alone.

Receivers of the TP broadcast and middle pipeline stages get the groups from the wire header
(:meth:`DynamicCp.attach`): each pipeline stage runs the same plan on its own plane's groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.collective import Exchanged
from seqpack.collective.cp_exchange import exchange_shards
from seqpack.collective.cp_groups import CpGroups
from seqpack.cost import GroupCost
from seqpack.errors import ConfigError
from seqpack.loader.config import PackingConfig
from seqpack.loader.grouping import GROUP_KEY
from seqpack.loader.phases import Gathered, Sample, carries_position_ids
from seqpack.schedulers import Schedule
from seqpack.thd import PackedBatch, batch_from_layout, group_padded_lengths, padding_only_batch
from seqpack.topology import Topology

__all__ = ["DynamicCp"]


class DynamicCp:
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

    def pack(self, plan: Schedule, exchanged: Exchanged, loss_tokens: np.ndarray) -> list[PackedBatch]:
        """This rank's microbatch of every round (module docstring); ``num_loss_tokens`` of
        each is the gathered count of its whole group's pack."""
        me, pad = self.groups.plane_rank, plan.pad_multiple
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
