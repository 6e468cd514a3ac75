"""The wrapper's :class:`PackingConfig`: every setting that decides what it yields, frozen,
validated at construction and fingerprinted (option enums: :mod:`seqpack.options`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from seqpack.calibrate import CostCalibrator
from seqpack.cost import (
    DEFAULT_INTERCONNECT,
    DEFAULT_MODEL,
    CostModel,
    ModelSpec,
    check_cost_model,
    default_cost_model,
)
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.encoder_option import EncoderRebalanceMode, check_encoder_rebalance
from seqpack.loader.vision_payload import check_topology
from seqpack.options import (
    DEFAULT_PREFETCH_BYTES,
    INT64_MAX,
    MAX_PREFETCH,
    MAX_TOKENS,
    CpLayout,
    DataOwner,
    LabelFormat,
    OnOversize,
    Sync,
    fingerprint_text,
)
from seqpack.schedulers import Scheduler, get_scheduler
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.thd import MRopeSpec, StaticShapes, pad_multiple_for
from seqpack.thd.static_shapes import as_static_shapes
from seqpack.topology import Topology
from seqpack.validation import (
    check_bool,
    check_choice,
    check_int,
    check_positive_int,
)

__all__ = ["PackingConfig", "resolved_cost"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PackingConfig:
    """Everything that decides what :func:`seqpack.wrap_data_iterator` yields.

    Frozen and validated at construction (every bad value is a :class:`ConfigError` or
    :class:`SeqpackTypeError` naming it). :meth:`fingerprint` covers every field that
    changes the data, and serves both the cross-rank check at construction and the resume
    check in ``load_state_dict``.
    """

    samples_per_rank: int
    """Samples pulled from the data iterator per step on each DP rank."""
    max_tokens_per_rank: int
    """Padded tokens one rank holds in one microbatch; a microbatch holds
    ``max_tokens_per_rank * cp_size`` tokens before CP sharding."""
    scheduler: str | Scheduler = "balanced"
    """Scheduler name (``"balanced"``, ``"dp_balanced"``, ``"empty"``, ...) or instance
    (under ``dynamic_cp``: left as it is, or a :class:`~seqpack.schedulers.DynamicCpScheduler`)."""
    scheduler_options: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)
    """Keyword arguments of the scheduler named by ``scheduler`` (``None``: none); under
    ``dynamic_cp``, of the dynamic-CP scheduler (``{"group_sizes": "any"}``)."""
    data_owner: DataOwner = DataOwner.TP0
    """Who reads data: ``"tp0"`` (Megatron) or ``"all"`` (see :class:`DataOwner`)."""
    on_oversize: OnOversize = OnOversize.ERROR
    """Sequences longer than a microbatch: ``"error"``, ``"truncate"`` or ``"drop"`` (counted)."""
    cp_layout: CpLayout = CpLayout.DUALCHUNK
    """How each microbatch is cut for context parallelism: ``"dualchunk"`` (TE's
    DualChunkSwap, balanced causal attention) or ``"contiguous"`` (one slice of every sequence
    per CP rank, for local, windowed or linear attention and Mamba)."""
    label_format: LabelFormat = LabelFormat.SHIFTED
    """How the samples' ``labels`` (and ``loss_mask``) are aligned: ``"shifted"``: next-token
    targets (Megatron, NeMo, torchtitan; labels that copy ``input_ids`` are refused),
    ``"unshifted"``: aligned with ``input_ids`` (Hugging Face, TRL). Every microbatch carries
    next-token targets."""
    drop_last: bool = True
    """Drop (and count) a partial last step instead of yielding it."""
    pad_multiple: int | None = None
    """Every sequence is padded to a multiple of this; ``None``:
    ``pad_multiple_for(cp, tp, sequence_parallel, fp8)``."""
    sequence_parallel: bool = False
    """The model splits the token axis over TP too (padding multiple times ``tp``)."""
    fp8: bool = False
    """FP8 GEMMs need 16-aligned token counts (padding multiple of 16)."""
    cost: CostModel | None = None
    """A :class:`seqpack.cost.CostModel` for the scheduler and the stats (``None``: the
    scheduler's own, else the default FLOPs model). Under ``dynamic_cp`` its ring terms price
    CP groups (``None``: the default model with a ring over
    :data:`~seqpack.cost.DEFAULT_INTERCONNECT`, a prior that ``calibrate=True`` refits)."""
    flops_fn: Callable[[int, int], float] | None = None
    """``flops_fn(seqlen_sum, seqlen_sq_sum) -> float`` fills ``StepStats.flops``."""
    check_schedule: bool = False
    """Also compare schedule fingerprints over DP (under ``dynamic_cp``: the whole plane) every
    step, in the agreement before the exchange (CP, TP and PP copies are always compared)."""
    validate_ranks: bool = True
    """Compare the arguments and iterator ownership of all ranks at construction (``False``
    compares only the settings every rank's plan and collectives are computed from:
    :func:`seqpack.loader.construction.compared_settings`)."""
    sync: Sync = Sync.LOCKSTEP
    """What a step waits for, so what the scheduler minimises and the stats and calibration
    report: ``"lockstep"`` (FSDP, pipeline: every microbatch round waits for its slowest
    replica) or ``"replica"`` (DDP, ZeRO-1: the slowest replica's total)."""
    calibrate: bool | CostCalibrator = False
    """Fit the scheduler's cost model online from microbatch times the training loop reports
    (``Step.record_times`` or :class:`seqpack.calibrate.MicrobatchTimer`): ``True`` (a
    :class:`seqpack.calibrate.CostCalibrator` whose prior is ``cost``, else the scheduler's
    cost), a ``CostCalibrator`` (copied), or ``False``. Under ``dynamic_cp`` it fits the CP
    ring too (a given calibrator's prior needs a ``reference_size``)."""
    prefetch: int = 1
    """Steps a background thread prepares ahead of the training loop (0: each step is
    prepared inside ``next()``; at most :data:`~seqpack.options.MAX_PREFETCH`). Never changes
    the data, so ranks may differ in it and a state resumes under any value."""
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    """The prefetch thread prepares no further step while the steps waiting for ``next()``
    hold this many tensor bytes or more (one step always may wait)."""
    dynamic_cp: bool = False
    """Dynamic context parallelism (docs/dynamic_cp.md), the one way to ask for it: per
    microbatch round the ``dp x cp`` ranks of every TP/PP lane form CP groups, planned by
    :class:`~seqpack.schedulers.DynamicCpScheduler` (its options in ``scheduler_options``);
    each microbatch carries its group (``PackedBatch.cp_group``, ``cp_size``, ``cp_rank``).
    One sequence may hold up to ``dp * cp`` ranks' worth of ``max_tokens_per_rank``."""

    group_microbatch: bool = False
    """Samples carrying a ``group_id`` (seqpack.loader.grouping) always stay on one DP
    replica; with ``group_microbatch`` a group that fits one microbatch also stays in one."""
    equal_samples_per_replica: bool = False
    """Every DP replica trains the same number of sequences each step (verl's
    ``equal_size``); with groups, as many groups of one size (else the step fails)."""
    minibatches: int = 1
    """Mini-batches per step (PPO / GRPO optimizer steps over one rollout batch, verl's
    ``keep_minibatch``): every DP rank's sequences are cut in read order into this many
    contiguous mini-batches, each planned alone; a Step's microbatches are theirs in order
    (``Step.minibatch_bounds``, ``Step.minibatches``). At most ``samples_per_rank``."""
    static_shapes: StaticShapes | None = None
    """Fixed shapes for compiled training (:class:`~seqpack.thd.StaticShapes`, docs/thd.md):
    every microbatch in one of ``token_buckets`` (the largest: the capacity
    ``max_tokens_per_rank * cp_size``) with ``max_sequences + 1`` offsets, at most
    ``max_real_sequences`` sequences. Not with ``dynamic_cp``."""
    mrope: MRopeSpec | None = None
    """A vision-language model's ``MRopeSpec.from_hf(model.config)`` (docs/multimodal.md):
    samples may then carry images and videos, and every microbatch carries the vision fields
    of ``pack_sequences(mrope=)``. Without it such samples are refused. Not with CP > 1,
    ``dynamic_cp``, pipeline parallelism, or TP > 1 under ``data_owner="tp0"``."""
    model: ModelSpec | None = None
    """The model's shape (``ModelSpec.from_hf(model.config)``): with a vision encoder
    (``ModelSpec.vision``), each sample's encoder FLOPs are balanced with its tokens
    (docs/multimodal.md). ``None``: samples with images are planned on their tokens (logged once)."""
    encoder_rebalance: EncoderRebalanceMode = "auto"
    """Whether a microbatch round's images may be encoded on other DP ranks, their embeddings
    routed back (docs/multimodal.md, "Encoder rebalancing"). ``"auto"``: where the round time
    saved pays for the exchange; ``True``: wherever the plan moves an image (needs ``mrope``,
    DP > 1, no CP or pipeline stages); ``False``: never."""

    def __post_init__(self) -> None:
        for name in ("samples_per_rank", "max_tokens_per_rank"):
            object.__setattr__(self, name, check_positive_int(name, getattr(self, name), maximum=INT64_MAX))
        object.__setattr__(self, "data_owner", check_choice("data_owner", self.data_owner, DataOwner))
        object.__setattr__(self, "on_oversize", check_choice("on_oversize", self.on_oversize, OnOversize))
        object.__setattr__(self, "label_format", check_choice("label_format", self.label_format, LabelFormat))
        object.__setattr__(self, "cp_layout", check_choice("cp_layout", self.cp_layout, CpLayout))
        for name in (
            "drop_last",
            "sequence_parallel",
            "fp8",
            "check_schedule",
            "validate_ranks",
            "group_microbatch",
            "equal_samples_per_replica",
        ):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))
        if self.pad_multiple is not None:
            object.__setattr__(self, "pad_multiple", check_positive_int("pad_multiple", self.pad_multiple))
        if self.scheduler_options is None:
            object.__setattr__(self, "scheduler_options", {})
        if not isinstance(self.scheduler_options, Mapping):
            raise SeqpackTypeError(f"scheduler_options must be a mapping, got {type(self.scheduler_options).__name__}")
        object.__setattr__(self, "scheduler_options", dict(self.scheduler_options))
        check_cost_model("cost", self.cost)
        object.__setattr__(self, "dynamic_cp", check_bool("dynamic_cp", self.dynamic_cp))
        # Unknown names and bad options fail here, not at the first step.
        named = self.build_scheduler()
        if self.flops_fn is not None and not callable(self.flops_fn):
            raise SeqpackTypeError(f"flops_fn must be callable, got {type(self.flops_fn).__name__}")
        object.__setattr__(self, "prefetch", check_int("prefetch", self.prefetch, minimum=0, maximum=MAX_PREFETCH))
        budget = check_positive_int("prefetch_bytes", self.prefetch_bytes, maximum=INT64_MAX)  # a byte count: int64
        object.__setattr__(self, "prefetch_bytes", budget)
        object.__setattr__(self, "sync", check_choice("sync", self.sync, Sync))
        self._check_calibrate()
        self._check_dynamic_cp(named)
        self._check_minibatches()
        self._check_static_shapes()
        if self.mrope is not None and not isinstance(self.mrope, MRopeSpec):
            raise SeqpackTypeError(f"mrope must be an MRopeSpec (MRopeSpec.from_hf(config)), got {self.mrope!r:.80}")
        if self.mrope is not None and self.dynamic_cp:
            raise ConfigError("mrope is not supported with dynamic_cp=True: a vision-language pack is not CP-sharded")
        object.__setattr__(self, "encoder_rebalance", check_encoder_rebalance(self.encoder_rebalance, mrope=self.mrope))
        if self.model is not None and not isinstance(self.model, ModelSpec):
            raise SeqpackTypeError(f"model must be a ModelSpec (ModelSpec.from_hf(config)), got {self.model!r:.80}")

    def _check_calibrate(self) -> None:
        if not isinstance(self.calibrate, (bool, CostCalibrator)):
            raise SeqpackTypeError(
                f"calibrate must be True, False or a seqpack.calibrate.CostCalibrator, got {self.calibrate!r}"
            )
        if not isinstance(self.calibrate, CostCalibrator) or self.calibrate.fits_groups == self.dynamic_cp:
            return
        if self.dynamic_cp:
            raise ConfigError(
                "calibrate=CostCalibrator(...) with a static plan's prior fits (1, S, SS), not a dynamic CP group "
                "cost: give it a prior with a reference_size (CostModel.from_model, from_te_p2p), or calibrate=True"
            )
        raise ConfigError(
            "calibrate=CostCalibrator(...) with a prior that prices CP groups (a reference_size) fits a dynamic CP "
            "cost: pass dynamic_cp=True"
        )

    def _check_static_shapes(self) -> None:
        if as_static_shapes(self.static_shapes) is not None and self.dynamic_cp:
            raise ConfigError(
                "static_shapes is not supported with dynamic_cp=True: a CP group's pack holds up to its size times "
                "max_tokens_per_rank tokens, so one set of token buckets cannot fix every rank's shard; use static CP"
            )

    def _check_minibatches(self) -> None:
        object.__setattr__(self, "minibatches", check_positive_int("minibatches", self.minibatches, maximum=INT64_MAX))
        if self.minibatches > self.samples_per_rank:
            raise ConfigError(
                f"minibatches={self.minibatches} is more than samples_per_rank={self.samples_per_rank}: each DP "
                "rank's samples of a step are cut into that many mini-batches, so some would hold none"
            )

    def _check_dynamic_cp(self, named: Scheduler) -> None:
        """The dynamic-CP options (``named``: the scheduler :meth:`build_scheduler` gives);
        what dynamic CP does not combine with yet is refused by name."""
        if not self.dynamic_cp:
            if isinstance(named, DynamicCpScheduler):
                raise ConfigError(
                    f"scheduler={self.scheduler!r} plans with dynamic CP: pass dynamic_cp=True instead (its options, "
                    "e.g. scheduler_options={'group_sizes': 'any'}, are the dynamic-CP scheduler's)"
                )
            return
        cost = self.cost
        if cost is None:
            logger.info(
                "dynamic CP plans with %s's FLOPs and a CP ring over %s (a prior: calibrate=True fits it)",
                DEFAULT_MODEL,
                DEFAULT_INTERCONNECT,
            )
        elif not cost.has_ring and cost.reference_size is None:
            raise ConfigError(
                f"dynamic_cp=True with cost={cost!r}: without a CP ring term every CP group would look free; give "
                "its ring figures in the units of that cost (CostModel(..., ring_step=2e-4, ring_token=5e-8), "
                "CostModel.from_te_p2p(cost, ...) for seconds, CostModel.from_model(spec, interconnect) for FLOPs), "
                "or leave cost unset for the default model's FLOPs and ring"
            )
        for name in ("group_microbatch", "equal_samples_per_replica"):
            if getattr(self, name):
                raise ConfigError(
                    f"{name}=True is not supported with dynamic_cp=True: its plans place sequences on CP groups, "
                    "not in a replica's microbatches (group_id works: a group stays on one replica's own CP ranks)"
                )
        if self.cp_layout != CpLayout.DUALCHUNK:
            raise ConfigError(
                f"cp_layout={self.cp_layout.value!r} is not supported with dynamic_cp=True: its groups pad and "
                "shard every sequence by DualChunkSwap ('dualchunk')"
            )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes: Any) -> PackingConfig:
        """A copy with ``changes`` (unknown names are a :class:`ConfigError` listing the valid ones)."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ConfigError(f"unknown PackingConfig field(s) {unknown}; valid: {', '.join(self.field_names())}")
        return dataclasses.replace(self, **changes)

    def build_scheduler(self) -> Scheduler:
        """The :class:`~seqpack.schedulers.Scheduler` this config names (a new one per call
        for names; the instance itself when one was given; under ``dynamic_cp`` the
        dynamic-CP scheduler).

        Raises:
            ConfigError: Under ``dynamic_cp``, another scheduler named or given.
        """
        if not self.dynamic_cp:
            return get_scheduler(self.scheduler, **(self.scheduler_options or {}))
        if isinstance(self.scheduler, DynamicCpScheduler) and not self.scheduler_options:
            return self.scheduler
        if self.scheduler != "balanced":
            raise ConfigError(
                f"dynamic_cp=True plans with the dynamic-CP scheduler, so scheduler={self.scheduler!r} would not be "
                "used: leave scheduler unset (its options go in scheduler_options, e.g. {'group_sizes': 'any'}), "
                "or pass a DynamicCpScheduler instance without scheduler_options"
            )
        return get_scheduler("dynamic_cp", **(self.scheduler_options or {}))

    def resolve(self, topology: Topology) -> PackingConfig:
        """This config with ``pad_multiple`` resolved for ``topology`` and checked against it.

        Raises:
            ConfigError: ``pad_multiple`` not a multiple of ``2*cp`` under CP, a microbatch
                (``max_tokens_per_rank * cp``) smaller than ``pad_multiple``, ``mrope`` on a
                topology whose batches cannot carry the vision fields
                (:func:`~seqpack.loader.vision_payload.check_topology`), or
                ``encoder_rebalance=True`` where the route cannot run.
        """
        if not isinstance(topology, Topology):
            raise SeqpackTypeError(f"topology must be a seqpack.Topology, got {type(topology).__name__}")
        check_encoder_rebalance(self.encoder_rebalance, mrope=self.mrope, topology=topology)
        check_topology(topology, self.mrope, self.data_owner)
        if self.dynamic_cp:
            return self._resolve_dynamic(topology)
        cp = topology.cp_size
        pad = self.pad_multiple
        if pad is None:
            pad = pad_multiple_for(cp, topology.tp_size, self.sequence_parallel, self.fp8)
        elif cp > 1 and pad % (2 * cp):
            raise ConfigError(
                f"pad_multiple={pad} is not a multiple of 2*cp_size={2 * cp}: DualChunkSwap cuts every sequence "
                "in 2*cp chunks"
            )
        capacity = self.max_tokens_per_rank * cp
        if capacity > MAX_TOKENS:
            raise ConfigError(
                f"max_tokens_per_rank({self.max_tokens_per_rank}) * cp({cp}) = {capacity} tokens per microbatch is "
                f"too large (at most 2**53 = {MAX_TOKENS})"
            )
        if capacity < pad:
            raise ConfigError(
                f"max_tokens_per_rank({self.max_tokens_per_rank}) * cp({cp}) = {capacity} is smaller than "
                f"pad_multiple={pad}: no sequence fits a microbatch"
            )
        if self.static_shapes is not None:
            self._check_buckets(self.static_shapes, capacity, cp, pad)
        return self._with_pad_multiple(pad)

    def _with_pad_multiple(self, pad: int) -> PackingConfig:
        """A copy with ``pad_multiple=pad`` (checked by ``resolve``); every other field is as
        validated at construction, so it is not validated again (nor the scheduler built)."""
        resolved = copy.copy(self)
        object.__setattr__(resolved, "pad_multiple", int(pad))
        return resolved

    def _check_buckets(self, shapes: StaticShapes, capacity: int, cp: int, pad: int) -> None:
        shapes.check_pad_multiple(pad, capacity)  # multiples of pad; the largest is the capacity:
        if (top := shapes.buckets(capacity)[-1]) != capacity:
            raise ConfigError(
                f"the largest token bucket {top} (static_shapes.token_buckets) must be the microbatch's capacity "
                f"max_tokens_per_rank({self.max_tokens_per_rank}) * cp({cp}) = {capacity}: add {capacity} as the "
                f"largest bucket, or set max_tokens_per_rank to {top // cp if top % cp == 0 else 'it / cp'}"
            )

    def _resolve_dynamic(self, topology: Topology) -> PackingConfig:
        """``resolve`` under dynamic CP: ``pad_multiple`` is a sequence's alone on one rank
        (a group of ``c`` pads to ``2 * c`` times it)."""
        pad = self.pad_multiple
        if pad is None:
            pad = pad_multiple_for(1, topology.tp_size, self.sequence_parallel, self.fp8)
        ranks = topology.dp_size * topology.cp_size
        if self.max_tokens_per_rank * ranks > MAX_TOKENS:
            raise ConfigError(
                f"max_tokens_per_rank({self.max_tokens_per_rank}) * dp*cp({ranks}) tokens is too large for "
                f"dynamic CP (at most 2**53 = {MAX_TOKENS})"
            )
        if self.max_tokens_per_rank < pad:
            raise ConfigError(
                f"max_tokens_per_rank={self.max_tokens_per_rank} is smaller than pad_multiple={pad}: no sequence "
                "fits a rank"
            )
        return self._with_pad_multiple(pad)

    def summary(self, scheduler: Scheduler | None = None) -> dict[str, str]:
        """Every field that changes the data, as text (what resume compares and reports).
        ``scheduler``: this config's :meth:`build_scheduler`, where the caller holds it
        (``None``: built here)."""
        if scheduler is None:
            scheduler = self.build_scheduler()
        return {
            "samples_per_rank": str(self.samples_per_rank),
            "max_tokens_per_rank": str(self.max_tokens_per_rank),
            "pad_multiple": str(self.pad_multiple),
            "data_owner": str(self.data_owner),
            "on_oversize": str(self.on_oversize),
            "drop_last": str(self.drop_last),
            "check_schedule": str(self.check_schedule),
            # The scheduler with its options, and the cost: ranks that differ in either
            # compute different schedules from the same lengths.
            "scheduler": repr(scheduler),
            "cost": repr(self.cost),
            "sync": str(self.sync),
            "calibrate": repr(self.calibrate),
            "label_format": str(self.label_format),
            "cp_layout": str(self.cp_layout),
            "group_microbatch": str(self.group_microbatch),
            "equal_samples_per_replica": str(self.equal_samples_per_replica),
            "minibatches": str(self.minibatches),
            "static_shapes": repr(self.static_shapes),
            "dynamic_cp": str(self.dynamic_cp),
            "mrope": repr(self.mrope),
            "model": repr(self.model),
        }

    def fingerprint(self, scheduler: Scheduler | None = None) -> int:
        """A 63-bit hash of :meth:`summary` (``scheduler``: as there)."""
        return fingerprint_text(repr(sorted(self.summary(scheduler).items())))


def resolved_cost(config: PackingConfig, scheduler: Scheduler) -> CostModel:
    """The cost model a wrapper's steps are measured in and calibration starts from: the
    config's ``cost``, else the one its scheduler balances, else the default FLOPs model."""
    return scheduler.resolve_cost(config.cost) or default_cost_model()
