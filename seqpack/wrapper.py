"""wrap_data_iterator: the per-step composition of seqpack's pieces, resumable.

Every ``next()`` is collective over the whole topology (call it on every rank):

1. readers pull ``samples_per_rank`` samples (pre-packed ones are split into their
   sequences, zero-length ones dropped and counted) and validate them locally;
2. :func:`~seqpack.comm.gather_lengths` over DP (a bad sample or end of data on any rank
   reaches every rank here);
3. the scheduler computes the same schedule on every rank;
4. :func:`~seqpack.comm.exchange_samples` moves samples inside each CP lane;
5. each replica packs its microbatches (:func:`~seqpack.thd.pack_sequences`) and cuts its
   CP shard (:func:`~seqpack.cp.shard_for_cp`); empty cells get a padding-only filler;
6. :func:`~seqpack.comm.broadcast_tp` (``data_owner="tp0"``) and
   :func:`~seqpack.comm.broadcast_pp` (layout for middle stages), in the int64 wire format.

Who reads data: with ``data_owner="tp0"`` TP rank 0 of the first and the last pipeline
stage, on every DP and CP rank (the CP ranks of one replica read identical samples, as
Megatron's samplers do); with ``"all"`` every rank reads identical data for its DP rank and
nothing is broadcast. Others pass ``data_iterator=None``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.comm import (
    STATUS_END,
    STATUS_ERROR,
    STATUS_OK,
    StepMessage,
    agree_status,
    batch_from_layout,
    broadcast_pp,
    broadcast_tp,
    exchange_samples,
    gather_lengths,
)
from seqpack.cost import CostModel, default_cost_model
from seqpack.cp import shard_for_cp
from seqpack.schedulers import ON_OVERSIZE, Schedule, Scheduler, get_scheduler
from seqpack.stats import StepStats
from seqpack.thd import (
    PackedBatch,
    pack_sequences,
    pad_multiple_for,
    padded_lengths,
    padding_only_batch,
    split_packed_sample,
)
from seqpack.topology import AXES, Topology

__all__ = ["DATA_OWNERS", "PackingIterator", "Step", "wrap_data_iterator"]

DATA_OWNERS = ("tp0", "all")
# Keys the wrapper carries, with the dtype they are normalised to; other keys are ignored.
SAMPLE_DTYPES: dict[str, torch.dtype] = {
    "input_ids": torch.int64,
    "labels": torch.int64,
    "loss_mask": torch.float32,
    "position_ids": torch.int64,
}
_KEY_BITS = {key: 1 << i for i, key in enumerate(SAMPLE_DTYPES)}
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# gather_lengths extras: [exhausted, empty samples, key mask]
_X_EXHAUSTED, _X_EMPTY, _X_KEYS = range(3)


def _keys_of(mask: int) -> list[str]:
    return [key for key, bit in _KEY_BITS.items() if mask & bit]


@dataclasses.dataclass
class Step:
    """One training step's data for this rank.

    Attributes:
        num_microbatches: Microbatches every rank runs this step (equal on all ranks).
        microbatches: This rank's CP shard of each microbatch; metadata-only on middle
            pipeline stages.
        stats: Tokens, padding, balance and FLOPs of the whole global batch.
        step: Step index (0-based).
        schedule: The step's schedule (identical on every rank).
        schedule_fingerprint: ``schedule.fingerprint()``.
        timings: Seconds spent in ``read``, ``gather``, ``schedule``, ``exchange``,
            ``pack`` (pack + CP shard), ``broadcast`` (TP + PP, without ``wait``), ``wait``
            (a broadcast receiver waiting for its source) and ``total`` on this rank.
        exchange_bytes: ``sent``, ``received``, ``kept`` (stayed local) and ``payload``
            (tokens of this replica's samples) bytes of this rank's exchange.
    """

    num_microbatches: int
    microbatches: list[PackedBatch]
    stats: StepStats
    step: int = 0
    schedule: Schedule | None = None
    schedule_fingerprint: int = 0
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    exchange_bytes: dict[str, int] = dataclasses.field(default_factory=dict)


class PackingIterator(Iterator[Step]):
    """Iterator of :class:`Step`; see :func:`wrap_data_iterator`.

    Resumable through ``state_dict()`` / ``load_state_dict()`` (per rank, like
    ``StatefulDataLoader``). The wrapper uses no randomness; a loader's own RNG travels in
    its ``state_dict`` (saved under ``"iterator"``).
    """

    STATE_VERSION = "version"
    STATE_TOPOLOGY = "topology"
    STATE_CONFIG = "config"
    STATE_STEPS = "steps"
    STATE_CONSUMED = "consumed"
    STATE_DEFERRED = "deferred_samples"
    STATE_ITERATOR = "iterator"
    STATE_SCHEDULER = "scheduler"
    STATE_FINISHED = "finished"
    STATE_DROPPED_AT_END = "dropped_at_end"
    VERSION = 1

    def __init__(
        self,
        data_iterator: Iterable[Mapping[str, Any]] | None,
        topology: Topology,
        *,
        samples_per_rank: int,
        max_tokens_per_rank: int,
        scheduler: str | Scheduler = "balanced",
        data_owner: str = "tp0",
        on_oversize: str = "error",
        drop_last: bool = True,
        pad_multiple: int | None = None,
        sequence_parallel: bool = False,
        fp8: bool = False,
        cost: Any = None,
        flops_fn: Callable[[int, int], float] | None = None,
        check_schedule: bool = False,
        scheduler_options: Mapping[str, Any] | None = None,
        validate_ranks: bool = True,
    ):
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be a seqpack.Topology, got {type(topology).__name__}")
        self.topology = topology
        self.data_owner = data_owner
        self.drop_last = bool(drop_last)
        self.cost = cost
        self.flops_fn = flops_fn
        self.check_schedule = bool(check_schedule)
        self.on_oversize = on_oversize
        self._source = data_iterator
        self._it: Iterator[Mapping[str, Any]] | None = None
        self._skip = 0
        self._steps = 0
        self._consumed = 0
        self._pool: list[dict[str, torch.Tensor]] = []
        self._finished = False
        self.dropped_at_end = 0
        t = topology
        self._edge_stage = t.is_first_stage or t.is_last_stage
        self._reads = data_owner == "all" or (t.tp_rank == 0 and self._edge_stage)
        error = None
        config_fp = None
        try:
            self._configure(samples_per_rank, max_tokens_per_rank, scheduler, scheduler_options, pad_multiple,
                            sequence_parallel, fp8)
            self._check_ownership(data_iterator)
            config_fp = self._config_fingerprint()
        except (ValueError, TypeError) as exc:
            error = str(exc)
        if validate_ranks:
            # Every rank takes part even when its own arguments were bad, so that all ranks
            # raise the same error instead of some waiting in the first step's collectives.
            status, error = self._agree_everywhere(STATUS_ERROR if error else STATUS_OK, error, config_fp,
                                                   what="wrapper arguments")
        if error:
            raise ValueError(error)

    # -- configuration --------------------------------------------------------------------

    def _configure(self, samples_per_rank, max_tokens_per_rank, scheduler, scheduler_options, pad_multiple,
                   sequence_parallel, fp8) -> None:
        t = self.topology
        for name, value in (("samples_per_rank", samples_per_rank), ("max_tokens_per_rank", max_tokens_per_rank)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.samples_per_rank = int(samples_per_rank)
        self.max_tokens_per_rank = int(max_tokens_per_rank)
        if self.data_owner not in DATA_OWNERS:
            raise ValueError(f"data_owner must be one of {DATA_OWNERS}, got {self.data_owner!r}")
        if self.on_oversize not in ON_OVERSIZE:
            raise ValueError(f"on_oversize must be one of {ON_OVERSIZE}, got {self.on_oversize!r}")
        if pad_multiple is None:
            pad_multiple = pad_multiple_for(t.cp_size, t.tp_size, sequence_parallel, fp8)
        elif not isinstance(pad_multiple, (int, np.integer)) or isinstance(pad_multiple, bool) or pad_multiple < 1:
            raise ValueError(f"pad_multiple must be a positive integer, got {pad_multiple!r}")
        elif t.cp_size > 1 and pad_multiple % (2 * t.cp_size):
            raise ValueError(
                f"pad_multiple={pad_multiple} is not a multiple of 2*cp_size={2 * t.cp_size}: DualChunkSwap cuts "
                "every sequence in 2*cp chunks"
            )
        self.pad_multiple = int(pad_multiple)
        capacity = self.max_tokens_per_rank * t.cp_size
        if capacity < self.pad_multiple:
            raise ValueError(
                f"max_tokens_per_rank({self.max_tokens_per_rank}) * cp({t.cp_size}) = {capacity} is smaller than "
                f"pad_multiple={self.pad_multiple}: no sequence fits a microbatch"
            )
        self.scheduler = get_scheduler(scheduler, **dict(scheduler_options or {}))
        if self.cost is not None and not isinstance(self.cost, CostModel):
            raise TypeError(
                f"cost must be a seqpack.CostModel or None, got {type(self.cost).__name__}"
                + (" (ModelSpec.cost_model() gives one)" if hasattr(self.cost, "cost_model") else "")
            )
        # Stats are measured in one cost for every scheduler: the one given, else the cost
        # the scheduler balances, else the default FLOPs model (so that "dp_balanced" and
        # "balanced" report imbalance in the same unit).
        self.stats_cost = self.scheduler.resolve_cost(self.cost) or default_cost_model()

    def _check_ownership(self, data_iterator: Any) -> None:
        t = self.topology
        me = dist.get_rank() if dist.is_initialized() else 0
        who = f"rank {me} ({t.describe()})"
        rule = (
            "data_owner='all': every rank reads"
            if self.data_owner == "all"
            else "data_owner='tp0': only TP rank 0 of the first and last pipeline stages reads"
        )
        if self._reads and data_iterator is None:
            raise ValueError(f"{who} got data_iterator=None but must read data ({rule})")
        if not self._reads and data_iterator is not None:
            raise ValueError(f"{who} got a data_iterator but must not read data ({rule}); pass data_iterator=None")

    def _config_fingerprint(self) -> int:
        text = repr(
            (
                self.samples_per_rank,
                self.max_tokens_per_rank,
                self.pad_multiple,
                self.data_owner,
                self.on_oversize,
                self.drop_last,
                self.check_schedule,
                # The scheduler with its options and the cost: ranks that differ in either
                # compute different schedules from the same lengths.
                repr(self.scheduler),
                repr(self.cost),
                self.topology.signature() | {f"{a}_rank": 0 for a in AXES},
            )
        )
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1

    def _agree_everywhere(self, status: int, message: str | None, fingerprint: int | None, *, what: str,
                          axes: tuple[str, ...] = AXES) -> tuple[int, str | None]:
        """Agree over each axis in turn: after the last one every rank holds the same result."""
        for axis in axes:
            if self.topology.size(axis) > 1:
                status, message = agree_status(status, message, self.topology.group(axis),
                                               fingerprint=fingerprint, axis=axis, what=what)
        return status, message

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> PackingIterator:
        return self

    def __next__(self) -> Step:
        if self._finished:
            raise StopIteration
        start = time.perf_counter()
        t = self.topology
        timings: dict[str, float] = {}
        traffic: dict[str, int] = {}
        msg: StepMessage | None = None
        if self._reads:
            msg = self._reader_step(timings, traffic)
            # The fingerprint rides on the status all-reduce that happens anyway: CP ranks (and
            # TP/PP copies under "all") that read different data are caught every step.
            fp = msg.fingerprint if msg.status == STATUS_OK else None
            axes = ("cp",) if self.data_owner == "tp0" else ("cp", "tp", "pp")
            status, error = self._agree_everywhere(msg.status, msg.message or None, fp, what="schedules", axes=axes)
            msg = self._with_status(msg, status, error)
        if self.data_owner == "tp0":
            tick = time.perf_counter()
            if t.tp_size > 1 and self._edge_stage:
                msg = broadcast_tp(msg if t.tp_rank == 0 else None, t.group("tp"), timings=timings)
            if t.pp_size > 1:
                msg = self._pipeline(msg, timings)
            timings["broadcast"] = time.perf_counter() - tick - timings.get("wait", 0.0)
        assert msg is not None
        timings["total"] = time.perf_counter() - start
        return self._finish(msg, timings, traffic)

    def _pipeline(self, msg: StepMessage | None, timings: dict[str, float]) -> StepMessage:
        """Agree with the other stages, then send the first stage's layout to the middle ones."""
        t = self.topology
        status = msg.status if msg is not None else STATUS_OK
        fp = msg.fingerprint if msg is not None and status == STATUS_OK else None
        status, error = agree_status(status, msg.message if msg is not None else None, t.group("pp"),
                                     fingerprint=fp, axis="pp", what="schedules (first and last stage)")
        if status == STATUS_ERROR:
            return StepMessage(STATUS_ERROR, self._steps, message=error or "")
        if t.pp_size > 2:
            out = msg
            if t.is_first_stage and status != msg.status:  # the last stage ended first
                out = StepMessage(status, self._steps)
            got = broadcast_pp(out if t.is_first_stage else None, t.group("pp"), decode=t.is_middle_stage,
                               timings=timings)
            if t.is_middle_stage:
                sender = got.microbatches[0].cp_rank if got.microbatches else t.cp_rank
                if sender != t.cp_rank:
                    raise ValueError(f"the pp group pairs CP rank {sender} of the first stage with CP rank {t.cp_rank}")
                return got
        if msg is None or status != msg.status:
            return StepMessage(status, self._steps)
        return msg

    @staticmethod
    def _with_status(msg: StepMessage, status: int, error: str | None) -> StepMessage:
        if status == msg.status:
            return msg
        if status == STATUS_ERROR:
            return StepMessage(STATUS_ERROR, msg.step, message=error or "")
        return StepMessage(status, msg.step, dropped_at_end=msg.dropped_at_end)

    def _finish(self, msg: StepMessage, timings: dict[str, float], traffic: dict[str, int]) -> Step:
        if msg.status == STATUS_ERROR:
            raise ValueError(msg.message)
        if msg.status == STATUS_END:
            self._finished = True
            self.dropped_at_end = msg.dropped_at_end
            raise StopIteration
        schedule = msg.schedule
        stats = StepStats.from_schedule(schedule, self.stats_cost, empty_samples=msg.empty_samples)
        if self.flops_fn is not None:
            stats.flops = float(self.flops_fn(stats.seqlen_sum, stats.seqlen_sq_sum))
        self._steps += 1
        return Step(
            num_microbatches=schedule.num_microbatches,
            microbatches=msg.microbatches,
            stats=stats,
            step=msg.step,
            schedule=schedule,
            schedule_fingerprint=schedule.fingerprint(),
            timings=timings,
            exchange_bytes=traffic,
        )

    # -- the reader's part of a step ------------------------------------------------------

    def _who(self) -> str:
        me = dist.get_rank() if dist.is_initialized() else 0
        return f"DP rank {self.topology.dp_rank} (global rank {me}, {self.topology.describe()})"

    def _reader_step(self, timings: dict[str, float], traffic: dict[str, int]) -> StepMessage:
        t = self.topology
        step = self._steps
        tick = time.perf_counter()
        error = None
        fresh: list[dict[str, torch.Tensor]] = []
        exhausted, empty = False, 0
        try:
            fresh, exhausted, empty = self._read()
        except Exception as exc:  # the user's iterator or data: every rank must hear of it
            what = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            error = f"bad input on {self._who()} at step {step}: {what}"
        pool = self._pool + fresh
        key_mask = 0
        if pool and error is None:
            key_mask = sum(_KEY_BITS[k] for k in pool[0])
            for i, sample in enumerate(pool):
                if set(sample) != set(pool[0]):
                    error = (
                        f"bad input on {self._who()} at step {step}: sample {i} has keys {sorted(sample)} but "
                        f"sample 0 has {sorted(pool[0])}; all samples must carry the same keys"
                    )
                    break
        timings["read"] = time.perf_counter() - tick

        tick = time.perf_counter()
        lengths = [int(s["input_ids"].shape[0]) for s in pool] if error is None else []
        try:
            gathered = gather_lengths(lengths, t.group("dp"), error=error, extras=[int(exhausted), empty, key_mask])
        except ValueError as exc:
            return StepMessage(STATUS_ERROR, step, message=str(exc))
        timings["gather"] = time.perf_counter() - tick
        counts, extras = gathered.counts, gathered.extras
        masks = extras[counts > 0, _X_KEYS]
        if masks.size and np.any(masks != masks[0]):
            listed = "; ".join(
                f"DP rank {r}: {_keys_of(int(extras[r, _X_KEYS]))}" for r in range(counts.shape[0]) if counts[r]
            )
            return StepMessage(STATUS_ERROR, step, message=f"DP ranks disagree on sample keys at step {step}: {listed}")
        key_mask = int(masks[0]) if masks.size else 0
        empty_total = int(extras[:, _X_EMPTY].sum())
        total = int(gathered.lengths.shape[0])
        if extras[:, _X_EXHAUSTED].any() and (self.drop_last or total == 0):
            self._pool = []
            return StepMessage(STATUS_END, step, dropped_at_end=total, empty_samples=empty_total)

        tick = time.perf_counter()
        try:
            schedule = self.scheduler.schedule(
                gathered.lengths,
                dp_size=t.dp_size,
                cp_size=t.cp_size,
                max_tokens_per_rank=self.max_tokens_per_rank,
                pad_multiple=self.pad_multiple,
                cost=self.cost,
                on_oversize=self.on_oversize,
                origin=gathered.origin(),
            )
        except ValueError as exc:
            return StepMessage(STATUS_ERROR, step, message=f"step {step}: {exc}{self._locate_oversize(gathered)}")
        except Exception as exc:  # a scheduler bug must still reach every rank, not strand them
            return StepMessage(STATUS_ERROR, step, message=f"step {step}: scheduler {self.scheduler!r} failed: "
                                                           f"{type(exc).__name__}: {exc}")
        if self.check_schedule and t.dp_size > 1:
            status, mismatch = agree_status(STATUS_OK, None, t.group("dp"), fingerprint=schedule.fingerprint(),
                                            axis="dp")
            if status == STATUS_ERROR:
                return StepMessage(STATUS_ERROR, step, message=f"step {step}: {mismatch}")
        timings["schedule"] = time.perf_counter() - tick
        if extras[:, _X_EXHAUSTED].any() and not any(ids.size for row in schedule.assignment for ids in row):
            self._pool = []  # only deferred samples are left and the scheduler keeps deferring them
            return StepMessage(STATUS_END, step, dropped_at_end=total, empty_samples=empty_total)

        offset = int(gathered.offsets[t.dp_rank])
        mine = schedule.deferred[(schedule.deferred >= offset) & (schedule.deferred < offset + len(pool))]
        keep_deferred = [pool[g - offset] for g in np.sort(mine).tolist()]

        custom_positions = bool(key_mask & _KEY_BITS["position_ids"])
        need_tokens = not t.is_middle_stage or custom_positions
        tick = time.perf_counter()
        exchanged = None
        if need_tokens:
            schema = [(key, SAMPLE_DTYPES[key]) for key in _keys_of(key_mask)]
            exchanged = exchange_samples(pool, schedule, counts, t.group("dp"), schema=schema)
            traffic.update(
                sent=exchanged.bytes_sent,
                received=exchanged.bytes_received,
                kept=exchanged.bytes_kept,
                payload=exchanged.bytes_received + exchanged.bytes_kept,
            )
        timings["exchange"] = time.perf_counter() - tick
        self._pool = keep_deferred

        tick = time.perf_counter()
        try:
            batches = [self._microbatch(schedule, m, exchanged) for m in range(schedule.num_microbatches)]
        except Exception as exc:  # local; CP/TP/PP peers hear of it in the status agreement
            return StepMessage(STATUS_ERROR, step, message=f"step {step}: packing failed on {self._who()}: "
                                                           f"{type(exc).__name__}: {exc}")
        timings["pack"] = time.perf_counter() - tick
        return StepMessage(
            STATUS_OK,
            step,
            schedule=schedule,
            microbatches=batches,
            empty_samples=empty_total,
            position_ids=custom_positions,
        )

    def _microbatch(self, schedule: Schedule, m: int, exchanged: Any) -> PackedBatch:
        t = self.topology
        ids = schedule.assignment[m][t.dp_rank]
        if exchanged is None:  # middle stage under data_owner="all": the layout is all it needs
            if ids.size == 0:
                cu, cu_padded, max_seqlen, ids = [0, 0], [0, self.pad_multiple], self.pad_multiple, np.array([-1])
            else:
                padded = padded_lengths(schedule.lengths[ids], self.pad_multiple)
                cu = np.concatenate([[0], np.cumsum(schedule.lengths[ids])])
                cu_padded = np.concatenate([[0], np.cumsum(padded)])
                max_seqlen = int(padded.max())
            return batch_from_layout(np.asarray(cu, np.int64), np.asarray(cu_padded, np.int64), max_seqlen, ids,
                                     t.cp_size, t.cp_rank)
        if ids.size == 0:
            batch = padding_only_batch(self.pad_multiple)
        else:
            batch = pack_sequences([exchanged.samples[g] for g in ids.tolist()], pad_multiple=self.pad_multiple,
                                   sample_ids=ids)
        batch = shard_for_cp(batch, t.cp_size, t.cp_rank)
        if t.is_middle_stage:
            batch = dataclasses.replace(batch, input_ids=None, labels=None, loss_mask=None)
        return batch

    def _locate_oversize(self, gathered: Any) -> str:
        capacity = self.max_tokens_per_rank * self.topology.cp_size
        over = np.flatnonzero(padded_lengths(gathered.lengths, self.pad_multiple) > capacity)
        if not over.size:
            return ""
        g = int(over[0])
        r = int(gathered.origin()[g])
        return f" [global sample {g} is sample {g - int(gathered.offsets[r])} of DP rank {r}'s pool this step]"

    def _read(self) -> tuple[list[dict[str, torch.Tensor]], bool, int]:
        """Pull up to ``samples_per_rank`` samples; returns (sequences, exhausted, empty count)."""
        if self._it is None:
            self._it = iter(self._source)
        if self._skip:  # resuming an iterator without state_dict: fast-forward past consumed samples
            for done in range(self._skip):
                try:
                    next(self._it)
                except StopIteration:
                    raise ValueError(
                        f"resuming needs to skip {self._skip} consumed samples but the data iterator ended after {done}"
                    ) from None
            self._consumed += self._skip
            self._skip = 0
        fresh: list[dict[str, torch.Tensor]] = []
        exhausted, empty = False, 0
        for _ in range(self.samples_per_rank):
            try:
                item = next(self._it)
            except StopIteration:
                exhausted = True
                break
            index = self._consumed
            self._consumed += 1
            for sequence in self._sequences(item, index):
                if sequence["input_ids"].shape[0] == 0:
                    empty += 1
                else:
                    fresh.append(sequence)
        return fresh, exhausted, empty

    @staticmethod
    def _sequences(item: Any, index: int) -> list[dict[str, torch.Tensor]]:
        """Validate one sample and normalise it (pre-packed ones split into sequences)."""
        where = f"sample {index} of this rank's data"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} must be a mapping of 1-D tensors, got {type(item).__name__}")
        if "input_ids" not in item or item["input_ids"] is None:
            raise ValueError(f"{where} has no 'input_ids' (keys: {sorted(item)})")
        if "cu_seqlens" in item:
            try:
                parts = split_packed_sample(item)
            except (ValueError, TypeError, IndexError) as exc:
                raise ValueError(f"{where} is pre-packed with a bad layout: {exc}") from None
        else:
            parts = [item]
        out = []
        for part in parts:
            sequence = {}
            for key, dtype in SAMPLE_DTYPES.items():
                value = part.get(key)
                if value is None:
                    continue
                tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
                if tensor.dim() != 1:
                    raise ValueError(f"{where}: {key!r} must be 1-D, got shape {tuple(tensor.shape)}")
                if key != "loss_mask" and tensor.dtype not in _INT_DTYPES:
                    raise ValueError(f"{where}: {key!r} must hold integers, got dtype {tensor.dtype}")
                sequence[key] = tensor.to(dtype)
            length = sequence["input_ids"].shape[0]
            for key, tensor in sequence.items():
                if tensor.shape[0] != length:
                    raise ValueError(f"{where}: {key!r} has {tensor.shape[0]} tokens but 'input_ids' has {length}")
            out.append(sequence)
        return out

    # -- resume ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state: step counter, samples consumed from the data iterator,
        deferred samples (tensors), the iterator's own ``state_dict()`` when it has one, the
        scheduler's when it has one, and the topology it was taken on."""
        source_state = None
        if self._source is not None and hasattr(self._source, "state_dict"):
            source_state = self._source.state_dict()
        scheduler_state = self.scheduler.state_dict() if hasattr(self.scheduler, "state_dict") else None
        return {
            self.STATE_VERSION: self.VERSION,
            self.STATE_TOPOLOGY: self.topology.signature(),
            self.STATE_CONFIG: self._config(),
            self.STATE_STEPS: self._steps,
            self.STATE_CONSUMED: self._consumed + self._skip,
            self.STATE_DEFERRED: [{k: v.clone() for k, v in s.items()} for s in self._pool],
            self.STATE_ITERATOR: source_state,
            self.STATE_SCHEDULER: scheduler_state,
            self.STATE_FINISHED: self._finished,
            self.STATE_DROPPED_AT_END: self.dropped_at_end,
        }

    def _config(self) -> dict[str, Any]:
        return {
            "samples_per_rank": self.samples_per_rank,
            "max_tokens_per_rank": self.max_tokens_per_rank,
            "pad_multiple": self.pad_multiple,
            "data_owner": self.data_owner,
            "scheduler": type(self.scheduler).__name__,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` into this fresh iterator over the same data.

        The data iterator is restored with its own ``load_state_dict`` when both it and the
        state have one; otherwise it is fast-forwarded by the consumed count on the next
        step.

        Raises:
            ValueError: Missing keys, another state version, a different topology or
                configuration, or an iterator that has already produced steps.
        """
        keys = (self.STATE_VERSION, self.STATE_TOPOLOGY, self.STATE_CONFIG, self.STATE_STEPS, self.STATE_CONSUMED,
                self.STATE_DEFERRED, self.STATE_ITERATOR, self.STATE_FINISHED)
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"state is missing keys {missing}; expected a PackingIterator.state_dict()")
        if state[self.STATE_VERSION] != self.VERSION:
            raise ValueError(f"state version {state[self.STATE_VERSION]!r} is not {self.VERSION}")
        saved, here = dict(state[self.STATE_TOPOLOGY]), self.topology.signature()
        if saved != here:
            raise ValueError(f"state was saved on topology {_fmt(saved)} but this iterator runs on {_fmt(here)}")
        if dict(state[self.STATE_CONFIG]) != self._config():
            raise ValueError(
                f"state was saved with {dict(state[self.STATE_CONFIG])} but this iterator has {self._config()}"
            )
        if self._it is not None or self._steps:
            raise ValueError("load_state_dict needs a fresh iterator (this one has already read data)")
        self._steps = int(state[self.STATE_STEPS])
        self._pool = [dict(s) for s in state[self.STATE_DEFERRED]]
        self._finished = bool(state[self.STATE_FINISHED])
        self.dropped_at_end = int(state.get(self.STATE_DROPPED_AT_END, 0))
        consumed = int(state[self.STATE_CONSUMED])
        source_state = state[self.STATE_ITERATOR]
        if source_state is not None and self._source is not None and hasattr(self._source, "load_state_dict"):
            self._source.load_state_dict(source_state)
            self._skip = 0
        else:
            self._skip = consumed if self._reads else 0
        self._consumed = consumed - self._skip
        scheduler_state = state.get(self.STATE_SCHEDULER)
        if scheduler_state is not None and hasattr(self.scheduler, "load_state_dict"):
            self.scheduler.load_state_dict(scheduler_state)


def _fmt(signature: Mapping[str, int]) -> str:
    return " ".join(f"{a}={signature[f'{a}_rank']}/{signature[f'{a}_size']}" for a in AXES)


def wrap_data_iterator(
    data_iterator: Iterable[Mapping[str, Any]] | None,
    topology: Topology,
    *,
    samples_per_rank: int,
    max_tokens_per_rank: int,
    scheduler: str | Scheduler = "balanced",
    data_owner: str = "tp0",
    on_oversize: str = "error",
    **kwargs: Any,
) -> PackingIterator:
    """Wrap a data iterator so each ``next()`` yields one packed, scheduled, CP-sharded step.

    Collective: call it, and every ``next()``, on every rank of ``topology``.

    Args:
        data_iterator: Samples (mappings of 1-D tensors; ``input_ids`` required,
            ``labels``, ``loss_mask``, ``position_ids`` optional; pre-packed samples carrying
            ``cu_seqlens`` are split into their sequences). ``None`` on ranks that do not
            read (see ``data_owner``). An iterable with ``state_dict()`` /
            ``load_state_dict()`` (``StatefulDataLoader``) is resumed through them.
        topology: This rank's :class:`~seqpack.topology.Topology`.
        samples_per_rank: Samples pulled from ``data_iterator`` per step on each DP rank.
        max_tokens_per_rank: Padded tokens one rank holds in one microbatch; a microbatch
            holds ``max_tokens_per_rank * cp_size`` before CP sharding.
        scheduler: Scheduler name or instance (``"balanced"``, ``"dp_balanced"``,
            ``"empty"``, ...).
        data_owner: ``"tp0"`` (Megatron: TP rank 0 of the first and last pipeline stage
            reads, the wrapper broadcasts over TP and PP) or ``"all"`` (every rank reads
            identical data for its DP rank; nothing is broadcast).
        on_oversize: ``"error"``, ``"truncate"`` or ``"drop"`` for sequences longer than a
            microbatch.
        **kwargs: ``drop_last=True`` (drop and count a partial last step, else yield it),
            ``pad_multiple`` (default ``pad_multiple_for(cp, tp, sequence_parallel, fp8)``),
            ``sequence_parallel``, ``fp8``, ``cost`` (``CostModel`` for the scheduler and
            stats), ``flops_fn(seqlen_sum, seqlen_sq_sum) -> float``, ``check_schedule``
            (also compare schedule fingerprints over DP each step; CP, TP and PP copies are
            always compared), ``scheduler_options``,
            ``validate_ranks`` (agree on arguments and iterator ownership at construction).

    Returns:
        A :class:`PackingIterator`.

    Raises:
        ValueError: On every rank, for bad arguments on any rank, an iterator given to a
            rank that must not read or missing on one that must.
    """
    return PackingIterator(
        data_iterator,
        topology,
        samples_per_rank=samples_per_rank,
        max_tokens_per_rank=max_tokens_per_rank,
        scheduler=scheduler,
        data_owner=data_owner,
        on_oversize=on_oversize,
        **kwargs,
    )
