"""The sample contract: what one dataloader sample may hold, and its one normalisation.

A sample is a mapping with ``input_ids`` (required) and optionally ``labels``,
``loss_mask`` and ``position_ids``, each 1-D and as long as ``input_ids``; other keys are
ignored, except the vision-language fields of :data:`VISION_KEYS`, which are refused rather
than dropped. Integer fields of any integer dtype become int64 (floats are refused, never
truncated); ``loss_mask`` becomes float32, finite and >= 0: a weight on each token's loss.

Labels come in one of three alignments (:class:`~seqpack.options.LabelFormat`):
``"shifted"`` (next-token targets, seqpack's own form), ``"unshifted"`` (Hugging Face's:
aligned with ``input_ids``) or ``"position_aligned"`` (each position's own target, used as
given). A token carries loss when its label is not :data:`IGNORE_INDEX` and its
``loss_mask`` is > 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX, LABEL_COPY_FRACTION, LABEL_COPY_MIN_TOKENS, LabelFormat
from seqpack.validation import check_choice

__all__ = [
    "IGNORE_INDEX",
    "INTEGER_KEYS",
    "SAMPLES_NOT_BATCHES",
    "SAMPLE_DTYPES",
    "MEDIA_FIELDS",
    "MROPE_POSITIONS",
    "TOKEN_KEYS",
    "VISION_FIELDS",
    "VISION_KEYS",
    "check_label_format",
    "count_loss_tokens",
    "default_labels",
    "label_alignment_counts",
    "looks_misaligned",
    "misaligned_labels",
    "next_token_targets",
    "normalize_sample",
]

IGNORE_INDEX = -100
"""Label of a token that carries no loss (PyTorch's ``cross_entropy`` default)."""

SAMPLE_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        "input_ids": torch.int64,
        "labels": torch.int64,
        "loss_mask": torch.float32,
        "position_ids": torch.int64,
    }
)
"""The keys of a sample seqpack carries, each with the dtype it is normalised to."""

TOKEN_KEYS: tuple[str, ...] = tuple(SAMPLE_DTYPES)
INTEGER_KEYS: frozenset[str] = frozenset(key for key, dtype in SAMPLE_DTYPES.items() if dtype == torch.int64)

_OPTIONAL_KEYS = TOKEN_KEYS[1:]

MEDIA_FIELDS: tuple[tuple[str, str], ...] = (
    ("pixel_values", "image_grid_thw"),
    ("pixel_values_videos", "video_grid_thw"),
)
"""Per medium, images then videos (``mm_token_type_ids`` 1 and 2: :mod:`seqpack.thd.mrope`),
the field of its pixels ``[patches, D]`` and of its grids ``[n, 3]``."""
VISION_FIELDS: tuple[str, ...] = ("mm_token_type_ids", *(key for pair in MEDIA_FIELDS for key in pair))
"""The fields that make a sample a vision-language one (:mod:`seqpack.thd.vision`): the one
declaration every list of them (batch fields, payload keys, HF columns) derives from."""
VISION_KEYS: frozenset[str] = frozenset(VISION_FIELDS)
""":data:`VISION_FIELDS` as a set."""
MROPE_POSITIONS = "mrope_position_ids"
"""The field of a vision-language sequence's or pack's mRoPE positions, int64 ``[3, tokens]``."""

SAMPLES_NOT_BATCHES = "give seqpack samples, not batches: DataLoader(batch_size=None)"
"""The hint for a collated batch where seqpack expects one sample (seqpack packs samples itself)."""


def _as_tensor(value: Any, key: str, where: str) -> torch.Tensor:
    """``value`` as a tensor of its own dtype (numpy arrays and lists go through numpy)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        if len(value) == 0:  # np.asarray([]) would be float64
            return torch.zeros(0, dtype=SAMPLE_DTYPES[key])
        array = np.asarray(value)
        if key in INTEGER_KEYS and array.dtype.kind in "fO":
            _check_python_ints_fit(value, key, where)  # numpy made floats / objects of big ints
            _refuse_python_floats(value, key, where)  # numpy's float64 is not the data's dtype
        value = array
    if not isinstance(value, np.ndarray):
        raise SeqpackTypeError(
            f"{where}: {key!r} must be a 1-D tensor, numpy array or list, got {type(value).__name__}"
        )
    kind = value.dtype.kind
    if kind not in "biuf":  # object, str, complex, datetime ...: no token ids, no weights
        raise SeqpackTypeError(f"{where}: {key!r} must hold numbers, got dtype {value.dtype}")
    if not value.dtype.isnative:  # e.g. big-endian columns from a file: torch refuses them
        value = value.astype(value.dtype.newbyteorder("="))
    if kind == "u" and value.dtype.itemsize == 8:
        # torch has uint64, but few ops for it: check the int64 range here, in numpy.
        _check_fits_int64(value, key, where)
        value = value.astype(np.int64)
    # from_numpy refuses negative strides; ascontiguousarray would also make a 0-d array 1-D.
    return torch.from_numpy(value if value.flags.c_contiguous else value.copy())


def _check_python_ints_fit(values: list[Any] | tuple[Any, ...], key: str, where: str) -> None:
    for index, item in enumerate(values):
        if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            raise SampleError(f"{where}: {key!r} holds {item} at token {index}, which does not fit int64")


def _refuse_python_floats(values: list[Any] | tuple[Any, ...], key: str, where: str) -> None:
    # Name the Python floats given, not the float64 numpy would make of them.
    for index, item in enumerate(values):
        if isinstance(item, float):
            raise SeqpackTypeError(
                f"{where}: {key!r} must hold integers, got a list of Python floats ({item!r} at token {index}); "
                "cast the column to an integer type"
            )


def _check_fits_int64(value: np.ndarray, key: str, where: str) -> None:
    if value.size and int(value.max()) > INT64_MAX:
        bad = int(np.flatnonzero(value > INT64_MAX)[0])
        raise SampleError(
            f"{where}: {key!r} holds {int(value[bad])} at token {bad}, which does not fit int64 (max {INT64_MAX})"
        )


_MROPE_HINT = " (mRoPE's t, h, w rows: pack_sequences(..., mrope=MRopeSpec.from_hf(config)) takes them)"


def _batch_hint(tensor: torch.Tensor) -> str:
    """What a 2-D field most likely is: one row with a batch dim, or a collated batch."""
    if tensor.dim() != 2:
        return ""
    if tensor.shape[0] == 1:
        return " (one row with a batch dim, e.g. from return_tensors='pt': take row [0])"
    return f" (a collated batch of {tensor.shape[0]} rows? {SAMPLES_NOT_BATCHES})"


def _normalize_field(value: Any, key: str, where: str) -> torch.Tensor:
    """One field of one sample: type, shape and values checked, converted to its dtype."""
    dtype = SAMPLE_DTYPES[key]
    tensor = _as_tensor(value, key, where)
    if tensor.dim() != 1:
        hint = _MROPE_HINT if key == "position_ids" and tensor.dim() == 2 and tensor.shape[0] == 3 else ""
        raise SampleError(f"{where}: {key!r} must be 1-D, got shape {tuple(tensor.shape)}{hint or _batch_hint(tensor)}")
    if tensor.dtype == dtype and key in INTEGER_KEYS:
        return tensor  # already int64: nothing to check or convert
    if key in INTEGER_KEYS:
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            raise SeqpackTypeError(f"{where}: {key!r} must hold integers, got dtype {tensor.dtype}")
        if tensor.dtype == torch.uint64:
            # Values >= 2**63 read as negative through an int64 view of the same bits.
            over = tensor.view(torch.int64) < 0
            if bool(over.any()):
                bad = int(torch.nonzero(over)[0])
                raise SampleError(
                    f"{where}: {key!r} holds {int(tensor.cpu().numpy()[bad])} at token {bad}, which does not "
                    f"fit int64 (max {INT64_MAX})"
                )
        return tensor.to(dtype)
    # loss_mask: any real dtype, float32, finite (a float64 past float32's range becomes inf)
    # and >= 0 (a negative weight would subtract a token's loss that num_loss_tokens leaves out).
    if tensor.is_complex():
        raise SeqpackTypeError(f"{where}: {key!r} must hold real numbers, got dtype {tensor.dtype}")
    converted = tensor.to(dtype)
    valid = (converted >= 0) & (converted < torch.inf)  # False for NaN, +-inf and negatives alike
    if not bool(valid.all()):
        bad = int(torch.nonzero(~valid)[0])
        value = tensor[bad].item()
        if math.isfinite(converted[bad].item()):
            raise SampleError(
                f"{where}: {key!r} must be >= 0 (a weight on each token's loss), got {value} at token {bad}"
            )
        raise SampleError(f"{where}: {key!r} must be finite, got {value} at token {bad} (dtype {tensor.dtype})")
    return converted


def normalize_sample(sample: Any, *, where: str = "sample") -> dict[str, torch.Tensor]:
    """One sample checked against the contract and converted to its dtypes.

    Args:
        sample: A mapping with ``input_ids`` and optionally ``labels``, ``loss_mask``,
            ``position_ids`` (``None`` counts as absent); other keys are ignored, but not
            those of :data:`VISION_KEYS`.
        where: How error messages name the sample (``"sample 4 of this rank's data"``).

    Returns:
        The present contract keys, as 1-D tensors of :data:`SAMPLE_DTYPES` on the sample's
        device (int64 tensors pass through uncopied). A zero-length sample is valid here.

    Raises:
        SeqpackTypeError: Not a mapping; a field that is not a tensor, array or list, or of
            the wrong dtype (floats, bools for integer fields).
        SampleError: No ``input_ids``; a field not 1-D, not as long as ``input_ids``,
            past int64, or a ``loss_mask`` weight that is negative or not finite; images or
            videos (:data:`VISION_KEYS`).
    """
    if type(sample) is not dict and not isinstance(sample, Mapping):  # type(): the fast, common case
        raise SeqpackTypeError(f"{where} must be a mapping of 1-D tensors, got {type(sample).__name__}")
    ids = sample.get("input_ids")
    if ids is None:
        if "input_ids" in sample:
            raise SampleError(f"{where} has 'input_ids' set to None (a 1-D tensor of token ids is needed)")
        raise SampleError(f"{where} has no 'input_ids' (keys: {sorted(str(key) for key in sample)})")
    if type(ids) is not torch.Tensor or ids.dtype != torch.int64 or ids.dim() != 1:
        ids = _normalize_field(ids, "input_ids", where)
    out = {"input_ids": ids}
    if len(sample) == 1:  # input_ids alone (the packer's hot loop sees this most)
        return out
    if not VISION_KEYS.isdisjoint(sample):
        raise SampleError(
            f"{where} carries images or videos ({', '.join(sorted(VISION_KEYS.intersection(sample)))}), which only "
            "pack_sequences(..., mrope=MRopeSpec.from_hf(config)) and wrap_data_iterator(..., mrope=...) pack "
            "(docs/multimodal.md); dropping them would train on the placeholder tokens alone"
        )
    length = ids.shape[0]
    for key in _OPTIONAL_KEYS:
        value = sample.get(key)
        if value is None:
            continue
        tensor = _normalize_field(value, key, where)
        if tensor.shape[0] != length:
            raise SampleError(f"{where}: {key!r} has {tensor.shape[0]} tokens but 'input_ids' has {length}")
        out[key] = tensor
    return out


# --- labels: alignment, the alignment guard, loss tokens -----------------------------------


def _shift_left(values: torch.Tensor, fill: float) -> torch.Tensor:
    """``out[t] = values[t + 1]``; the last slot gets ``fill``."""
    out = torch.empty_like(values)
    out[:-1] = values[1:]
    out[-1:] = fill
    return out


def default_labels(input_ids: torch.Tensor, last: torch.Tensor, label_format: LabelFormat | str) -> torch.Tensor:
    """The labels of sequences that bring none, in ``label_format``'s alignment.

    Args:
        input_ids: One or more sequences concatenated (int64 ``[L]``).
        last: Index of every sequence's last token (int64 ``[N]``).
        label_format: ``"shifted"`` and ``"position_aligned"``: next-token labels (-100 at
            each last token); ``"unshifted"``: ``input_ids`` itself (what Hugging Face's
            collators use). Either way they become the next tokens once packed.
    """
    if check_choice("label_format", label_format, LabelFormat) is LabelFormat.UNSHIFTED:
        return input_ids.clone()
    labels = _shift_left(input_ids, IGNORE_INDEX)
    labels[last] = IGNORE_INDEX
    return labels


def next_token_targets(
    labels: torch.Tensor,
    loss_mask: torch.Tensor | None,
    last: torch.Tensor,
    label_format: LabelFormat | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels (int64 ``[L]``, not modified) and loss mask (float32 ``[L]`` or ``None``) of
    concatenated sequences ending at ``last`` (int64 ``[N]``), in seqpack's form.

    Under ``"unshifted"`` both move one token left within each sequence; each sequence's last
    token gets -100. The loss mask returned is the given one (else 1) where the label is not
    -100, and 0 elsewhere.
    """
    if check_choice("label_format", label_format, LabelFormat) is LabelFormat.UNSHIFTED:
        labels = _shift_left(labels, IGNORE_INDEX)
        labels[last] = IGNORE_INDEX
        loss_mask = None if loss_mask is None else _shift_left(loss_mask, 0.0)
    supervised = labels != IGNORE_INDEX
    if loss_mask is None:
        return labels, supervised.to(torch.float32)
    return labels, torch.where(supervised, loss_mask, torch.zeros((), dtype=loss_mask.dtype, device=loss_mask.device))


def misaligned_labels(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor | None,
    last: torch.Tensor,
    label_format: LabelFormat | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which supervised tokens tell the two alignments apart, and which of those carry the
    target of the other alignment than ``label_format`` (bool ``[L]`` each).

    A supervised token (label not -100, ``loss_mask`` > 0 when given) is *checked* unless its
    label equals both its own token and the next one (it fits either alignment). A checked
    token is *misaligned* when its label is its own token under ``"shifted"`` or the next
    token under ``"unshifted"``; ``"position_aligned"`` labels are never misaligned. Inputs
    are :func:`next_token_targets`' plus ``input_ids`` (int64 ``[L]``).
    """
    label_format = check_choice("label_format", label_format, LabelFormat)
    own = labels == input_ids
    ahead = labels == default_labels(input_ids, last, LabelFormat.SHIFTED)  # never at a last token (-100 there)
    checked = (labels != IGNORE_INDEX) & ~(own & ahead)
    if loss_mask is not None:
        checked &= loss_mask > 0
    if label_format is LabelFormat.POSITION_ALIGNED:
        return checked, torch.zeros_like(checked)
    return checked, checked & (own if label_format is LabelFormat.SHIFTED else ahead)


def label_alignment_counts(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor | None,
    cu_seqlens: np.ndarray,
    label_format: LabelFormat | str = LabelFormat.SHIFTED,
) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence of the stream (``cu_seqlens``: int64 ``[N+1]`` offsets of non-empty
    sequences): ``(checked, misaligned)`` token counts, int64 ``[N]`` each
    (:func:`misaligned_labels`)."""
    last = torch.from_numpy(np.asarray(cu_seqlens[1:], dtype=np.int64) - 1).to(labels.device)
    checked, misaligned = misaligned_labels(input_ids, labels, loss_mask, last, label_format)
    running = torch.stack([checked, misaligned]).to(torch.int64).cumsum(dim=1).cpu().numpy()  # [2, L]
    running = np.concatenate([np.zeros((2, 1), dtype=np.int64), running], axis=1)  # [2, L + 1]
    per_seq = running[:, cu_seqlens[1:]] - running[:, cu_seqlens[:-1]]  # [2, N]
    return per_seq[0], per_seq[1]


def looks_misaligned(checked: np.ndarray, misaligned: np.ndarray) -> np.ndarray:
    """Which sequences' labels are aligned the other way than declared (bool ``[N]``).

    True when a sequence has at least :data:`~seqpack.options.LABEL_COPY_MIN_TOKENS` checked
    tokens and at least :data:`~seqpack.options.LABEL_COPY_FRACTION` of them are misaligned
    (:func:`label_alignment_counts`). The same rule serves a whole step's sums.
    """
    checked = np.asarray(checked, dtype=np.int64)
    misaligned = np.asarray(misaligned, dtype=np.int64)
    return (checked >= LABEL_COPY_MIN_TOKENS) & (misaligned >= LABEL_COPY_FRACTION * checked)


def misaligned_labels_message(where: str, checked: int, misaligned: int, label_format: LabelFormat | str) -> str:
    """The error for labels that look aligned the other way than ``label_format`` says."""
    counted = (
        f"on {misaligned} of {checked} supervised tokens (not counting those equal to the next token, which fit "
        "either alignment)"
    )
    if check_choice("label_format", label_format, LabelFormat) is LabelFormat.UNSHIFTED:
        return (
            f"{where}: labels equal the next token of input_ids {counted}, as next-token labels (Megatron, NeMo, "
            "torchtitan) do, but label_format='unshifted' shifts labels one token left (each token would be trained "
            "on the token two ahead); pass label_format='shifted', or give labels aligned with input_ids"
        )
    return (
        f"{where}: labels equal input_ids {counted}, as Hugging Face's labels do, but label_format='shifted' reads "
        "labels as next-token targets (the model would learn to copy its input); pass label_format='unshifted' for "
        "Hugging Face-style labels, label_format='position_aligned' if each position is meant to predict its own "
        "token (a bidirectional model), or give next-token labels"
    )


def check_label_format(
    sample: Mapping[str, torch.Tensor], label_format: LabelFormat | str, *, where: str = "sample"
) -> None:
    """Refuse the labels of ``sample`` (as :func:`normalize_sample` returns it) when aligned
    the other way than ``label_format`` says (:func:`looks_misaligned`).

    Raises:
        SampleError: Naming ``label_format``, the sample (``where``) and the counts.
    """
    label_format = check_choice("label_format", label_format, LabelFormat)
    labels = sample.get("labels")
    if label_format is LabelFormat.POSITION_ALIGNED or labels is None or labels.shape[0] == 0:
        return
    ids = sample["input_ids"]
    cu = np.array([0, ids.shape[0]], dtype=np.int64)
    checked, misaligned = label_alignment_counts(ids, labels, sample.get("loss_mask"), cu, label_format)
    if looks_misaligned(checked, misaligned)[0]:
        raise SampleError(misaligned_labels_message(where, int(checked[0]), int(misaligned[0]), label_format))


def count_loss_tokens(sample: Mapping[str, torch.Tensor], label_format: LabelFormat | str = "shifted") -> int:
    """Tokens of one sequence (as :func:`normalize_sample` returns it, labels in
    ``label_format``) that carry loss once packed."""
    ids = sample["input_ids"]
    if ids.shape[0] == 0:
        return 0
    last = torch.tensor([ids.shape[0] - 1], device=ids.device)
    labels = sample.get("labels")
    if labels is None:
        labels = default_labels(ids, last, label_format)
    labels, loss_mask = next_token_targets(labels, sample.get("loss_mask"), last, label_format)
    return int(((labels != IGNORE_INDEX) & (loss_mask > 0)).sum())
