"""A lower bound on the step time of any dynamic-CP plan: what benchmarks/dynamic_cp.py measures
plans against (a benchmark's yardstick, not part of the product).

:func:`step_time_lower_bound` holds for every plan of the step, with any group sizes and
layout, under the group cost model (:mod:`seqpack.cost.ring`). Notation:
``p_i`` is sequence ``i`` padded alone (``pad_multiple``; in a group it is padded to at least
that), ``k, a, b`` the compute coefficients, ``cap`` the tokens of one rank, ``R`` the ranks,
``tok(c)`` the ring cost per token of a group of ``c`` ranks (``ring_token_inter`` above a node,
the smaller of the two within one: a small group may still straddle nodes).

* ``need_i = ceil(p_i / cap)``: no group of fewer ranks holds ``i``.
* ``tau_i(c) = k + (a p_i + b p_i**2) / c + (c - 1) (ring_step + tok(c) p_i / c)``: the time of
  ``i`` alone on ``c`` ranks; a group's time is at least that of each of its sequences alone
  (every coefficient is >= 0).
* ``W_i(c) = c (tau_i(c) - k)``: the busy rank-seconds of ``i`` alone on ``c`` ranks; nondecreasing
  in ``c``. A group of ``c`` ranks is busy ``c (T_g - k)`` rank-seconds, which is at least
  ``sum_i w_i`` over its sequences, ``w_i = a p_i + b p_i**2 + (need_i - 1) tok(need_i) p_i``
  (its ring steps, paid once per group, are left out).

**Spread** (both syncs). Under lockstep every rank pays ``k`` in each of the ``M`` rounds, and a
round holds at most ``R cap`` tokens: ``M >= ceil(sum p / (R cap))`` and the step is at least
``M k + sum w / R``. Under replica sync only microbatches that run pay ``k``: the ranks run at
least ``ceil(sum p / cap)`` microbatches together, so the busiest rank ends no sooner than
``(k ceil(sum p / cap) + sum w) / R``, nor before ``k ceil(sum p / (R cap))`` (some rank runs
that many microbatches).

**Alone** (both syncs). Some group holds each sequence ``i``: the step is at least
``min_{need_i <= c <= R} tau_i(c)``.

**Rounds of the longest sequences** (lockstep). Summing ``R h_m = R k + busy_m + idle_m`` over
the rounds, ``R step >= R M k + sum_i w_i + sum_m E_m`` with each round's excess
``E_m = R (h_m - k) - sum_{i in m} w_i >= 0``. Take a set ``T`` of long sequences (every one at
least as long as the shortest, ``t``). A round of height ``h`` that runs ``n`` of them:

* runs each within ``h``: on ``c`` ranks with ``tau_t(c) <= h`` (so ``c >= c_min(h)``), and
  ``n c_min(h) <= R``; they are busy at least ``n min_{tau_t(c) <= h, n c <= R} W_t(c)``;
* holds other sequences (``F``: their ``w``) of at most ``R cap - n p_t`` tokens (``p_t``: ``t``
  padded in a group, at the least over sizes), each run within ``h``, so busy at least
  ``q_i(h) = W_i(c_min)`` (``c_min``: the fewest ranks with ``tau_i(c) <= h``), all of them
  together at most ``Q(h) = R (h - k) -`` what the ``n`` take;
* so ``E >= R (h - k) - n max_T w - F``, and ``F`` is at most the value of that two-constraint
  knapsack, by weak duality at most ``lam (R cap - n p_t) + mu Q(h) + sum_i max(0, w_i - lam p_i
  - mu q_i(h))`` for every ``lam, mu >= 0``.

``h`` is unknown: on each interval ``[g_j, g_{j+1})`` of a grid the bound takes ``h = g_j`` in
``R (h - k)`` and the knapsack at ``g_{j+1}`` (more sequences eligible, smaller ``q``, more room:
a larger ``F``); on ``[g_last, inf)`` the knapsack of tokens alone. ``G(n)``, the least over
the intervals (and 0), bounds the excess of any round running ``n`` of ``T``; the rounds
split ``T`` somehow, into ``r`` rounds, and ``M >= r`` as well as ``M >=`` the tokens (those of
``T`` at ``p_t`` at least) over ``R cap``, so ``R step >= R k max(r, M_min) + sum w + sum G(n_m)``,
the least over all splits (a small dynamic program). Sequences beyond the ``_COMPLEX``
longest are given ``q_i = w_i`` and are always eligible (a larger knapsack, still a bound).
``T`` is tried as each of the few longest lengths alone and as all sequences of the longest
length (clipped tails have many).

benchmarks/dynamic_cp.py and ``tests/schedulers/test_dynamic_cp_bound.py`` check it against the
brute-force optimum of tiny steps.
"""

from __future__ import annotations

import math

import numpy as np

from seqpack.cost import CostModel
from seqpack.errors import ConfigError
from seqpack.options import Sync
from seqpack.schedulers.request import as_lengths
from seqpack.thd import group_padded_lengths
from seqpack.validation import check_choice, check_positive_int

__all__ = ["step_time_lower_bound"]

_GRID = 64  # intervals of the height h of the long sequence's round
_MU = np.linspace(0.0, 1.0, 6)  # multipliers of the round's busy-time constraint
_BISECT = 16  # steps of the search for the token multiplier (any value is a bound)
_COMPLEX = 512  # sequences whose busy time under a height is worked out per height
_CANDIDATES = 4  # distinct longest lengths tried alone as L
_TALL = 256  # the longest sequences (all of one length) tried together, as rounds that share them


class _Model:
    """The step's padded lengths and the cost, with the bound's per-sequence quantities."""

    def __init__(self, lengths: np.ndarray, ranks: int, capacity: int, pad_multiple: int, cost: CostModel) -> None:
        self.k, self.a, self.b, self.step, tok, inter = (float(v) for v in cost.group_coefficients(1))
        self.intra, self.inter = min(tok, inter), inter
        self.rpn, self.ranks, self.capacity = cost.ranks_per_node, ranks, capacity
        self.lengths, self.pad_multiple = lengths, pad_multiple
        self.p = group_padded_lengths(lengths, 1, pad_multiple).astype(np.float64)
        self.need = np.maximum(1, np.ceil(self.p / capacity))
        self.w = self.a * self.p + self.b * self.p**2 + (self.need - 1) * self.tok(self.need) * self.p
        self.rounds = math.ceil(float(self.p.sum()) / (ranks * capacity))

    def tok(self, c: np.ndarray) -> np.ndarray:
        return np.where(c > self.rpn, self.inter, self.intra)

    def busy(self, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``tau(c) - k`` of sequences of padded length ``p`` alone on ``c`` ranks (broadcast)."""
        return (self.a * p + self.b * p * p) / c + (c - 1) * (self.step + self.tok(c) * p / c)

    def alone(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(sizes from ``need_i`` to ``R``, ``tau_i - k`` on each, padded as in a group)."""
        c = np.arange(int(self.need[i]), self.ranks + 1, dtype=np.float64)
        return c, self.busy(self.padded(i), c)

    def padded(self, i: int) -> np.ndarray:
        """Sequence ``i`` padded in a group of each size from ``need_i`` to ``R``."""
        c = np.arange(int(self.need[i]), self.ranks + 1, dtype=np.int64)
        return group_padded_lengths(self.lengths[i], c, self.pad_multiple).astype(np.float64)


def _spread_alone(m: _Model, sync: Sync) -> float:
    """The spread and alone bounds (module docstring)."""
    total = float(m.w.sum())
    if sync == Sync.LOCKSTEP:
        spread = m.rounds * m.k + total / m.ranks
    else:
        microbatches = math.ceil(float(m.p.sum()) / m.capacity)
        spread = max((m.k * microbatches + total) / m.ranks, m.k * m.rounds)
    longest = [*np.flatnonzero(m.need > 1).tolist(), int(np.argmax(m.p))]
    return max(spread, max(m.k + float(m.alone(i)[1].min()) for i in longest))


def _least_busy(m: _Model, p: np.ndarray, need: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """``q(h)`` ``[len(heights), len(p)]``: the least busy rank-seconds of each sequence run
    within each height (``inf`` when no group runs it that fast)."""
    c = np.arange(1, m.ranks + 1, dtype=np.float64)
    busy = m.busy(p[:, None], c[None, :])  # (n, R)
    busy[c[None, :] < need[:, None]] = np.inf
    work = c[None, :] * busy  # W(c), nondecreasing in c
    out = np.full((heights.shape[0], p.shape[0]), np.inf)
    for j, h in enumerate(heights.tolist()):
        fits = m.k + busy <= h
        first = np.argmax(fits, axis=1)
        ok = fits[np.arange(p.shape[0]), first]
        out[j, ok] = work[ok, first[ok]]
    return out


_Simple = tuple[np.ndarray, np.ndarray, np.ndarray]


def _knapsack(
    simple: _Simple,
    w: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
    tokens: np.ndarray,
    room: np.ndarray,
) -> np.ndarray:
    """Per row of ``q`` (one height) an upper bound on ``F``: the least over ``mu`` in
    ``_MU`` of the dual value at a ``lam`` found by bisection (any ``lam`` gives a bound);
    ``tokens`` and ``room``: the round's two budgets, per row."""
    dens, cum_w, cum_p = simple  # simple sequences by density, descending (q = w); sums from 0
    rows = q.shape[0]
    mu = np.broadcast_to(_MU[None, :], (rows, _MU.shape[0]))
    qq = q[:, None, :]
    value = w[None, None, :] - mu[:, :, None] * np.where(np.isfinite(qq), qq, 0.0)
    value = np.where(np.isfinite(qq), value, -np.inf)  # ineligible: never taken

    def dual(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dual value, tokens taken) at token multipliers ``lam`` ``[rows, mu]``."""
        scale = 1.0 - mu
        theta = np.where(scale > 0, lam / np.maximum(scale, 1e-300), np.inf)
        n = np.searchsorted(-dens, -theta, side="left")  # simple sequences denser than theta
        sw, sp = cum_w[n], cum_p[n]
        gain = value - lam[:, :, None] * p[None, None, :]
        take = gain > 0
        total = (
            lam * tokens[:, None]
            + mu * np.minimum(room, 1e300)[:, None]
            + np.where(scale > 0, scale * sw - lam * sp, 0.0)
        )
        total = total + np.where(take, gain, 0.0).sum(axis=2)
        used = np.where(scale > 0, sp, 0.0) + np.where(take, p[None, None, :], 0.0).sum(axis=2)
        return total, used

    hi_w = max(float(dens[0]) if dens.shape[0] else 0.0, float((w / np.maximum(p, 1.0)).max(initial=0.0)))
    lo, hi = np.zeros(mu.shape), np.full(mu.shape, 2.0 * hi_w + 1e-300)  # at hi nothing is taken
    best = np.full(mu.shape, np.inf)
    for _ in range(_BISECT):
        mid = (lo + hi) / 2
        val, used = dual(mid)
        best = np.minimum(best, val)
        over = used > tokens[:, None]
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    best = np.minimum(best, dual(hi)[0])
    best = np.where(room[:, None] < 0, np.inf, best)
    return best.min(axis=1)


def _sums(x: np.ndarray) -> np.ndarray:
    """``0, x0, x0+x1, ...``."""
    return np.concatenate([[0.0], np.cumsum(x)])


def _fillers(m: _Model, others: np.ndarray, start: float) -> tuple[_Simple, np.ndarray]:
    """The knapsack's items: (the simple ones by density, with sums from 0; the hard ones,
    whose least busy time depends on the height, at most ``_COMPLEX`` of the longest)."""
    quick = m.k + m.w[others]  # time alone on one rank, when it fits on one
    hard = others[(m.need[others] > 1) | (quick > start)]
    hard = hard[np.argsort(-m.p[hard], kind="stable")[:_COMPLEX]]
    easy = np.setdiff1d(others, hard)
    order = easy[np.argsort(-(m.w[easy] / m.p[easy]), kind="stable")]
    return (m.w[order] / m.p[order], _sums(m.w[order]), _sums(m.p[order])), hard


def _tall_bound(m: _Model, tall: np.ndarray) -> float:
    """The bound of the rounds that run the ``tall`` sequences (module docstring), at most
    ``len(tall)`` of them, each round's excess at least ``G(n)`` for the ``n`` it runs."""
    shortest = int(tall[np.argmin(m.p[tall])])
    c, busy_t = m.alone(shortest)  # every tall sequence runs at least this long on c ranks
    work_t = c * busy_t
    start = m.k + float(busy_t.min())
    total = float(m.w.sum())
    grid = start + (np.geomspace(1.0, 1.0 + 64.0, _GRID + 1) - 1.0) * (total / m.ranks + m.rounds * m.k) / 32.0
    simple, hard = _fillers(m, np.setdiff1d(np.arange(m.p.shape[0]), tall), start)
    tops = grid[1:]
    n = np.arange(1, tall.shape[0] + 1)
    fits = (m.k + busy_t[None, None, :] <= tops[None, :, None]) & (n[:, None, None] * c[None, None, :] <= m.ranks)
    lightest = n[:, None] * np.where(fits, work_t[None, None, :], np.inf).min(axis=2)  # (n, h)
    room = np.where(np.isfinite(lightest), m.ranks * (tops[None, :] - m.k) - lightest, -1.0).reshape(-1)
    tokens = m.ranks * m.capacity - n * float(m.padded(shortest).min())
    q = np.tile(_least_busy(m, m.p[hard], m.need[hard], tops), (n.shape[0], 1))
    f = _knapsack(simple, m.w[hard], m.p[hard], q, np.repeat(tokens, tops.shape[0]), room).reshape(n.shape[0], -1)
    own = n * float(m.w[tall].max())
    excess = np.where(np.isfinite(f), m.ranks * (grid[None, :-1] - m.k) - own[:, None] - f, np.inf)  # inf: no fit
    last = _knapsack(
        simple, m.w[hard], m.p[hard], np.zeros((n.shape[0], hard.shape[0])), tokens, np.full(n.shape[0], np.inf)
    )
    excess = np.concatenate([excess, (m.ranks * (grid[-1] - m.k) - own - last)[:, None]], axis=1)
    least = np.maximum(excess, 0.0).min(axis=1)  # G(n), inf when no height fits n of them
    rest = float(m.p.sum() - m.p[tall].sum()) + tall.shape[0] * float(m.padded(shortest).min())
    rounds = max(m.rounds, math.ceil(rest / (m.ranks * m.capacity)))
    return (_splits(least, m.ranks * m.k, rounds) + total) / m.ranks


def _splits(least: np.ndarray, round_cost: float, rounds: int) -> float:
    """The least ``round_cost * max(r, rounds) + sum G(n_m)`` over the splits of the tall
    sequences into ``r`` rounds of ``n_m`` each (``least[n - 1] = G(n)``)."""
    size = least.shape[0]
    best = np.full(size + 1, np.inf)  # best[j]: the first j in exactly r rounds
    best[0] = 0.0
    out = np.inf
    for r in range(1, size + 1):
        nxt = np.full(size + 1, np.inf)
        for j in range(r, size + 1):
            nxt[j] = float((least[:j] + best[j - 1 :: -1][:j]).min())
        best = nxt
        out = min(out, round_cost * max(r, rounds) + float(best[size]))
    return out


def step_time_lower_bound(
    lengths: np.ndarray,
    *,
    num_ranks: int,
    max_tokens_per_rank: int,
    pad_multiple: int = 1,
    cost: CostModel,
    sync: str = "lockstep",
    round_bound: bool = True,
) -> float:
    """A step time no dynamic-CP plan of ``lengths`` on ``num_ranks`` ranks can beat under
    ``cost`` and ``sync`` (module docstring: the proof). 0 for an empty step.

    Args:
        lengths: Lengths of the sequences a plan keeps (each fits on all ranks together).
        num_ranks, max_tokens_per_rank, pad_multiple: The step's ranks and limits.
        cost: The group cost.
        sync: ``"lockstep"`` or ``"replica"``.
        round_bound: Also the lockstep bound of a long sequence's round (``False``: the
            spread and alone bounds only, for comparison).

    Raises:
        ConfigError: A sequence longer than all ranks together hold.
        SeqpackTypeError, SampleError: Lengths that are not 1-D positive integers.
    """
    ranks = check_positive_int("num_ranks", num_ranks)
    capacity = check_positive_int("max_tokens_per_rank", max_tokens_per_rank)
    mode = check_choice("sync", sync, Sync)
    arr = as_lengths(lengths)
    if arr.shape[0] == 0:
        return 0.0
    m = _Model(arr, ranks, capacity, check_positive_int("pad_multiple", pad_multiple), cost)
    if m.need.max() > ranks:
        i = int(np.argmax(m.need))
        raise ConfigError(
            f"sample {i} has {int(arr[i])} tokens, more than {ranks} ranks x max_tokens_per_rank={capacity} hold: "
            "bound the lengths a plan keeps (after truncation or drops)"
        )
    best = _spread_alone(m, mode)
    if mode == Sync.LOCKSTEP and round_bound:
        long = np.flatnonzero(m.need > 1)
        long = long[np.argsort(-m.p[long], kind="stable")]
        _, first = np.unique(-m.p[long], return_index=True)
        tied = int(np.count_nonzero(m.p[long] == m.p[long[0]])) if long.shape[0] else 0
        sets = [long[i : i + 1] for i in first[:_CANDIDATES].tolist()] + [long[: min(tied, _TALL)]]
        for tall in sets:
            if tall.shape[0]:
                best = max(best, _tall_bound(m, tall))
    return best
