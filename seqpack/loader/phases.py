"""The phases of one wrapper step on the ranks that read data, each a short function the
producer (:mod:`seqpack.loader.producer`) calls in turn: 1. :class:`Reader` (read and check
samples, labels to next-token targets), 2. :func:`gather` (lengths and per-sample columns
over DP), 3. :func:`schedule` (the same plan on every rank); 4. and 5., exchange and pack,
are :mod:`seqpack.loader.cp_mode`'s. A phase that fails raises; the producer turns it into
the step's agreed error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.collective import GatheredLengths, gather_lengths
from seqpack.cost import CostModel
from seqpack.errors import ResumeError, SampleError, ScheduleError
from seqpack.loader.config import PackingConfig, resolved_cost
from seqpack.loader.gather_fields import KEY_BITS, SAMPLE_COLUMNS, STEP_GATHER_FIELDS, keys_of, step_bytes_per_token
from seqpack.loader.grouping import GROUP_KEY, group_columns, group_id_of
from seqpack.loader.labels import loss_token_counts, prepare_labels
from seqpack.loader.sample_cost import step_sample_cost, vision_flops_column
from seqpack.loader.vision_payload import PAYLOAD_KEYS, read_sequences, vision_columns
from seqpack.options import LabelFormat, OnOversize
from seqpack.schedulers import Schedule, Scheduler
from seqpack.schedulers.minibatches import schedule_minibatches
from seqpack.schedulers.request import Request
from seqpack.schedulers.sample_groups import schedule_groups
from seqpack.thd import MRopeSpec
from seqpack.topology import Topology

__all__ = ["Gathered", "ReadResult", "Reader", "gather", "sample_columns", "schedule"]

Sample = dict[str, torch.Tensor]


@dataclasses.dataclass
class ReadResult:
    """What one read pulled: sequences (pre-packed samples split), end of data, and the
    zero-length sequences, which are not scheduled: how many, and where each was read."""

    samples: list[Sample]
    exhausted: bool = False
    empty: int = 0
    # Pool index of each zero-length sequence, in read order: where Step.to_origin puts it.
    empty_at: list[int] = dataclasses.field(default_factory=list)
    label_checked: int = 0  # labels read: checked tokens (the step's alignment guard)
    label_misaligned: int = 0  # ... and those aligned the other way than label_format


class Reader:
    """Pulls samples from the user's iterator, counts what it consumed (for resume) and
    brings labels in ``label_format`` to next-token targets (under ``mrope`` with their
    images and videos, :mod:`seqpack.loader.vision_payload`)."""

    def __init__(
        self,
        source: Iterable[Mapping[str, Any]],
        label_format: LabelFormat = LabelFormat.SHIFTED,
        mrope: MRopeSpec | None = None,
    ) -> None:
        self.source = source
        self.label_format = label_format
        self.mrope = mrope
        self._it: Iterator[Mapping[str, Any]] | None = None
        self.consumed = 0  # samples taken from the iterator
        self.skip = 0  # samples to fast-forward past before the next read (resume without state)

    @property
    def started(self) -> bool:
        return self._it is not None

    def read(self, count: int, pooled: int = 0) -> ReadResult:
        """Pull up to ``count`` samples (``pooled``: samples already in this step's pool).

        Raises:
            SampleError, SeqpackTypeError: A sample breaking the contract (named by index),
                ``"shifted"`` labels that copy ``input_ids`` among them.
            ResumeError: The iterator ended while fast-forwarding after a resume.
            Exception: Whatever the user's iterator raised.
        """
        if self._it is None:
            self._it = iter(self.source)
        if self.skip:
            for done in range(self.skip):
                try:
                    next(self._it)
                except StopIteration:
                    raise ResumeError(
                        f"resuming needs to skip {self.skip} consumed samples but the data iterator ended after {done}"
                    ) from None
            self.consumed += self.skip
            self.skip = 0
        result = ReadResult([])
        wheres: list[str] = []
        for _ in range(count):
            try:
                item = next(self._it)
            except StopIteration:
                result.exhausted = True
                break
            index = self.consumed
            self.consumed += 1
            where = (
                f"sample {index} of this rank's data (sequence {pooled + len(result.samples)} of its pool this step)"
            )
            group = group_id_of(item, where)
            for sequence in read_sequences(item, self.mrope, where=where, label_format=self.label_format):
                if group is not None:
                    sequence[GROUP_KEY] = torch.tensor(group, dtype=torch.int64)
                if sequence["input_ids"].shape[0] == 0:
                    result.empty += 1
                    result.empty_at.append(pooled + len(result.samples))
                else:
                    result.samples.append(sequence)
                    wheres.append(where)
        result.samples, result.label_checked, result.label_misaligned = prepare_labels(
            result.samples, wheres, self.label_format
        )
        return result


def key_mask(pool: Sequence[Sample]) -> int:
    """Bit mask of the keys every sample of ``pool`` carries.

    Raises:
        SampleError: Samples with different keys.
    """
    if not pool:
        return 0
    others = {GROUP_KEY, *PAYLOAD_KEYS}  # not token keys: samples may or may not carry a group id or images
    first = set(pool[0]) - others
    for i, sample in enumerate(pool):
        if set(sample) - others != first:
            raise SampleError(
                f"sequence {i} of this rank's pool this step has keys {sorted(sample)} but sequence 0 of it has "
                f"{sorted(first)}; all samples must carry the same keys"
            )
    return sum(KEY_BITS[k] for k in first)


@dataclasses.dataclass(frozen=True)
class Gathered:
    """The step's global view after the length gather, identical on every DP rank."""

    lengths: GatheredLengths
    key_mask: int  # keys every DP rank's samples carry
    exhausted: bool  # some DP rank's data ended this step
    empty_samples: int  # zero-length samples dropped on all DP ranks
    timings: np.ndarray | None = None  # int64 [dp, words]: every DP rank's microbatch time words
    label_checked: int = 0  # labels read this step on all DP ranks: checked tokens
    label_misaligned: int = 0  # ... and those aligned the other way than label_format

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.lengths.shape[0])

    @property
    def loss_tokens(self) -> np.ndarray:
        """int64 ``[N]``: supervised tokens of every global id once packed."""
        assert self.lengths.columns is not None
        return SAMPLE_COLUMNS.column(self.lengths.columns, "loss_tokens")


def longest_sequence(scheduler: Scheduler, config: PackingConfig, topology: Topology) -> int:
    """The longest sequence the step's plan holds (:meth:`Scheduler.longest_sequence`)."""
    assert config.pad_multiple is not None  # resolved by the wrapper
    return scheduler.longest_sequence(
        topology.dp_size, topology.cp_size, config.max_tokens_per_rank, config.pad_multiple
    )


def sample_columns(
    pool: Sequence[Sample], scheduler: Scheduler, config: PackingConfig, topology: Topology
) -> np.ndarray:
    """This rank's :data:`SAMPLE_COLUMNS` table (int64 ``[len(pool), k]``) for the gather."""
    truncate = config.on_oversize == OnOversize.TRUNCATE
    truncate_to = longest_sequence(scheduler, config, topology) if truncate else None
    grouped, group_id = group_columns(pool)
    return SAMPLE_COLUMNS.rows(
        len(pool),
        loss_tokens=loss_token_counts(pool, truncate_to),
        grouped=grouped,
        group_id=group_id,
        vision_bytes=vision_columns(pool, truncate_to),
        vision_flops=vision_flops_column(pool, config.model),
    )


def gather(
    pool: Sequence[Sample],
    read: ReadResult,
    mask: int,
    topology: Topology,
    error: str | None,
    timings: np.ndarray | None = None,
    columns: np.ndarray | None = None,
) -> Gathered:
    """All-gather the lengths of ``pool`` over DP and agree on keys, end of data, empties.

    ``columns``: this rank's :data:`SAMPLE_COLUMNS` table (ignored with ``error``).
    ``timings``: this rank's microbatch time words (the same count on every DP rank), which
    ride in the same all-gather and come back as ``Gathered.timings``.

    Raises:
        StepFailed: Some DP rank passed ``error`` (every rank raises it).
        SampleError: DP ranks disagree on the sample keys.
    """
    lengths = [int(s["input_ids"].shape[0]) for s in pool] if error is None else []
    if error is not None or columns is None:
        columns = np.zeros((len(lengths), SAMPLE_COLUMNS.words), dtype=np.int64)
    words = np.zeros(0, np.int64) if timings is None else np.asarray(timings, np.int64).reshape(-1)
    fields = STEP_GATHER_FIELDS.pack(
        exhausted=read.exhausted,
        empty_samples=read.empty,
        key_mask=mask,
        label_checked=read.label_checked,
        label_misaligned=read.label_misaligned,
    )
    extras = np.concatenate([fields, words])
    gathered = gather_lengths(lengths, topology.group("dp"), error=error, extras=extras, columns=columns)
    counts, table = gathered.counts, gathered.extras
    key_masks = STEP_GATHER_FIELDS.column(table, "key_mask")
    masks = key_masks[counts > 0]
    if masks.size and np.any(masks != masks[0]):
        listed = "; ".join(f"DP rank {r}: {keys_of(int(key_masks[r]))}" for r in range(counts.shape[0]) if counts[r])
        raise SampleError(f"DP ranks disagree on sample keys: {listed}")
    return Gathered(
        gathered,
        key_mask=int(masks[0]) if masks.size else 0,
        exhausted=bool(STEP_GATHER_FIELDS.column(table, "exhausted").any()),
        empty_samples=int(STEP_GATHER_FIELDS.column(table, "empty_samples").sum()),
        timings=None if timings is None else table[:, STEP_GATHER_FIELDS.words :].copy(),
        label_checked=int(STEP_GATHER_FIELDS.column(table, "label_checked").sum()),
        label_misaligned=int(STEP_GATHER_FIELDS.column(table, "label_misaligned").sum()),
    )


def schedule(
    scheduler: Scheduler,
    config: PackingConfig,
    topology: Topology,
    gathered: Gathered,
    cost: CostModel | None = None,
    encoder_price: float | None = None,
) -> tuple[Schedule, list[int]]:
    """The step's schedule, identical on every rank, and the microbatch offsets of its
    ``config.minibatches`` mini-batches (``[0, M]`` for one). ``cost``: the calibrated model,
    which replaces the config's; ``encoder_price``: its price of a vision-encoder FLOP.

    Raises:
        ScheduleError: The scheduler refused the lengths (an oversize sequence is located in
            its rank's pool), a mini-batch without sequences, or a scheduler bug (reported,
            never stranding a rank).
    """
    lengths = gathered.lengths
    assert config.pad_multiple is not None  # resolved by the wrapper
    columns = lengths.columns
    assert columns is not None
    grouped = SAMPLE_COLUMNS.column(columns, "grouped")
    group_args: dict[str, Any] = dict(
        group_ids=SAMPLE_COLUMNS.column(columns, "group_id"),
        grouped=grouped.astype(bool),
        together=config.group_microbatch,
        equal_counts=config.equal_samples_per_replica,
    )
    chosen = config.cost if cost is None else cost
    sample_cost = step_sample_cost(
        SAMPLE_COLUMNS.column(columns, "vision_flops"),
        SAMPLE_COLUMNS.column(columns, "vision_bytes"),
        resolved_cost(config, scheduler) if chosen is None else chosen,
        config.model,
        encoder_price,
    )
    try:
        request = Request.of(
            lengths.lengths,
            dp_size=topology.dp_size,
            cp_size=topology.cp_size,
            max_tokens_per_rank=config.max_tokens_per_rank,
            pad_multiple=config.pad_multiple,
            cost=chosen,
            on_oversize=config.on_oversize,
            origin=lengths.origin(),
            sync=config.sync,
            bytes_per_token=step_bytes_per_token(gathered.key_mask, lengths.lengths, columns),  # what moves
            static_shapes=config.static_shapes,
            sample_cost=sample_cost,  # the vision encoder's, balanced with the tokens'
        )
        if config.minibatches > 1:
            return schedule_minibatches(scheduler, request, minibatches=config.minibatches, **group_args)
        if grouped.any() or config.equal_samples_per_replica:  # keep groups on one replica
            plan = schedule_groups(scheduler, request, **group_args)
        else:
            plan = scheduler.plan(request)
        return plan, [0, plan.num_microbatches]
    except ValueError as exc:  # ConfigError included: a mini-batch without samples
        raise ScheduleError(f"{exc}{_locate_oversize(scheduler, config, topology, lengths)}") from exc
    except Exception as exc:  # a scheduler bug must still reach every rank, not strand them
        raise ScheduleError(f"scheduler {scheduler!r} failed: {type(exc).__name__}: {exc}") from exc


def _locate_oversize(scheduler: Scheduler, config: PackingConfig, topology: Topology, gathered: GatheredLengths) -> str:
    over = np.flatnonzero(gathered.lengths > longest_sequence(scheduler, config, topology))
    if not over.size:
        return ""
    g = int(over[0])
    r = int(gathered.origin()[g])
    return f" [global sample {g} is sequence {g - int(gathered.offsets[r])} of DP rank {r}'s pool this step]"


def deferred_samples(pool: Sequence[Sample], plan: Schedule, gathered: Gathered, topology: Topology) -> list[Sample]:
    """This rank's samples the schedule holds back for the next step, in pool order."""
    offset = int(gathered.lengths.offsets[topology.dp_rank])
    ids = plan.deferred[(plan.deferred >= offset) & (plan.deferred < offset + len(pool))]
    return [pool[g - offset] for g in np.sort(ids).tolist()]


def carries_position_ids(mask: int) -> bool:
    return bool(mask & KEY_BITS["position_ids"])
