"""The two-pointer walk the repair scans share: candidates from the ideal cost outwards.

A change sends ``delta = base + sign * costs[item]`` from the busier replica to the lighter
one, ``gap`` apart; it leaves the pair's larger total ``min(delta, gap - delta)`` lower (its
*gain*), best at ``delta = gap / 2``. ``items`` is sorted by cost, so ``delta`` runs
monotonically along it: walking outwards from the ideal item, always taking the side with
the larger gain, yields candidates best first, and a walk can stop at the first candidate
that gains too little.
"""

from __future__ import annotations

import numpy as np

from seqpack.schedulers._kernels._types import FloatArray, IntArray
from seqpack.schedulers._kernels.jit import njit


@njit(cache=True)
def first_cost_above(items: IntArray, k: int, costs: FloatArray, value: float) -> int:
    """Index of the first of ``items[:k]`` (sorted by cost) costing more than ``value``
    (``k`` if none; reads ``items`` below ``k <= len(items)`` only)."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi) // 2
        if costs[items[mid]] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def walk_next(
    items: IntArray, k: int, costs: FloatArray, base: float, sign: float, gap: float, left: int, right: int
) -> tuple[int, float, int, int]:
    """One step of the walk over ``items[:k]``: ``(item, gain, left, right)``, item -1 when
    both sides are used up. Start with ``right`` the first item past the ideal cost
    (:func:`first_cost_above`) and ``left = right - 1``.

    ``sign = 1`` (a move, ``delta = costs[item]``): items left of the ideal send at most half
    the gap (gain ``delta``), items right of it more (gain ``gap - delta``). ``sign = -1`` (a
    swap, ``delta = base - costs[item]``): the other way round. Ties go left. Reads
    ``items[left]`` only while ``left >= 0`` and ``items[right]`` while ``right < k``.
    """
    if left < 0 and right >= k:
        return -1, -np.inf, left, right
    gain_left = -np.inf
    gain_right = -np.inf
    if left >= 0:
        delta = base + sign * costs[items[left]]
        gain_left = delta if sign > 0 else gap - delta
    if right < k:
        delta = base + sign * costs[items[right]]
        gain_right = gap - delta if sign > 0 else delta
    if gain_left >= gain_right:
        return items[left], gain_left, left - 1, right
    return items[right], gain_right, left, right + 1
