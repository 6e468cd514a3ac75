"""The sample contract: what one dataloader sample may hold, and its one normalisation.

A sample is a mapping with ``input_ids`` (required) and optionally ``labels``,
``loss_mask`` and ``position_ids``; other keys are ignored. Every field is 1-D and as long
as ``input_ids``. Integer fields (``input_ids``, ``labels``, ``position_ids``) accept
tensors, numpy arrays and lists of any integer dtype (numpy ``uint16`` / ``uint32`` as
tokenizers emit them, torch ``uint8`` ... ``uint64``) and become int64; values past int64
are an error, and so are float arrays, even integral ones (a float label is a bug upstream,
never silently truncated). ``loss_mask`` accepts any bool, integer or float dtype, becomes
float32 and must be finite. :func:`normalize_sample` applies the contract
(:func:`seqpack.thd.sample_sequences` also splits a pre-packed sample first).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX

__all__ = [
    "IGNORE_INDEX",
    "INTEGER_KEYS",
    "SAMPLE_DTYPES",
    "TOKEN_KEYS",
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


def _check_fits_int64(value: np.ndarray, key: str, where: str) -> None:
    if value.size and int(value.max()) > INT64_MAX:
        bad = int(np.flatnonzero(value > INT64_MAX)[0])
        raise SampleError(
            f"{where}: {key!r} holds {int(value[bad])} at token {bad}, which does not fit int64 (max {INT64_MAX})"
        )


def _normalize_field(value: Any, key: str, where: str) -> torch.Tensor:
    """One field of one sample: type, shape and values checked, converted to its dtype."""
    dtype = SAMPLE_DTYPES[key]
    tensor = _as_tensor(value, key, where)
    if tensor.dim() != 1:
        raise SampleError(f"{where}: {key!r} must be 1-D, got shape {tuple(tensor.shape)}")
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
    # loss_mask: any real dtype, float32 and finite (a float64 past float32's range becomes inf).
    if tensor.is_complex():
        raise SeqpackTypeError(f"{where}: {key!r} must hold real numbers, got dtype {tensor.dtype}")
    converted = tensor.to(dtype)
    if converted.is_floating_point():
        finite = torch.isfinite(converted)
        if not bool(finite.all()):
            bad = int(torch.nonzero(~finite)[0])
            raise SampleError(
                f"{where}: {key!r} must be finite, got {tensor[bad].item()} at token {bad} (dtype {tensor.dtype})"
            )
    return converted


def normalize_sample(sample: Any, *, where: str = "sample") -> dict[str, torch.Tensor]:
    """One sample checked against the contract and converted to its dtypes.

    Args:
        sample: A mapping with ``input_ids`` and optionally ``labels``, ``loss_mask``,
            ``position_ids`` (``None`` counts as absent); other keys are ignored.
        where: How error messages name the sample (``"sample 4 of this rank's data"``).

    Returns:
        The present contract keys, as 1-D tensors of :data:`SAMPLE_DTYPES` on the sample's
        device (int64 tensors pass through uncopied). A zero-length sample is valid here;
        packing refuses it, the wrapper drops and counts it.

    Raises:
        SeqpackTypeError: Not a mapping; a field that is not a tensor, array or list, or of
            the wrong dtype (floats, bools for integer fields).
        SampleError: No ``input_ids``; a field not 1-D, not as long as ``input_ids``,
            past int64, or a non-finite ``loss_mask``.
    """
    if type(sample) is not dict and not isinstance(sample, Mapping):  # type(): the fast, common case
        raise SeqpackTypeError(f"{where} must be a mapping of 1-D tensors, got {type(sample).__name__}")
    ids = sample.get("input_ids")
    if ids is None:
        raise SampleError(f"{where} has no 'input_ids' (keys: {sorted(str(key) for key in sample)})")
    if type(ids) is not torch.Tensor or ids.dtype != torch.int64 or ids.dim() != 1:
        ids = _normalize_field(ids, "input_ids", where)
    out = {"input_ids": ids}
    if len(sample) == 1:  # input_ids alone (the packer's hot loop sees this most)
        return out
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
