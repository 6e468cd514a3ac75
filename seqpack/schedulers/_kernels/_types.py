"""Array types of the kernels' annotations (numba ignores annotations; mypy reads them)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

# State of home_swaps (see its module): per sequence; bins and replicas; caps; who is where;
# the sequences on the current home; the pairs of the current turn.
Seqs = tuple[IntArray, IntArray, IntArray, FloatArray, IntArray]
Grid = tuple[FloatArray, IntArray, FloatArray]
Caps = tuple[FloatArray, float, int]
Book = tuple[IntArray, IntArray, BoolArray, IntArray, IntArray, IntArray, IntArray, IntArray]
Cache = tuple[IntArray, IntArray, IntArray, FloatArray, IntArray]
Pairs = tuple[FloatArray, IntArray, IntArray, IntArray, IntArray]
# The max trees of home_swaps (module home_tree): cache and pair keys, positions, lists by round,
# the home's bins.
Trees = tuple[
    FloatArray,
    IntArray,
    FloatArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    FloatArray,
    IntArray,
]
