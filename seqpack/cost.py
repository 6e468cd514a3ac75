"""Per-sequence cost: what a microbatch costs to run, from its sequence lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``:
dense layers scale with tokens, attention scores and values with the square of each
sequence's length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["CostModel"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """``cost(s) = linear*s + quadratic*s**2``; a microbatch adds ``constant`` once."""

    linear: float
    quadratic: float
    constant: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic", "constant"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"CostModel.{name} must be finite and >= 0, got {value!r}")
        if self.linear == 0 and self.quadratic == 0:
            raise ValueError("CostModel needs linear > 0 or quadratic > 0")

    def cost(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Cost of each sequence (float64, same shape as ``lengths``; no ``constant``)."""
        s = np.asarray(lengths, dtype=np.float64)
        return s * (self.linear + self.quadratic * s)

    def microbatch_cost(self, lengths: Sequence[int] | np.ndarray) -> float:
        """Cost of one microbatch holding sequences of ``lengths``."""
        return float(self.constant + self.cost(lengths).sum())
