"""Which keys a query sees inside its packed sequence.

A mask is Transformer Engine's ``window_size=(left, right)``: the query at position ``i`` of a
sequence attends the keys at ``i - left .. i + right`` of the same sequence (inclusive), ``-1``
meaning unbounded on that side. Causal attention is ``right == 0``: ``(-1, 0)`` is full causal,
``(W, 0)`` a causal sliding window (the query and the ``W`` keys before it), ``(-1, -1)``
bidirectional. Pads are never keys, and pad queries attend nothing (their output is 0).

Every real query sees at least its own key, so no row of scores is ever all masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_bool, check_window

__all__ = ["AttentionMask", "attention_mask", "block_mask", "key_range"]

IntOrArray = int | np.ndarray


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """TE's ``window_size``: keys ``i - left .. i + right`` of query ``i``'s sequence; -1 unbounded."""

    left: int = -1
    right: int = 0

    @property
    def causal(self) -> bool:
        """No key after the query."""
        return self.right == 0

    @property
    def sliding(self) -> bool:
        """A real window: bounded somewhere other than causality (not ``(-1, 0)`` or ``(-1, -1)``)."""
        return (self.left, self.right) not in ((-1, 0), (-1, -1))

    @property
    def te_mask_type(self) -> str:
        """TE's ``attn_mask_type`` for THD: ``"padding_causal"`` or ``"padding"``."""
        return "padding_causal" if self.causal else "padding"

    @property
    def window_size(self) -> tuple[int, int]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"window=({self.left}, {self.right})"


def attention_mask(causal: bool = True, window: Sequence[int] | None = None) -> AttentionMask:
    """The mask of ``ThdAttention(causal=..., window=...)``.

    ``window=None`` is unbounded: ``(-1, 0)`` when causal, ``(-1, -1)`` otherwise. With
    ``causal=True`` the window must be ``(left, 0)``; ``causal=False`` with ``(left, 0)`` is the
    same mask as ``causal=True``.

    Raises:
        SeqpackTypeError: ``causal`` not a bool, ``window`` not a pair of integers.
        ConfigError: A bound outside ``-1`` (unbounded) or ``0 .. MAX_WINDOW`` (2**31 - 1,
            :data:`seqpack.validation.MAX_WINDOW`), or ``causal=True`` with a window reaching
            right.
    """
    causal = check_bool("causal", causal)
    if window is None:
        return AttentionMask(-1, 0 if causal else -1)
    if isinstance(window, (str, bytes)) or not isinstance(window, Sequence) or len(window) != 2:
        raise SeqpackTypeError(f"window must be None or a pair (left, right) of integers, got {window!r}")
    left, right = (check_window(f"window[{i}]", bound, unbounded=True) for i, bound in enumerate(window))
    if causal and right != 0:
        raise ConfigError(
            f"causal=True takes window=(left, 0) (keys left of the query only; -1 = unbounded), got "
            f"window=({left}, {right}); pass causal=False for a window that reaches right"
        )
    return AttentionMask(left, right)


def key_range(
    q_start: IntOrArray, q_end: IntOrArray, seq_start: IntOrArray, real_end: IntOrArray, mask: AttentionMask
) -> tuple[IntOrArray, IntOrArray]:
    """``[lo, hi)``: the global key positions that the real queries ``[q_start, q_end)`` of the
    sequence whose slot starts at ``seq_start`` (real tokens up to ``real_end``) can reach.

    Works on ints or on numpy arrays of them (one entry per query range).
    """
    lo = seq_start if mask.left < 0 else np.maximum(seq_start, q_start - mask.left)
    hi = real_end if mask.right < 0 else np.minimum(real_end, q_end + mask.right)
    return lo, hi


def block_mask(
    q_start: int, num_q: int, k_start: int, num_k: int, mask: AttentionMask, device: torch.device
) -> torch.Tensor | None:
    """bool ``[num_q, num_k]``, True where query ``q_start + i`` sees key ``k_start + j`` (both
    global positions of one sequence, keys all real); None when every pair is allowed."""
    q_last, k_last = q_start + num_q - 1, k_start + num_k - 1
    left_bounds = mask.left >= 0 and k_start < q_last - mask.left  # some key is too far left
    right_bounds = mask.right >= 0 and k_last > q_start + mask.right  # some key is too far right
    if not (left_bounds or right_bounds):
        return None
    allowed = torch.ones(num_q, num_k, dtype=torch.bool, device=device)
    # Entry (i, j) pairs query q_start + i with key k_start + j: key - query = j - i + k_start - q_start.
    if right_bounds:
        allowed = allowed.tril(mask.right + q_start - k_start)  # key - query <= right
    if left_bounds:
        allowed = allowed.triu(-mask.left + q_start - k_start)  # key - query >= -left
    return allowed
