"""Hugging Face transformers: a :class:`~seqpack.thd.PackedBatch` as the keyword arguments of
a causal LM's ``forward``, in the padding-free format of ``DataCollatorWithFlattening``
(:func:`to_hf`), and :class:`SeqpackTrainerMixin`, which makes one optimizer step of a
``transformers.Trainer`` (or TRL's ``SFTTrainer``) one seqpack step.

``model(**to_hf(batch))`` attends within each sequence on sdpa, eager, flex_attention and
flash_attention_2 only without ``attention_mask`` and with ``use_cache=False`` (sdpa / eager /
flex find the sequences from ``position_ids``); pads join their own sequence; ``labels`` are
HF-aligned and ``shift_labels`` the next-token targets. Why each part is so:
docs/integrations.md, "Your own loop: to_hf". transformers itself is never imported here.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.interop.hf_encoder import EncoderRebalance, calibrated_seconds_per_flop, rebalance_for_config
from seqpack.interop.hf_rows import (
    SAMPLE_COLUMNS,
    StepLoader,
    check_step,
    packing_config,
    sample_of,
    step_count,
    token_ids,
    with_model_mrope,
)
from seqpack.interop.hf_vision import vision_kwargs
from seqpack.loader.config import PackingConfig
from seqpack.loader.iterator import PackingIterator, wrap_data_iterator
from seqpack.loader.step import Step
from seqpack.options import INT64_MAX
from seqpack.thd.batch import PackedBatch
from seqpack.thd.sample import IGNORE_INDEX, VISION_FIELDS
from seqpack.topology import Topology
from seqpack.validation import check_positive_int

__all__ = ["HF_KEYS", "HF_VISION_KEYS", "SeqpackTrainerMixin", "to_hf"]

logger = logging.getLogger(__name__)

HF_KEYS: tuple[str, ...] = (
    "input_ids",
    "position_ids",
    "labels",
    "shift_labels",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "seq_idx",
    "use_cache",
)
"""The keys :func:`to_hf` returns (``labels`` and ``shift_labels`` only for a batch with labels)."""

HF_VISION_KEYS: tuple[str, ...] = (*HF_KEYS, *VISION_FIELDS)
"""The keys :func:`to_hf` returns for a vision-language pack."""

HfValue = torch.Tensor | int | bool

_TOKEN_MEAN_METRICS: tuple[str, ...] = ("mean_token_accuracy", "entropy")
"""TRL's logged metrics that are means over a forward's supervised tokens."""


def to_hf(
    batch: PackedBatch,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
    check: bool = True,
) -> dict[str, HfValue]:
    """The keyword arguments of a Hugging Face causal LM's ``forward`` for ``batch``.

    Args:
        batch: A whole microbatch (not a CP shard) with tokens (not a middle pipeline
            stage's metadata-only batch).
        num_items_in_batch: Passed on: HF's loss is then the sum of token losses divided by
            it. A positive integer, or a 0-d integer tensor (as HF's Trainer passes it). Left
            out, the loss is this batch's token mean.
        check: Verify, with one host sync, that ``position_ids`` restart exactly at each
            sequence, that ``loss_mask`` is 0 or 1 and that a tensor ``num_items_in_batch``
            is positive.

    Returns:
        ``input_ids``, ``position_ids`` (int64 ``[1, T]``), ``labels`` and ``shift_labels``
        (int64 ``[1, T]``, when the batch has labels), ``cu_seq_lens_q`` / ``_k`` (int32
        ``[N+1]``), ``max_length_q`` / ``_k`` (int), ``seq_idx`` (int32 ``[1, T]``),
        ``use_cache=False`` and ``num_items_in_batch`` when given. A vision-language pack
        also gets ``mm_token_type_ids``, the pixels and grids, and ``position_ids`` int64
        ``[4, 1, T]`` (:mod:`seqpack.interop.hf_vision`).

    Raises:
        ConfigError: A CP shard, a batch without ``input_ids``, a ``num_items_in_batch``
            below 1, or (with ``check``) position ids that do not restart at each sequence
            or a ``loss_mask`` other than 0 and 1.
        SeqpackTypeError: A ``num_items_in_batch`` that is not an integer (a float, a bool,
            a string, a list) or a tensor that is not a 0-d integer one.
    """
    if batch.cp_size > 1:
        raise ConfigError(
            f"to_hf got CP rank {batch.cp_rank}'s shard of a cp_size={batch.cp_size} batch: Hugging Face models have "
            "no THD context parallelism; pack with cp_size=1 for them, or run seqpack's compute stages under CP"
        )
    if batch.input_ids is None:
        raise ConfigError(
            "to_hf needs a batch with input_ids; this one holds the layout only (a middle pipeline stage's)"
        )
    num_items_in_batch = _count_argument(num_items_in_batch)
    if check:
        _check_for_hf(batch, num_items_in_batch)
    kwargs: dict[str, HfValue] = {
        "input_ids": batch.input_ids[None],  # [1, T]
        "position_ids": batch.position_ids[None],  # [1, T]
    }
    if batch.labels is not None:
        targets = batch.labels
        if batch.loss_mask is not None:
            targets = torch.where(batch.loss_mask > 0, targets, IGNORE_INDEX)
        aligned = torch.full_like(targets, IGNORE_INDEX)  # HF's labels: target of token t sits at t + 1
        aligned[1:] = targets[:-1]
        kwargs["labels"] = aligned[None]  # [1, T]
        kwargs["shift_labels"] = targets[None]  # [1, T]
    # Every token, pads included, sits in its sequence's padded slot (see the module docs).
    cu = batch.cu_seqlens_padded.to(torch.int32)
    kwargs.update(
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=int(batch.max_seqlen),
        max_length_k=int(batch.max_seqlen),
        seq_idx=batch.seq_idx.to(torch.int32)[None],  # [1, T]
        use_cache=False,
    )
    if batch.has_vision:  # position_ids [4, 1, T], mm_token_type_ids, pixels and grids
        kwargs.update(vision_kwargs(batch))
    if num_items_in_batch is not None:
        kwargs["num_items_in_batch"] = num_items_in_batch
    return kwargs


def _count_argument(value: object) -> int | torch.Tensor | None:
    """``num_items_in_batch`` as HF takes it: ``None``, an int >= 1 or a 0-d integer tensor."""
    name = "to_hf: num_items_in_batch"
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return check_positive_int(name, value, maximum=INT64_MAX)
    if value.dim() != 0 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        what = f"shape {tuple(value.shape)}" if value.dim() != 0 else f"dtype {value.dtype}"
        raise SeqpackTypeError(f"{name} must be a positive integer or a 0-d integer tensor, got a tensor of {what}")
    return value


def _check_for_hf(batch: PackedBatch, num_items_in_batch: int | torch.Tensor | None) -> None:
    """Position ids that segment like the layout, a 0/1 loss mask and a positive tensor
    count (one host sync)."""
    positions, seq_idx = batch.position_ids, batch.seq_idx
    # Where HF starts a sequence (a position that is not the previous one plus 1) against
    # where the layout does (the sequence index changes); token 0 starts one in both.
    hf_starts = positions[1:] - positions[:-1] != 1
    starts = seq_idx[1:] != seq_idx[:-1]
    mismatch = hf_starts != starts
    flags = [mismatch.any()]
    if batch.loss_mask is not None:
        flags.append(((batch.loss_mask != 0) & (batch.loss_mask != 1)).any())
    if isinstance(num_items_in_batch, torch.Tensor):
        flags.append((num_items_in_batch <= 0).to(positions.device))
    found = torch.stack(flags).tolist()  # the one host sync
    bad_positions = found[0]
    bad_mask = batch.loss_mask is not None and found[1]
    bad_count = isinstance(num_items_in_batch, torch.Tensor) and found[-1]
    if bad_count:
        raise ConfigError(f"to_hf: num_items_in_batch must be a positive integer, got {num_items_in_batch!r}")
    if bad_positions:
        t = int(torch.nonzero(mismatch)[0]) + 1
        before, at, seq = int(positions[t - 1]), int(positions[t]), int(seq_idx[t])
        what = f"starts sequence {seq} but follows" if bool(starts[t - 1]) else f"inside sequence {seq} jumps from"
        raise ConfigError(
            f"to_hf: position_ids[{t}]={at} {what} position {before}: Hugging Face's sdpa/eager/flex attention start "
            "a sequence exactly where a position is not the previous one plus 1, so documents would be joined or "
            "split; give position_ids that restart at 0 for every sequence and count up by 1 (seqpack's default)"
        )
    if bad_mask:
        assert batch.loss_mask is not None
        t = int(torch.nonzero((batch.loss_mask != 0) & (batch.loss_mask != 1))[0])
        raise ConfigError(
            f"to_hf: loss_mask holds weights other than 0 and 1 (loss_mask[{t}]={batch.loss_mask[t].item()}), which "
            "Hugging Face's loss cannot apply; compute the loss from the logits with the mask, or pass check=False "
            "to count every token with a mask > 0 fully"
        )


class SeqpackTrainerMixin:
    """One optimizer step of a ``transformers.Trainer`` is one seqpack step.

    Put it first in the bases: ``class T(SeqpackTrainerMixin, SFTTrainer)`` (or ``Trainer``),
    and construct ``T(..., seqpack_config={"max_tokens_per_rank": 4096})``. The Trainer's own
    data loader reads ``per_device_train_batch_size`` rows per rank and step; seqpack balances
    them over the ranks and packs them into microbatches; :meth:`training_step` runs them all
    (the gradient reduction deferred to the last) with ``num_items_in_batch =
    step.num_loss_tokens``, so the optimizer step's gradient is the step's token mean's. TRL's
    token-mean metrics are logged over the step's tokens. docs/integrations.md, "Trainer".

    Args (keyword, besides the trainer's own):
        seqpack_config: A :class:`~seqpack.loader.config.PackingConfig`, or a mapping of its
            fields (``max_tokens_per_rank`` required; ``samples_per_rank`` defaults to
            ``per_device_train_batch_size``, ``label_format`` to ``"unshifted"``,
            ``drop_last`` to ``False``). For a vision-language model seqpack positions,
            ``mrope`` is the model's and, on more than one process unless
            ``encoder_rebalance=False``, its images are encoded across the DP ranks
            (:attr:`seqpack_encoder_rebalance`; docs/multimodal.md, "Trainer").
        seqpack_topology: The ranks to balance over; default: every process of the process
            group accelerate / torchrun set up, as DP ranks.

    Raises:
        ConfigError: A setting under which a step could not be one exact optimizer step, by
            name (docs/errors.md, "Hugging Face Trainer"), a ``data_collator`` (training
            batches are the mixin's), a ``mrope`` other than the model's, or a batch that is
            not a whole step.
    """

    # Set by the trainer this class is mixed into.
    model: Any
    args: Any
    accelerator: Any
    model_accepts_loss_kwargs: bool
    compute_loss_func: Any
    data_collator: Any
    current_gradient_accumulation_steps: int

    def __init__(
        self,
        *args: Any,
        seqpack_config: PackingConfig | Mapping[str, Any],
        seqpack_topology: Topology | None = None,
        **kwargs: Any,
    ) -> None:
        trainer: Any = super()
        collator = inspect.signature(trainer.__init__).bind_partial(*args, **kwargs).arguments.get("data_collator")
        if collator is not None:
            raise ConfigError(
                f"SeqpackTrainerMixin: data_collator={type(collator).__name__} would not be used for training: the "
                f"mixin makes each row a sample itself (its columns {', '.join(SAMPLE_COLUMNS)}) and packs them, and "
                "a collator's padded batch cannot be split back into exact samples; put what it computes in the "
                "dataset's columns (labels for your own mask) and leave data_collator out"
            )
        trainer.__init__(*args, **kwargs)
        if seqpack_topology is not None and not isinstance(seqpack_topology, Topology):
            raise SeqpackTypeError(f"seqpack_topology must be a Topology, got {type(seqpack_topology).__name__}")
        config = packing_config(seqpack_config, self.args.per_device_train_batch_size)
        self._seqpack_config = with_model_mrope(config, getattr(self, "model", None))
        self._seqpack_topology = seqpack_topology
        self._seqpack_loader: StepLoader | None = None
        self._seqpack_reading_rows = False
        self._seqpack_hooked = False
        self.seqpack_encoder_rebalance: EncoderRebalance | None = None
        """The encoder-rebalancing hooks on the model (``None``: off, or no loader yet)."""
        self._check_seqpack_settings()

    def _check_seqpack_settings(self) -> None:
        """Refuse, by name, what would make a step other than one exact optimizer step."""
        args, name = self.args, "SeqpackTrainerMixin"
        if args.gradient_accumulation_steps != 1:
            raise ConfigError(
                f"{name}: gradient_accumulation_steps={args.gradient_accumulation_steps}, but one optimizer step is "
                "one seqpack step, whose microbatches (as many as its packing needs) the mixin runs itself; set "
                "gradient_accumulation_steps=1 and raise per_device_train_batch_size (seqpack's samples_per_rank) "
                "for a larger step"
            )
        if self._seqpack_config.samples_per_rank != args.per_device_train_batch_size:
            raise ConfigError(
                f"{name}: samples_per_rank={self._seqpack_config.samples_per_rank} but "
                f"per_device_train_batch_size={args.per_device_train_batch_size}: each batch the Trainer reads is one "
                "seqpack step's rows, so they must be equal (leave samples_per_rank out)"
            )
        if getattr(args, "packing", False):
            raise ConfigError(
                f"{name}: packing=True packs the dataset before seqpack sees it; set packing=False (seqpack packs and "
                "balances each step itself)"
            )
        accelerator = self.accelerator
        if str(getattr(accelerator, "distributed_type", "")).upper().endswith("DEEPSPEED"):
            raise ConfigError(f"{name}: DeepSpeed steps its optimizer on its own schedule; use DDP or FSDP")
        trainer: Any = self
        for axis in ("tp", "cp", "sp"):
            size = getattr(trainer, f"get_{axis}_size", lambda: 1)()
            if size != 1:
                raise ConfigError(
                    f"{name}: accelerate's {axis}_size={size}; the mixin balances over DP ranks only (every process "
                    "a DP rank): leave accelerate's parallelism_config at dp only"
                )
        if args.n_gpu > 1:
            raise ConfigError(f"{name}: n_gpu={args.n_gpu} (DataParallel); launch one process per GPU (torchrun)")
        if accelerator.num_processes > 1 and not args.average_tokens_across_devices:
            raise ConfigError(
                f"{name}: average_tokens_across_devices=False on {accelerator.num_processes} processes: the "
                "Trainer would not scale the loss by the processes DDP averages over; leave it True (the default)"
            )
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            raise ConfigError(
                f"{name}: the model's forward takes no num_items_in_batch (model_accepts_loss_kwargs=False), so its "
                "loss would be each microbatch's mean; use a model whose forward takes **kwargs, or pass "
                "compute_loss_func"
            )

    def _seqpack_topology_now(self) -> Topology:
        """The given topology, else every process of the default group as a DP rank."""
        topology = self._seqpack_topology
        if topology is None:
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                topology = Topology.from_groups(dp=dist.group.WORLD)
            else:
                topology = Topology.single()
        processes = self.accelerator.num_processes
        if topology.dp_size != processes or topology.world_size != processes:
            raise ConfigError(
                f"SeqpackTrainerMixin: seqpack_topology has dp_size={topology.dp_size} over {topology.world_size} "
                f"ranks, but accelerate runs {processes} processes, each a DP rank of the Trainer: pass a topology "
                "with dp_size equal to the process count (or none)"
            )
        return topology

    def get_train_dataloader(self) -> Any:
        """The Trainer's own loader of raw rows as seqpack steps: one step per batch of rows."""
        self._check_seqpack_settings()
        trainer: Any = super()
        collator, self.data_collator = self.data_collator, list  # a batch is its rows
        self._seqpack_reading_rows = True
        try:
            rows = trainer.get_train_dataloader()
        finally:
            self.data_collator, self._seqpack_reading_rows = collator, False
        topology, config = self._seqpack_topology_now(), self._seqpack_config
        use_completion_mask = getattr(self, "completion_only_loss", None) is not False
        device = self.args.device

        def steps_of(rows_iter: Iterator[Any]) -> PackingIterator:
            samples = (sample_of(row, use_completion_mask) for batch in rows_iter for row in batch)
            return wrap_data_iterator(samples, topology, config, device=device)

        if self._seqpack_loader is not None:
            self._seqpack_loader.close()
        self._seqpack_loader = StepLoader(rows, steps_of)
        if not self._seqpack_hooked:  # collective: every process makes its first loader here
            self._seqpack_hooked = True
            self.seqpack_encoder_rebalance = self._seqpack_rebalance(topology, config)
        return self._seqpack_loader

    def _seqpack_rebalance(self, topology: Topology, config: PackingConfig) -> EncoderRebalance | None:
        """Hook the model for ``config.encoder_rebalance`` (off on one process), priced by the
        current epoch's calibrator."""

        def price() -> float:
            steps = self._seqpack_loader.steps if self._seqpack_loader is not None else None
            return calibrated_seconds_per_flop(steps.calibrator if steps is not None else None)

        return rebalance_for_config(self.model, topology, config, price)

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        if self._seqpack_reading_rows:  # keep what the samples are made of
            unused = [c for c in dataset.column_names if c not in SAMPLE_COLUMNS]
            return dataset.remove_columns(unused) if unused else dataset
        trainer: Any = super()
        return trainer._remove_unused_columns(dataset, description=description)

    def _get_collator_with_removed_columns(self, data_collator: Any, description: str | None = None) -> Any:
        if self._seqpack_reading_rows:  # sample_of reads SAMPLE_COLUMNS only
            return data_collator
        trainer: Any = super()
        return trainer._get_collator_with_removed_columns(data_collator, description=description)

    def get_batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int, device: Any) -> tuple[list[Any], Any]:
        """One seqpack step, and its supervised-token count over every rank."""
        if num_batches != 1:
            raise ConfigError(
                f"SeqpackTrainerMixin: the Trainer asked for {num_batches} batches for one optimizer step; each batch "
                "is a whole seqpack step, so it must ask for 1 (gradient_accumulation_steps=1)"
            )
        step = next(epoch_iterator, None)
        if step is None:
            return [], None
        check_step(step)
        return [step], step_count(step)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """Forward and backward over every microbatch of the step ``inputs``; the gradient
        reduction runs with the last one. Returns the step's loss (this rank's share times the
        process count, as the Trainer's own step does)."""
        step = check_step(inputs)
        count = step_count(step)
        if num_items_in_batch is not None and int(num_items_in_batch) != count:
            raise ConfigError(
                f"SeqpackTrainerMixin: step {step.step} has {count} loss tokens but the Trainer passed "
                f"num_items_in_batch={int(num_items_in_batch)}: a count from other batches would mix steps"
            )
        trainer: Any = super()
        self.current_gradient_accumulation_steps = max(step.num_microbatches, 1)
        logged = getattr(self, "_metrics", {}).get("train", {})  # TRL's lists, one entry per forward
        before = {key: len(logged.get(key, ())) for key in _TOKEN_MEAN_METRICS}
        total = torch.zeros((), device=self.args.device)
        last = len(step.microbatches) - 1
        for i, batch in enumerate(step.microbatches):
            deferred = contextlib.nullcontext() if i == last else self.accelerator.no_sync(model)
            with deferred:
                total = total + trainer.training_step(model, to_hf(batch), count)
        if any(len(logged.get(key, ())) - start > 1 for key, start in before.items()):
            self._merge_token_means(logged, before, step)
        return total

    def _merge_token_means(self, logged: Mapping[str, list[float]], before: dict[str, int], step: Step) -> None:
        """Replace TRL's per-microbatch token means of ``step`` by one mean over its tokens
        (one gather)."""
        local = [batch.num_loss_tokens or 0 for batch in step.microbatches]
        gathered = self.accelerator.gather(torch.tensor(local, device=self.args.device))
        tokens = gathered.view(-1, len(local)).sum(dim=0).tolist()  # [M], every process's
        total = sum(tokens)
        for key, start in before.items():
            means = logged.get(key, [])[start:]
            if len(means) == len(tokens):
                merged = sum(m * n for m, n in zip(means, tokens, strict=True)) / total if total else 0.0
                logged[key][start:] = [merged]

    def floating_point_ops(self, inputs: Any) -> int:
        trainer: Any = super()
        if not isinstance(inputs, Step):
            return int(trainer.floating_point_ops(inputs))
        return sum((int(trainer.floating_point_ops({"input_ids": ids})) for ids in token_ids(inputs)), 0)

    def _track_num_input_tokens(self, inputs: Any) -> None:
        trainer: Any = super()
        for batch in token_ids(inputs) if isinstance(inputs, Step) else [inputs]:
            trainer._track_num_input_tokens(batch if not isinstance(inputs, Step) else {"input_ids": batch})

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; the step iterator is closed when it returns."""
        if resume_from_checkpoint not in (None, False):
            raise ConfigError(
                f"SeqpackTrainerMixin: resume_from_checkpoint={resume_from_checkpoint!r} is not supported yet (the "
                "Trainer would skip batches of the row loader, not seqpack steps); train from the start"
            )
        trainer: Any = super()
        try:
            return trainer.train(resume_from_checkpoint, *args, **kwargs)
        finally:
            if self._seqpack_loader is not None:
                self._seqpack_loader.close()
