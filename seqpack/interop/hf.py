"""Hugging Face transformers: a :class:`~seqpack.thd.PackedBatch` as the keyword arguments of
a causal LM's ``forward``, in the padding-free format of ``DataCollatorWithFlattening``.

``model(**to_hf(batch))`` attends within each sequence on sdpa, eager, flex_attention and
flash_attention_2, and its ``.loss`` is the mean over the batch's supervised tokens (or their
sum over ``num_items_in_batch``). How each part gets there:

- No ``attention_mask`` and ``use_cache=False``: only then do sdpa / eager / flex find the
  sequences from ``position_ids`` (``masking_utils.find_packed_sequence_indices``: a sequence
  starts wherever a position is not the previous one plus 1). With a cache (the default, even
  in ``train()``) they attend across documents.
- Pads: seqpack pads each sequence at its end and its ``position_ids`` keep counting through
  the pad, so a pad joins its own sequence, after every real token of it (causal attention
  never lets a real token see it), and the next sequence still starts at 0. The pack's tail
  pad is the last sequence's. ``cu_seq_lens_q/k`` (flash_attention_2) are the padded offsets
  (``cu_seqlens_padded``), the same segmentation; ``max_length_q/k`` the largest padded
  length. Pads carry no loss.
- Labels: ``labels`` in HF's convention (aligned with ``input_ids``, -100 at each sequence's
  first token, which nothing predicts) and ``shift_labels`` (the next-token targets HF's
  ``ForCausalLMLoss`` uses as they are, without shifting ``labels``). Both carry -100 wherever
  seqpack's ``loss_mask`` is 0. ``shift_labels`` also keeps a target at the pack's very last
  token, which the ``labels`` convention cannot express.

transformers itself is never imported here.
"""

from __future__ import annotations

import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT64_MAX
from seqpack.thd.batch import PackedBatch
from seqpack.thd.sample import IGNORE_INDEX
from seqpack.validation import check_positive_int

__all__ = ["HF_KEYS", "to_hf"]

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
"""The keys :func:`to_hf` returns (``labels`` and ``shift_labels`` only for a batch with labels;
``num_items_in_batch`` too when given)."""

HfValue = torch.Tensor | int | bool


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
            it (give the step's supervised-token count to normalise over gradient
            accumulation and DP ranks). A positive integer, or a 0-d integer tensor (as
            HF's Trainer passes it, on any device). Left out, the loss is this batch's
            token mean.
        check: Verify, with one host sync, that ``position_ids`` restart exactly at each
            sequence (else sdpa / eager / flex would join or split documents), that
            ``loss_mask`` is 0 or 1 (HF's loss cannot weight tokens) and that a tensor
            ``num_items_in_batch`` is positive (without ``check`` its value is not read).

    Returns:
        ``input_ids``, ``position_ids`` (int64 ``[1, T]``), ``labels`` and ``shift_labels``
        (int64 ``[1, T]``, when the batch has labels), ``cu_seq_lens_q`` / ``_k`` (int32
        ``[N+1]``), ``max_length_q`` / ``_k`` (int), ``seq_idx`` (int32 ``[1, T]``),
        ``use_cache=False`` and ``num_items_in_batch`` when given.

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
    if num_items_in_batch is not None:
        kwargs["num_items_in_batch"] = num_items_in_batch
    return kwargs


def _count_argument(value: object) -> int | torch.Tensor | None:
    """``num_items_in_batch`` as HF takes it: ``None``, an int >= 1 or a 0-d integer tensor
    (whose value :func:`_check_for_hf` reads)."""
    name = "to_hf: num_items_in_batch"
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return check_positive_int(name, value, maximum=INT64_MAX)
    if value.dim() != 0:
        raise SeqpackTypeError(
            f"{name} must be a positive integer or a 0-d integer tensor, got a tensor of shape {tuple(value.shape)}"
        )
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise SeqpackTypeError(
            f"{name} must be a positive integer or a 0-d integer tensor, got a tensor of dtype {value.dtype}"
        )
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
