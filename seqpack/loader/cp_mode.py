"""The iterator's CP mode: the exchange and pack phases of a wrapper step, one path for
static and dynamic CP, with the CP process groups the mode decides once.

Every plan is rounds of CP groups over the plane's ``R = dp x cp`` ranks (static CP: the
replicas' CP blocks in every round). :meth:`CpMode.exchange` gets every rank its shard of
each sequence its group runs; :meth:`CpMode.pack` builds this rank's shard of its group's
microbatch in every round (a padding-only filler's when the group runs nothing), carrying
``cp_size``, ``cp_rank`` and ``cp_group``. The modes differ only in their process groups:
:class:`StaticCp`'s pieces never leave their CP lane (the exchange runs over the wrapper's DP
group); :class:`DynamicCp`'s run over the plane, and the wire carries each round's group
start to TP receivers and middle pipeline stages (:meth:`CpMode.group_starts`,
:meth:`CpMode.attach`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.collective import Exchanged
from seqpack.collective.cp_groups import CpGroups, new_cp_groups, static_cp_groups
from seqpack.collective.exchange import exchange_shards
from seqpack.collective.payloads import exchange_payloads
from seqpack.errors import ConfigError
from seqpack.loader.config import PackingConfig
from seqpack.loader.gather_fields import SAMPLE_COLUMNS
from seqpack.loader.grouping import GROUP_KEY
from seqpack.loader.phases import Gathered, Sample, carries_position_ids
from seqpack.loader.vision_payload import decode, encode, split_payload, with_vision
from seqpack.options import CpLayout
from seqpack.schedulers import Schedule, Scheduler
from seqpack.schedulers.dynamic_cp.pieces import shard_layout
from seqpack.thd import (
    IGNORE_INDEX,
    PackedBatch,
    StaticShapes,
    batch_from_layout,
    group_pad_multiple,
    padding_only_batch,
)
from seqpack.thd.cp import shard_for_cp
from seqpack.topology import Topology

__all__ = ["CpMode", "DynamicCp", "StaticCp", "cp_mode"]


class CpMode:
    """The exchange and pack phases of this rank's steps (module docstring): ``groups``, the
    model's CP process groups the batches carry; ``exchange_group``, the wrapper's group the
    exchange runs over (the plane's, or the DP group when every piece stays in its CP ``lane``).
    """

    def __init__(
        self, config: PackingConfig, topology: Topology, groups: CpGroups, exchange_group: Any, *, lane: bool
    ) -> None:
        assert config.pad_multiple is not None
        self.config, self.topology, self.groups = config, topology, groups
        self.exchange_group, self.lane = exchange_group, lane

    def exchange(self, pool: Sequence[Sample], plan: Schedule, gathered: Gathered) -> Exchanged | None:
        """Every shard of the step to the rank that runs it; ``None`` on a middle pipeline
        stage whose samples carry no position ids (it packs the layout alone)."""
        position_ids = carries_position_ids(gathered.key_mask)
        if self.topology.is_middle_stage and not position_ids:
            return None
        if any(GROUP_KEY in sample for sample in pool):
            pool = [{key: value for key, value in sample.items() if key != GROUP_KEY} for sample in pool]
        payloads: list[dict[str, torch.Tensor]] = []
        if self.config.mrope is not None:  # pixels travel beside the tokens (seqpack.loader.vision_payload)
            split = [split_payload(sample) for sample in pool]
            pool, payloads = [tokens for tokens, _ in split], [payload for _, payload in split]
        failure: Exception | None = None
        spans = plan.packed_spans(self.config.static_shapes)
        try:
            exchanged = exchange_shards(
                pool,
                plan,
                gathered.lengths.counts,
                self.exchange_group,
                rank=self.groups.plane_rank,
                position_ids=position_ids,
                spans=spans,
                layout=self.config.cp_layout,
                lane=self.lane,
            )
        except Exception as exc:  # the payloads' all-to-all still runs on this rank: no peer waits in it
            failure, exchanged = exc, Exchanged({})
        if self.config.mrope is not None:
            self._move_payloads(exchanged, payloads, plan, spans, gathered)
        if failure is not None:
            raise failure
        return exchanged

    def _move_payloads(
        self,
        exchanged: Exchanged,
        payloads: Sequence[Mapping[str, torch.Tensor]],
        plan: Schedule,
        spans: np.ndarray,
        gathered: Gathered,
    ) -> None:
        """Every vision payload to the rank that runs its sample (CP 1: DP rank = plane rank),
        into ``exchanged.payloads``, its bytes counted in the traffic."""
        counts = np.asarray(gathered.lengths.counts, dtype=np.int64)
        me = self.groups.plane_rank
        offset = int(counts[:me].sum())
        assert gathered.lengths.columns is not None
        sizes = SAMPLE_COLUMNS.column(gathered.lengths.columns, "vision_bytes")
        src = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
        start, size, _ = shard_layout(plan, spans)
        dst = np.where(size > 0, start, -1)
        received, sent, got = exchange_payloads(
            lambda gid: encode(payloads[gid - offset]),
            sizes,
            src,
            dst,
            self.exchange_group,
            rank=me,
            num_ranks=counts.shape[0],
        )
        kept = np.flatnonzero((src == me) & (dst == me) & (sizes > 0))
        exchanged.payloads = {gid: decode(data) for gid, data in received.items()}
        exchanged.payloads.update((gid, dict(payloads[gid - offset])) for gid in kept.tolist())
        exchanged.bytes_sent += sent
        exchanged.bytes_received += got
        exchanged.bytes_kept += int(sizes[kept].sum())

    def pack(self, plan: Schedule, exchanged: Exchanged | None, gathered: Gathered) -> list[PackedBatch]:
        """This rank's shard of its group's microbatch in every round; ``num_loss_tokens``
        of each is the gathered count of its whole pack."""
        config, me = self.config, self.groups.plane_rank
        layout = _Layout(plan, config.static_shapes)
        out = []
        for g in plan.rank_group()[:, me].tolist():
            ids = plan.group_ids(g)
            start, size = int(plan.group_start[g]), int(plan.group_size[g])
            if ids.size == 0:
                batch = shard_for_cp(layout.filler(size), size, me - start, layout=config.cp_layout)
            elif exchanged is None:
                batch = batch_from_layout(*layout.of(ids), size, me - start, cp_layout=config.cp_layout)
            else:
                shards = [exchanged.samples[gid] for gid in ids.tolist()]
                batch = _from_shards(shards, layout.of(ids), size, me - start, config.cp_layout)
            if config.mrope is not None:  # CP 1, no pipeline stages (vision_payload.check_topology)
                assert exchanged is not None
                payloads = [exchanged.payloads.get(gid, {}) for gid in ids.tolist()]
                shards = [exchanged.samples[gid] for gid in ids.tolist()]
                batch = with_vision(batch, shards, payloads, plan.lengths[ids].tolist(), config.mrope)
            count = int(gathered.loss_tokens[ids].sum())
            out.append(dataclasses.replace(batch, num_loss_tokens=count, cp_group=self.groups.group(start, size)))
        if self.topology.is_middle_stage:  # the layout is all it needs
            out = [dataclasses.replace(b, input_ids=None, labels=None, loss_mask=None) for b in out]
        return out

    def group_starts(self, plan: Schedule) -> tuple[int, ...] | None:
        """The plane rank this rank's group starts at, every round, when the wire carries it."""
        return None

    def attach(self, batches: Sequence[PackedBatch], starts: Sequence[int]) -> list[PackedBatch]:
        """Batches decoded from the wire with this rank's process group of each one's block."""
        return list(batches)


def cp_mode(
    config: PackingConfig,
    topology: Topology,
    comm: Topology,
    scheduler: Scheduler,
    *,
    timeout: datetime.timedelta | None = None,
) -> CpMode:
    """The CP mode ``config`` runs on this rank, with its CP process groups (collective where
    it creates groups); ``comm``: the topology whose groups the wrapper's collectives use;
    ``scheduler``: the config's :meth:`~seqpack.loader.config.PackingConfig.build_scheduler`."""
    if config.dynamic_cp:
        groups = new_cp_groups(topology, scheduler.group_sizes, timeout=timeout)
        return DynamicCp(config, topology, groups)
    return StaticCp(config, comm, static_cp_groups(topology))


class StaticCp(CpMode):
    """Static CP: every group is a replica's CP block; the exchange runs over ``comm``'s DP group."""

    def __init__(self, config: PackingConfig, comm: Topology, groups: CpGroups) -> None:
        super().__init__(config, comm, groups, comm.group("dp"), lane=True)


class DynamicCp(CpMode):
    """Dynamic CP (``dynamic_cp=True``): the exchange runs over the wrapper's plane group."""

    def __init__(self, config: PackingConfig, topology: Topology, groups: CpGroups) -> None:
        super().__init__(config, topology, groups, groups.plane, lane=False)

    def group_starts(self, plan: Schedule) -> tuple[int, ...]:
        """The plane rank this rank's group starts at, every round (what the wire carries)."""
        rounds = plan.rank_group()[:, self.groups.plane_rank]
        return tuple(int(v) for v in plan.group_start[rounds])

    def attach(self, batches: Sequence[PackedBatch], starts: Sequence[int]) -> list[PackedBatch]:
        """Batches decoded from the wire with this rank's process group of each one's block.

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


class _Layout:
    """A plan's microbatch layouts: each sequence in its span (``Schedule.packed_spans``), in
    ``static_shapes``' bucket and slots when given."""

    def __init__(self, plan: Schedule, static: StaticShapes | None) -> None:
        self.plan, self.static = plan, static
        self.spans = plan.packed_spans() if static is None else None  # fixed shapes lay out their own

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """``(cu_seqlens, cu_seqlens_padded, max_seqlen, sample_ids)`` of the pack of ``ids``."""
        plan, lengths = self.plan, self.plan.lengths[ids]
        if self.static is not None:
            cu, cu_padded, bucket = self.static.layout(lengths, plan.pad_multiple, plan.capacity)
            slot_ids = np.full(self.static.max_sequences, -1, dtype=np.int64)
            slot_ids[: ids.shape[0]] = ids
            return cu, cu_padded, bucket, slot_ids
        assert self.spans is not None
        spans = self.spans[ids]
        cu = np.concatenate([[0], np.cumsum(lengths)])
        return cu, np.concatenate([[0], np.cumsum(spans)]), int(spans.max()), ids

    def filler(self, size: int) -> PackedBatch:
        """A padding-only microbatch of the smallest size (bucket) a group of ``size`` ranks
        runs (under dynamic CP padded by its group's rule)."""
        if self.static is None:
            pad = self.plan.pad_multiple
            return padding_only_batch(pad if self.plan.is_static else group_pad_multiple(size, pad))
        return padding_only_batch(self.static.buckets(self.plan.capacity)[0], slots=self.static.max_sequences)


def _from_shards(
    shards: Sequence[Mapping[str, torch.Tensor]],
    layout: tuple[np.ndarray, np.ndarray, int, np.ndarray],
    size: int,
    rank: int,
    cp_layout: CpLayout,
) -> PackedBatch:
    """CP rank ``rank``'s shard (of ``size``) of the pack in ``layout`` from each sequence's
    shard, in pack order: a fixed shape's tail slot, which no sequence holds, is pads (label
    -100, loss mask 0) at the end of every shard."""
    cu, cu_padded, max_seqlen, slot_ids = layout
    have = sum(int(shard["input_ids"].shape[0]) for shard in shards)
    tail = int(cu_padded[-1]) // size - have
    fields = {}
    for key, pad in (("input_ids", 0), ("labels", IGNORE_INDEX), ("loss_mask", 0)):
        parts = [shard[key] for shard in shards]
        if tail:  # one concatenation with the tail's pads
            parts.append(parts[0].new_full((tail,), pad))
        fields[key] = torch.cat(parts)
    batch = batch_from_layout(
        cu,
        cu_padded,
        max_seqlen,
        slot_ids,
        size,
        rank,
        cp_layout=cp_layout,
        input_ids=fields["input_ids"],
        labels=fields["labels"],
        loss_mask=fields["loss_mask"],
    )
    if "position_ids" in shards[0]:  # the samples' own; the tail slot's count from 0, as the layout's
        positions = batch.position_ids.clone()
        positions[:have] = torch.cat([shard["position_ids"] for shard in shards])
        batch = dataclasses.replace(batch, position_ids=positions)
    return batch
