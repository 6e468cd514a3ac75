"""Constants the kernels and their callers share (no numba here: importing them is cheap)."""

from __future__ import annotations

# Bin-choice rules of grid_lpt.
MODE_COST = 0  # most under its cost target (LPT with per-bin targets)
MODE_TOKENS = 1  # fewest tokens (worst-fit decreasing on tokens)
MODE_FIRST_FIT = 2  # lowest index with room (first-fit decreasing)
GRID_LOCAL_SLICES = 8  # grid_local alternates home and LPT passes over 8 length classes
PAIR_BIN = 16  # home_swaps pairs sequences of bins holding at most this many
HOME_TREE_MIN = 256  # home_swaps walks trees over a home's sequences from this many (a turn's cache and own)
SMALL_SORT = 32  # home_swaps sorts a home's cache and pairs by insertion up to this many, by argsort above
