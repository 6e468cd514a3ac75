"""Dynamic context parallelism as stages of a wrapper step (``PackingConfig(dynamic_cp=True)``).

The producer (:mod:`seqpack.loader.producer`) runs these instead of phases 3-5 of
:mod:`seqpack.loader.phases` (read and gather are the same):

3. :meth:`DynamicCp.schedule`: the config's :class:`~seqpack.schedulers.DynamicCpScheduler`
   (:func:`~seqpack.schedulers.dynamic_cp.plan_dynamic_cp`) over the ``dp x cp`` ranks of this
   lane, the same plan on every rank;
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
from typing import Any

import numpy as np
import torch

from seqpack.collective import Exchanged, GatheredLengths
from seqpack.collective.cp_exchange import exchange_shards
from seqpack.collective.cp_groups import CpGroups
from seqpack.errors import ConfigError, ScheduleError
from seqpack.loader.config import PackingConfig
from seqpack.loader.gather_fields import SAMPLE_COLUMNS
from seqpack.loader.grouping import GROUP_KEY
from seqpack.loader.phases import Gathered, Sample, carries_position_ids
from seqpack.options import Sync
from seqpack.schedulers.dynamic_cp import DynamicCpSchedule, GroupCost
from seqpack.schedulers.dynamic_cp.groups import plan_with_groups
from seqpack.schedulers.dynamic_cp.minibatches import plan_minibatches
from seqpack.schedulers.dynamic_cp.padding import group_padded_lengths, longest_sequence
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.dynamic_cp.stats import plan_stats
from seqpack.stats import StepStats
from seqpack.thd import PackedBatch, batch_from_layout, padding_only_batch
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
        self.cost: GroupCost = config.group_cost
        self.sync = config.sync or Sync.LOCKSTEP
        scheduler = config.build_scheduler()
        assert isinstance(scheduler, DynamicCpScheduler)
        self.scheduler = scheduler

    def schedule(self, gathered: Gathered, cost: GroupCost | None = None) -> tuple[DynamicCpSchedule, list[int] | None]:
        """The step's plan, identical on every rank, with ``origin`` from the gather
        (``cost``: the calibrated :class:`GroupCost`, which replaces the config's), and with
        ``minibatches > 1`` the round offsets of its mini-batches
        (:func:`~seqpack.schedulers.dynamic_cp.minibatches.plan_minibatches`; else ``None``).

        Raises:
            ScheduleError: An oversize sequence (located in its DP rank's pool), or a planner
                failure (reported, never stranding a rank).
        """
        config, t, lengths = self.config, self.topology, gathered.lengths
        assert config.pad_multiple is not None
        options: dict[str, Any] = dict(
            dp_size=t.dp_size,
            cp_size=t.cp_size,
            max_tokens_per_rank=config.max_tokens_per_rank,
            pad_multiple=config.pad_multiple,
            cost=cost or self.cost,
            on_oversize=config.on_oversize,
            origin=lengths.origin(),
            sync=self.sync,
        )
        columns = lengths.columns
        assert columns is not None
        grouped = SAMPLE_COLUMNS.column(columns, "grouped").astype(bool)
        groups: dict[str, Any] = dict(group_ids=SAMPLE_COLUMNS.column(columns, "group_id"), grouped=grouped)
        try:
            if config.minibatches > 1:
                minibatches = config.minibatches
                return plan_minibatches(self.scheduler, lengths.lengths, minibatches=minibatches, **groups, **options)
            if grouped.any():
                return plan_with_groups(self.scheduler, lengths.lengths, **groups, **options), None
            return self.scheduler.schedule(lengths.lengths, **options), None
        except ValueError as exc:
            raise ScheduleError(f"{exc}{self._locate_oversize(lengths)}") from exc
        except Exception as exc:  # a planner bug must still reach every rank
            raise ScheduleError(f"the dynamic CP planner failed: {type(exc).__name__}: {exc}") from exc

    def _locate_oversize(self, gathered: GatheredLengths) -> str:
        config, t = self.config, self.topology
        assert config.pad_multiple is not None
        ranks = t.dp_size * t.cp_size
        longest = longest_sequence(ranks, config.cp_group_sizes, config.max_tokens_per_rank, config.pad_multiple)
        over = np.flatnonzero(gathered.lengths > longest)
        if not over.size:
            return ""
        g = int(over[0])
        r = int(gathered.origin()[g])
        return f" [global sample {g} is sequence {g - int(gathered.offsets[r])} of DP rank {r}'s pool this step]"

    def exchange(self, pool: Sequence[Sample], plan: DynamicCpSchedule, gathered: Gathered) -> Exchanged:
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

    def pack(self, plan: DynamicCpSchedule, exchanged: Exchanged, loss_tokens: np.ndarray) -> list[PackedBatch]:
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

    def group_starts(self, plan: DynamicCpSchedule) -> tuple[int, ...]:
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

    def stats(self, plan: DynamicCpSchedule, empty_samples: int, cost: GroupCost | None = None) -> StepStats:
        """The step's stats in the units of the group cost it was planned with (``cost``,
        the calibrated one, else the config's), with its predicted step time."""
        return plan_stats(plan, cost or self.cost, sync=self.sync, empty_samples=empty_samples)
