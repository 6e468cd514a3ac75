"""The token layout of a THD pack, derived once.

A pack of ``N`` sequences is described by ``cu_seqlens_padded[N+1]`` (where each sequence's
slot starts) and ``cu_seqlens[N+1]`` (cumulative real lengths; a sequence's real tokens open
its slot, its pads close it). :func:`token_layout` derives the per-token view every consumer
reads: sequence, offset in the slot, pad flag.

Tokens at or past ``cu_seqlens_padded[-1]`` form one more segment, index ``N``, all pads
(Mamba's and NeMo's convention); :class:`~seqpack.thd.PackedBatch` never has such a tail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX
from seqpack.validation import check_fits_memory, check_int

__all__ = ["TokenLayout", "as_offsets", "seq_idx_from_cu_seqlens", "token_layout"]

Offsets = torch.Tensor | np.ndarray | Sequence[int]
_LAYOUT_BYTES_PER_TOKEN = 29  # int32 seq_idx, int64 position, bool pad flag, int64 temporaries


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """Per-token view of a pack's layout; every field is ``[T]`` on the offsets' device."""

    seq_idx: torch.Tensor  # int32 [T], sequence of every token (N for a tail past the last slot)
    position: torch.Tensor  # int64 [T], offset of the token inside its padded slot
    padding_mask: torch.Tensor  # bool [T], True = pad

    @property
    def num_tokens(self) -> int:
        return int(self.seq_idx.shape[0])


def as_offsets(value: Offsets, name: str = "cu_seqlens_padded") -> torch.Tensor:
    """``value`` (tensor, numpy array or list of integers) as a 1-D int64 tensor on its device.

    Raises:
        SeqpackTypeError: Not a tensor, array or list; not of an integer dtype.
        ConfigError: Not 1-D or empty.
    """
    if isinstance(value, torch.Tensor):
        tensor = value
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            raise SeqpackTypeError(f"{name} must hold integers, got dtype {tensor.dtype}")
    else:
        if isinstance(value, (list, tuple)) and len(value) == 0:
            value = np.zeros(0, dtype=np.int64)  # np.asarray([]) is float64
        if not isinstance(value, (np.ndarray, list, tuple)):
            raise SeqpackTypeError(f"{name} must be a 1-D tensor, numpy array or list, got {type(value).__name__}")
        array = np.asarray(value)
        if array.dtype.kind not in "iu":
            raise SeqpackTypeError(f"{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64, copy=False)
        tensor = torch.from_numpy(array if array.flags.c_contiguous else array.copy())
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise ConfigError(f"{name} must be 1-D with at least one entry, got shape {tuple(tensor.shape)}")
    return tensor.to(torch.int64)


def check_offsets(cu_padded: torch.Tensor, cu_real: torch.Tensor | None) -> None:
    """Offsets start at 0 and never decrease; real lengths fit their slots.

    A few host syncs on a GPU (on ``[N+1]`` tensors); callers that built the offsets skip it.
    """
    padded = cu_padded[1:] - cu_padded[:-1]
    if int(cu_padded[0]) != 0 or bool((padded < 0).any()):
        raise ConfigError(f"cu_seqlens_padded must start at 0 and never decrease, got {_head(cu_padded)}")
    if cu_real is None:
        return
    if cu_real.shape != cu_padded.shape:
        raise ConfigError(f"cu_seqlens has {cu_real.numel()} entries but cu_seqlens_padded has {cu_padded.numel()}")
    if int(cu_real[0]) != 0:
        raise ConfigError(f"cu_seqlens must start at 0, got {_head(cu_real)}")
    real = cu_real[1:] - cu_real[:-1]
    bad = torch.nonzero((real < 0) | (real > padded)).flatten()
    if bad.numel():
        raise ConfigError(
            f"cu_seqlens {_head(cu_real)} does not fit cu_seqlens_padded {_head(cu_padded)}: every real length "
            f"must be in [0, padded length] (sequence {int(bad[0])})"
        )


def _head(cu: torch.Tensor) -> str:
    values = cu[:17].tolist()
    return f"{values[:16]}{' ...' if len(values) > 16 else ''}"


def _segment_lengths_numpy(cu_padded: np.ndarray, total: int) -> np.ndarray:
    """Tokens of each of the ``N+1`` segments (the ``N`` slots, then the tail) among the
    first ``total`` (clipped: ``total < cu_padded[-1]`` describes a prefix). The counts always
    sum to ``total``, even for unchecked offsets that decrease."""
    ends = np.clip(np.maximum.accumulate(cu_padded), 0, total)
    ends[0] = 0
    return np.append(np.diff(ends), total - ends[-1])


def _layout_numpy(
    cu_padded: np.ndarray, real: np.ndarray | None, total: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # CPU: numpy's repeat beats torch.repeat_interleave and searchsorted (docs/thd.md).
    n = cu_padded.shape[0] - 1
    seg = _segment_lengths_numpy(cu_padded, total)  # [N+1]
    seq_idx = np.repeat(np.arange(n + 1, dtype=np.int32), seg)  # [T]
    position = np.arange(total, dtype=np.int64) - np.repeat(cu_padded, seg)  # [T]
    if real is None:
        padding = seq_idx == n
    else:
        padding = position >= np.repeat(np.append(real, 0), seg)
    return seq_idx, position, padding


def _layout_torch(
    cu_padded: torch.Tensor, real: torch.Tensor | None, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Any device, no host sync; on a GPU one binary search per token beats repeat_interleave.
    tokens = torch.arange(total, dtype=torch.int64, device=cu_padded.device)  # [T]
    seq = _seq_of_tokens(cu_padded, tokens)  # [T], int64 in [0, N]
    position = tokens - cu_padded[seq]
    if real is None:
        padding = seq == cu_padded.shape[0] - 1
    else:
        real_ext = torch.cat([real, real.new_zeros(1)])  # the tail has no real token
        padding = position >= real_ext[seq]
    return seq.to(torch.int32), position, padding


def _seq_of_tokens(cu_padded: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # right=True: the token at cu_padded[i] opens slot i, and empty slots are skipped.
    return torch.searchsorted(cu_padded[1:], tokens, right=True)


def _check_total(total_tokens: object) -> int:
    # A pack's tokens are addressed by int32 cu_seqlens (Transformer Engine's contract).
    return check_int("total_tokens", total_tokens, minimum=0, maximum=INT32_MAX)


def token_layout(
    cu_seqlens_padded: Offsets,
    cu_seqlens: Offsets | None = None,
    *,
    total_tokens: int | None = None,
    validate: bool = True,
) -> TokenLayout:
    """Sequence, offset in its slot and pad flag of every token of a pack (module docstring).

    Args:
        cu_seqlens_padded: Slot offsets ``[N+1]``, from 0, non-decreasing (integers).
        cu_seqlens: Cumulative real lengths ``[N+1]``; ``None``: no pads inside slots.
        total_tokens: Tokens to describe (default ``cu_seqlens_padded[-1]``; fewer describe a
            prefix of the pack, more add a tail).
        validate: Check the offsets (host syncs on a GPU); callers that built them pass
            ``False``.

    Returns:
        A :class:`TokenLayout` on ``cu_seqlens_padded``'s device; on a GPU no host sync unless
        ``validate`` or ``total_tokens`` is left to be read from the offsets.

    Raises:
        SeqpackTypeError: Offsets that are not integers.
        ConfigError: Offsets of the wrong shape, not starting at 0, decreasing, a real length
            outside ``[0, padded length]``, or a negative ``total_tokens``.
    """
    cu_padded = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    cu_real = None if cu_seqlens is None else as_offsets(cu_seqlens, "cu_seqlens").to(cu_padded.device)
    if validate:
        check_offsets(cu_padded, cu_real)
    # Host sync on a GPU when total_tokens is not given: the output size must be known.
    total = int(cu_padded[-1]) if total_tokens is None else _check_total(total_tokens)
    check_fits_memory(f"total_tokens={total}", _LAYOUT_BYTES_PER_TOKEN * total)
    real = None if cu_real is None else cu_real[1:] - cu_real[:-1]
    if cu_padded.device.type == "cpu":
        arrays = _layout_numpy(cu_padded.numpy(), None if real is None else real.numpy(), total)
        return TokenLayout(*(torch.from_numpy(array) for array in arrays))
    return TokenLayout(*_layout_torch(cu_padded, real, total))


def seq_idx_from_cu_seqlens(cu_seqlens_padded: Offsets, total_tokens: int) -> torch.Tensor:
    """Sequence index of every token of the pack (int32 ``[T]``), pads included.

    Tokens past the last offset are sequence ``N``. Offsets are not checked: this runs in
    every Mamba layer, where a check costs a host sync.
    """
    cu_padded = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    total = _check_total(total_tokens)
    check_fits_memory(f"total_tokens={total}", 4 * total)
    if cu_padded.device.type == "cpu":
        counts = _segment_lengths_numpy(cu_padded.numpy(), total)
        return torch.from_numpy(np.repeat(np.arange(cu_padded.shape[0], dtype=np.int32), counts))
    tokens = torch.arange(total, dtype=torch.int64, device=cu_padded.device)
    return _seq_of_tokens(cu_padded, tokens).to(torch.int32)
