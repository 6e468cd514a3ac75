"""Building THD microbatches: from samples (:func:`pack_sequences`) and from a layout alone
(:func:`batch_from_layout`, what the wire decoder and middle pipeline stages need)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.options import LABEL_COPY_MIN_TOKENS, CpLayout, LabelFormat
from seqpack.thd.batch import PackedBatch
from seqpack.thd.cp import partition_indices
from seqpack.thd.layout import Offsets, as_offsets, token_layout
from seqpack.thd.mrope import MRopeSpec
from seqpack.thd.padding import check_cp, padded_lengths
from seqpack.thd.sample import (
    IGNORE_INDEX,
    default_labels,
    label_alignment_counts,
    looks_misaligned,
    misaligned_labels,
    misaligned_labels_message,
    next_token_targets,
    normalize_sample,
)
from seqpack.thd.static_shapes import StaticShapes, as_static_shapes
from seqpack.thd.vision import has_vision, normalize_vision, pack_vision, text_part
from seqpack.validation import (
    INT32_MAX,
    INT64_MAX,
    check_choice,
    check_fits_memory,
    check_int,
    check_optional_int,
    check_positive_int,
)

__all__ = [
    "batch_from_layout",
    "pack_sequences",
]


def pack_sequences(
    samples: Sequence[Mapping[str, Any]],
    *,
    pad_multiple: int = 1,
    pad_to: int | None = None,
    pad_token_id: int = 0,
    sample_ids: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    label_format: LabelFormat | str = LabelFormat.SHIFTED,
    static_shapes: StaticShapes | None = None,
    mrope: MRopeSpec | None = None,
) -> PackedBatch:
    """Pack samples into one THD microbatch.

    Each sequence is padded at its end to a multiple of ``pad_multiple``; ``pad_to`` then pads
    the pack's tail, absorbed into the last sequence's padding so every token belongs to a
    sequence. Pads carry ``pad_token_id``, label ``-100`` and loss mask 0; ``position_ids``
    restart at 0 for every sequence and keep counting through its padding. The packed labels
    are next-token targets whatever the ``label_format``; the loss mask is 0 where they are -100.

    Args:
        samples: Samples of the sample contract (:func:`seqpack.thd.normalize_sample`):
            ``input_ids`` required; ``labels`` defaults to the next-token labels of
            ``input_ids`` (last token -100), ``loss_mask`` to ``labels != -100``,
            ``position_ids`` to ``arange(len)``.
        pad_multiple: Every sequence's padded length is a multiple of this.
        pad_to: Total token count of the pack (a multiple of ``pad_multiple``).
        pad_token_id: Token id written into pad slots.
        sample_ids: Global id of every sample (default ``0..N-1``).
        label_format: The alignment of ``labels`` (:class:`~seqpack.options.LabelFormat`):
            ``"shifted"`` (next-token targets, Megatron, NeMo), ``"unshifted"`` (Hugging Face,
            shifted here within each sequence) or ``"position_aligned"`` (used as given).
        static_shapes: Fixed shapes (:class:`~seqpack.thd.StaticShapes`); ``pad_to`` is then
            the capacity of ``token_buckets="capacity"`` (refused beside buckets).
        mrope: A vision-language model's ``MRopeSpec.from_hf(model.config)``, for samples with
            images or videos (:mod:`seqpack.thd.vision`).

    Raises:
        SeqpackTypeError, SampleError: A sample that breaks the sample contract (under
            ``mrope``, also :mod:`seqpack.thd.vision`'s); a zero-length sequence; labels
            aligned the other way than ``label_format`` says
            (:func:`seqpack.thd.sample.check_label_format`).
        ConfigError: Empty ``samples``, a pack longer than ``pad_to``, bad padding arguments,
            an unknown ``label_format`` or wrong-length ``sample_ids``; images without ``mrope``;
            a pack that ``static_shapes`` refuses.
    """
    pad_multiple, pad_to = _check_padding(samples, pad_multiple, pad_to, static_shapes)
    pad_token_id = check_int("pad_token_id", pad_token_id, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
    label_format = check_choice("label_format", label_format, LabelFormat)

    texts = _text_samples(samples, mrope)  # without multi-row positions
    sequences = [normalize_sample(sample, where=f"sample {i}") for i, sample in enumerate(texts)]
    lengths = np.fromiter((sequence["input_ids"].numel() for sequence in sequences), np.int64, len(sequences))
    if not lengths.all():
        raise SampleError(f"sample {int(np.argmin(lengths))} has a zero-length sequence")
    cu_real, cu_padded, max_seqlen = _layout(lengths, pad_multiple, pad_to, static_shapes)

    stream = _real_stream(sequences, cu_real[: len(sequences) + 1], label_format)
    tokens = _place_tokens(stream, sequences, cu_real, cu_padded, pad_token_id)
    cu_seqlens = torch.from_numpy(cu_real.astype(np.int32))
    if np.array_equal(cu_real, cu_padded):
        cu_seqlens_padded = cu_seqlens  # same object: TE's no-padding fast path (TE #3487)
    else:
        cu_seqlens_padded = torch.from_numpy(cu_padded.astype(np.int32))
    return PackedBatch(
        **tokens,
        **_vision_fields(samples, sequences, mrope, cu_real, cu_padded),
        cu_seqlens=cu_seqlens,
        cu_seqlens_padded=cu_seqlens_padded,
        max_seqlen=max_seqlen,
        sample_ids=_slot_ids(_as_sample_ids(sample_ids, len(sequences)), cu_real.shape[0] - 1),
        num_loss_tokens=stream.num_loss_tokens,
    )


def _text_samples(samples: Sequence[Any], mrope: MRopeSpec | None) -> Sequence[Any]:
    """The samples for :func:`normalize_sample`; without ``mrope``, vision-language samples are
    refused."""
    if mrope is not None:
        if not isinstance(mrope, MRopeSpec):
            raise SeqpackTypeError(
                f"mrope must be an MRopeSpec (MRopeSpec.from_hf(config)), got {type(mrope).__name__}"
            )
        return [text_part(sample) if isinstance(sample, Mapping) else sample for sample in samples]
    for index, sample in enumerate(samples):
        if (type(sample) is dict or isinstance(sample, Mapping)) and has_vision(sample):  # type(): the fast case
            keys = sorted(str(key) for key in sample if key not in ("input_ids", "labels", "loss_mask"))
            raise ConfigError(
                f"sample {index} is a vision-language sample ({', '.join(keys)}) but pack_sequences got no mrope=: "
                "pass mrope=MRopeSpec.from_hf(model.config) (seqpack.thd.mrope) so that its placeholders are checked "
                "and its positions packed"
            )
    return samples


def _vision_fields(
    samples: Sequence[Mapping[str, Any]],
    sequences: Sequence[Mapping[str, torch.Tensor]],
    mrope: MRopeSpec | None,
    cu_real: np.ndarray,
    cu_padded: np.ndarray,
) -> dict[str, Any]:
    """The batch's vision fields, every sample checked (none for a pack without ``mrope``)."""
    if mrope is None:
        return {}
    vision = [
        normalize_vision(
            sample, sequence["input_ids"], mrope, text_positions=sequence.get("position_ids"), where=f"sample {i}"
        )
        for i, (sample, sequence) in enumerate(zip(samples, sequences, strict=True))
    ]
    layout = token_layout(cu_padded, cu_real, total_tokens=int(cu_padded[-1]), validate=False)
    return pack_vision(vision, cu_real, layout)


def _check_padding(
    samples: object, pad_multiple: int, pad_to: int | None, static_shapes: StaticShapes | None
) -> tuple[int, int | None]:
    """:func:`pack_sequences`' samples list and padding arguments, checked."""
    pad_multiple = check_positive_int("pad_multiple", pad_multiple, maximum=INT32_MAX)
    pad_to = check_optional_int("pad_to", pad_to, minimum=0, maximum=INT64_MAX)
    if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)):
        raise SeqpackTypeError(f"samples must be a list of sample mappings, got {type(samples).__name__}")
    if len(samples) == 0:
        raise ConfigError("pack_sequences needs at least one sample, got an empty list")
    if pad_to is not None and pad_to % pad_multiple != 0:
        raise ConfigError(f"pad_to={pad_to} must be a multiple of pad_multiple={pad_multiple}")
    if static_shapes is not None:
        _check_static_shapes(static_shapes, pad_multiple, pad_to)
    return pad_multiple, pad_to


def _layout(
    lengths: np.ndarray, pad_multiple: int, pad_to: int | None, static_shapes: StaticShapes | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """The pack's ``cu_seqlens``, ``cu_seqlens_padded`` (int64) and ``max_seqlen``: each
    sequence padded to ``pad_multiple`` and the tail to ``pad_to``, or the fixed layout of
    ``static_shapes``' bucket."""
    if static_shapes is None:
        padded = _padded_sizes(lengths, pad_multiple, pad_to)
        cu_real = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu_real[1:])
        cu_padded = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(padded, out=cu_padded[1:])
        return cu_real, cu_padded, int(padded.max())
    return static_shapes.layout(lengths, pad_multiple, pad_to)


def _check_static_shapes(static_shapes: object, pad_multiple: int, pad_to: int | None) -> None:
    static_shapes = as_static_shapes(static_shapes)
    assert static_shapes is not None  # the caller passes one
    if pad_to is not None and static_shapes.token_buckets != "capacity":
        raise ConfigError(
            f"pad_to={pad_to} and token_buckets={static_shapes.token_buckets} both fix the pack's token count: "
            "give one (pad_to is the capacity of token_buckets='capacity')"
        )
    static_shapes.check_pad_multiple(pad_multiple, pad_to)


def _slot_ids(sample_ids: torch.Tensor, num_slots: int) -> torch.Tensor:
    """One id per slot: the samples' ids, then -1 for the tail's slot and unused slots."""
    if sample_ids.shape[0] == num_slots:
        return sample_ids
    return torch.cat([sample_ids, sample_ids.new_full((num_slots - sample_ids.shape[0],), -1)])


def _padded_sizes(lengths: np.ndarray, pad_multiple: int, pad_to: int | None) -> np.ndarray:
    """Every sequence's padded length; the pack's tail (``pad_to``) goes to the last one."""
    padded = padded_lengths(lengths, pad_multiple)
    padded_total = int(padded.sum())
    if pad_to is not None:
        if pad_to < padded_total:
            raise ConfigError(
                f"pack needs {padded_total} tokens ({lengths.size} sequences, {int(lengths.sum())} real, "
                f"pad_multiple={pad_multiple}) but pad_to={pad_to}"
            )
        padded[-1] += pad_to - padded_total
        padded_total = pad_to
    if padded_total > INT32_MAX:  # cu_seqlens are int32 (Transformer Engine's contract)
        raise ConfigError(
            f"a pack of {padded_total} tokens is too large: cu_seqlens are int32 (at most 2**31 - 1 tokens); "
            f"pad_multiple={pad_multiple}" + (f", pad_to={pad_to}" if pad_to is not None else "")
        )
    check_fits_memory(f"a pack of {padded_total} tokens", 40 * padded_total)  # ~5 tensors of 8 bytes a token
    return padded


@dataclasses.dataclass
class _RealStream:
    """The real tokens of a pack, concatenated: ids and next-token targets."""

    input_ids: torch.Tensor  # int64 [R]
    labels: torch.Tensor  # int64 [R], next-token targets
    loss_mask: torch.Tensor  # float32 [R], 0 where labels are -100
    last: torch.Tensor  # int64 [N], index of every sequence's last real token
    num_loss_tokens: int


def _real_stream(
    sequences: Sequence[Mapping[str, torch.Tensor]], cu_real: np.ndarray, label_format: LabelFormat
) -> _RealStream:
    """Labels and loss mask of the real tokens: each sample's own where given (checked against
    ``label_format``, moved one token left under ``"unshifted"``), the next tokens elsewhere."""
    flat_ids = torch.cat([sequence["input_ids"] for sequence in sequences])  # [R]
    last = torch.from_numpy(cu_real[1:] - 1)  # [N]
    # Optional fields any sample carries (most packs carry none, or all carry the same).
    optional = set().union(*(sequence.keys() for sequence in sequences if len(sequence) > 1))
    labels = default_labels(flat_ids, last, label_format)
    mask = None
    if "labels" in optional:
        _override(labels, sequences, "labels", cu_real)
    if "loss_mask" in optional:
        mask = torch.ones(flat_ids.shape[0], dtype=torch.float32)
        _override(mask, sequences, "loss_mask", cu_real)
    if "labels" in optional and label_format is not LabelFormat.POSITION_ALIGNED:
        _refuse_misaligned_labels(flat_ids, labels, mask, last, cu_real, label_format)
    labels, mask = next_token_targets(labels, mask, last, label_format)
    num_loss_tokens = int((mask > 0).sum())
    return _RealStream(flat_ids, labels, mask, last, num_loss_tokens)


def _refuse_misaligned_labels(
    ids: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None,
    last: torch.Tensor,
    cu_real: np.ndarray,
    label_format: LabelFormat,
) -> None:
    """Raise for the first sample whose labels are aligned the other way than declared."""
    # Labels in the declared alignment have no misaligned token: one count settles the common case.
    if int(misaligned_labels(ids, labels, mask, last, label_format)[1].sum()) < LABEL_COPY_MIN_TOKENS:
        return
    checked, misaligned = label_alignment_counts(ids, labels, mask, cu_real, label_format)
    refused = np.flatnonzero(looks_misaligned(checked, misaligned))
    if refused.size:
        i = int(refused[0])
        raise SampleError(misaligned_labels_message(f"sample {i}", int(checked[i]), int(misaligned[i]), label_format))


class _TokenFields(TypedDict):
    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    seq_idx: torch.Tensor
    padding_mask: torch.Tensor


def _place_tokens(
    stream: _RealStream,
    sequences: Sequence[Mapping[str, torch.Tensor]],
    cu_real: np.ndarray,
    cu_padded: np.ndarray,
    pad_token_id: int,
) -> _TokenFields:
    """The token fields of the pack: real tokens at their slots, pads around them (also in the
    slots past ``sequences`` of a fixed-shape pack)."""
    num_seqs = len(sequences)
    cu_seq = cu_real[: num_seqs + 1]  # the samples' own sequences
    padded_total = int(cu_padded[-1])
    no_padding = padded_total == int(cu_real[-1])
    layout = token_layout(cu_padded, None if no_padding else cu_real, total_tokens=padded_total, validate=False)
    has_positions = any("position_ids" in sequence for sequence in sequences)
    position_ids = layout.position
    if no_padding:  # the real stream is the pack
        if has_positions:
            _override(position_ids, sequences, "position_ids", cu_seq)
        return _TokenFields(
            input_ids=stream.input_ids,
            labels=stream.labels,
            loss_mask=stream.loss_mask,
            position_ids=position_ids,
            seq_idx=layout.seq_idx,
            padding_mask=layout.padding_mask,
        )
    dest = torch.from_numpy(np.flatnonzero(~layout.padding_mask.numpy()))  # [R], where each real token goes
    if has_positions:
        pos_real = position_ids.index_select(0, dest)
        _override(pos_real, sequences, "position_ids", cu_seq)
        # Pads keep counting from their sequence's last real position; slots past the
        # samples' sequences (a fixed-shape pack's tail slot) count from 0.
        lengths = torch.from_numpy(cu_seq[1:] - cu_seq[:-1])
        shift_pos = pos_real[stream.last] - (lengths - 1)  # [N]
        shift_pos = torch.cat([shift_pos, shift_pos.new_zeros(cu_padded.shape[0] - num_seqs)])  # [slots + 1]
        position_ids = position_ids + shift_pos[layout.seq_idx]
        position_ids.scatter_(0, dest, pos_real)
    return _TokenFields(
        input_ids=torch.full((padded_total,), pad_token_id, dtype=torch.int64).scatter_(0, dest, stream.input_ids),
        labels=torch.full((padded_total,), IGNORE_INDEX, dtype=torch.int64).scatter_(0, dest, stream.labels),
        loss_mask=torch.zeros(padded_total, dtype=torch.float32).scatter_(0, dest, stream.loss_mask),
        position_ids=position_ids,
        seq_idx=layout.seq_idx,
        padding_mask=layout.padding_mask,
    )


def _override(
    target: torch.Tensor, sequences: Sequence[Mapping[str, torch.Tensor]], key: str, cu_real: np.ndarray
) -> None:
    """Write each sequence's own ``key`` (where it has one) over the defaults in ``target``."""
    values = [sequence.get(key) for sequence in sequences]
    present = [value for value in values if value is not None]
    if len(present) == len(values):  # the common case: one concatenation
        target.copy_(torch.cat(present))
        return
    for index, value in enumerate(values):
        if value is not None:
            target[cu_real[index] : cu_real[index + 1]] = value


def _as_sample_ids(sample_ids: Any, num_seqs: int) -> torch.Tensor:
    if sample_ids is None:
        return torch.arange(num_seqs, dtype=torch.int64)
    if isinstance(sample_ids, torch.Tensor):
        ids = sample_ids
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ConfigError(f"sample_ids must hold integers, got dtype {ids.dtype}")
    else:
        try:
            array = np.asarray(sample_ids)
        except (TypeError, ValueError):
            array = np.asarray(None)
        if array.dtype.kind in "fcb":
            raise ConfigError(f"sample_ids must hold integers, got dtype {array.dtype}")
        if array.dtype.kind not in "iu":
            raise SeqpackTypeError(f"sample_ids must hold integers (int64), got {sample_ids!r:.60}")
        if array.dtype == np.uint64 and array.size and int(array.max()) > INT64_MAX:
            raise ConfigError(f"sample_ids holds {int(array.max())}, which does not fit int64")
        ids = torch.from_numpy(array.astype(np.int64))
    ids = ids.to(torch.int64).reshape(-1)
    if ids.shape[0] != num_seqs:
        raise ConfigError(f"sample_ids has {ids.shape[0]} entries for {num_seqs} samples")
    return ids


def batch_from_layout(
    cu_seqlens: Offsets,
    cu_seqlens_padded: Offsets,
    max_seqlen: int,
    sample_ids: torch.Tensor | np.ndarray | Sequence[int],
    cp_size: int = 1,
    cp_rank: int = 0,
    *,
    cp_layout: CpLayout | str = CpLayout.DUALCHUNK,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> PackedBatch:
    """A (CP-sharded) ``PackedBatch`` whose layout fields are rebuilt from ``cu_seqlens*``.

    ``position_ids`` (unless given), ``seq_idx`` and ``padding_mask`` follow from the layout
    as :func:`pack_sequences` builds them, cut to this CP rank's shard in ``cp_layout``.
    Token tensors, when given, must already be the shard; without them the batch is
    metadata-only (middle pipeline stages). ``num_loss_tokens`` is ``None``.

    Raises:
        SeqpackTypeError: Offsets or sample ids that are not integers.
        ConfigError: Inconsistent offsets, ``sample_ids`` not one per sequence, a bad CP
            rank, or a token tensor whose length is not this rank's share.
    """
    cp_size, cp_rank = check_cp(cp_size, cp_rank)
    cp_layout = check_choice("cp_layout", cp_layout, CpLayout)
    cu = as_offsets(cu_seqlens, "cu_seqlens")
    cu_padded = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    layout = token_layout(cu_padded, cu)  # checks the offsets; [T]
    within, seq_idx, padding_mask = layout.position, layout.seq_idx, layout.padding_mask
    total = layout.num_tokens
    if cp_size > 1:
        index = partition_indices(cu_padded, total, cp_size, cp_rank, layout=cp_layout)  # [T / cp]
        within, seq_idx, padding_mask = within[index], seq_idx[index], padding_mask[index]
    cu32 = cu.to(torch.int32)
    cu_padded32 = cu32 if torch.equal(cu, cu_padded) else cu_padded.to(torch.int32)
    local = total // cp_size
    tokens = {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    for name, value in tokens.items():
        if value is not None and value.shape[0] != local:
            raise ConfigError(f"{name} has {value.shape[0]} tokens but the layout gives {local} to CP rank {cp_rank}")
    return PackedBatch(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=within if position_ids is None else position_ids,
        seq_idx=seq_idx,
        padding_mask=padding_mask,
        cu_seqlens=cu32,
        cu_seqlens_padded=cu_padded32,
        max_seqlen=check_int("max_seqlen", max_seqlen, minimum=0),
        sample_ids=_as_sample_ids(sample_ids, cu.numel() - 1),
        cp_size=cp_size,
        cp_rank=cp_rank,
        cp_layout=cp_layout,
    )
