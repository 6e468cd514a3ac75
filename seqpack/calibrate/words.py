"""The int64 words one microbatch time travels as, between ranks.

A valid time (finite, > 0) is sent as the IEEE-754 bits of its double: positive doubles
order like their bits, so an int64 MAX over the copies of a replica picks the slowest time.
Three words are reserved. A copy that has not recorded its time yet sends :data:`MISSING`
(the largest word), which holds the step back until every copy has; ranks that keep no
times send :data:`ABSENT` (the smallest), which never counts; a recorded time that is NaN,
infinite or <= 0 is :data:`INVALID`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ABSENT", "INVALID", "MISSING", "decode_seconds", "encode_seconds"]

MISSING = (1 << 63) - 1  # not recorded (yet) on this rank
INVALID = -2  # recorded, but NaN, infinite or <= 0
ABSENT = -(1 << 63)  # this rank keeps no times (e.g. a middle pipeline stage)


def encode_seconds(seconds: Sequence[float] | np.ndarray) -> np.ndarray:
    """Times as int64 words for the wire: the IEEE-754 bits of a valid time, :data:`INVALID`
    for NaN, infinite or <= 0."""
    values = np.asarray(seconds, dtype=np.float64).reshape(-1)
    valid = np.isfinite(values) & (values > 0)
    words = np.where(valid, values, 1.0).view(np.int64).copy()
    words[~valid] = INVALID
    return words


def decode_seconds(words: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode_seconds`: float64 times, NaN where missing or invalid."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    out = words.view(np.float64).copy()
    out[(words < 0) | (words == MISSING)] = np.nan
    return out
