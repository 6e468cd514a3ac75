"""Token buckets chosen by cost: :func:`static_shapes_by_cost` (the search and what each
part buys: docs/thd.md, "What buckets cost the plans")."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from seqpack.cost import CostModel, default_cost_model
from seqpack.errors import ConfigError
from seqpack.options import INT32_MAX, TailPadding
from seqpack.schedulers.objective import step_objective
from seqpack.schedulers.registry import get_scheduler
from seqpack.schedulers.request import Request
from seqpack.schedulers.shape_limits import BucketPrice
from seqpack.schedulers.step_time import group_times, predicted_step_time
from seqpack.thd.static_shapes import StaticShapes
from seqpack.validation import check_int, check_positive_int

if TYPE_CHECKING:
    from seqpack.schedulers.base import Scheduler
    from seqpack.schedulers.schedule import Schedule

logger = logging.getLogger(__name__)

__all__ = ["FixedPlans", "even_ladder", "ladder_for", "static_shapes_by_cost"]


def ladder_for(tokens: np.ndarray, *, buckets: int, unit: int, top: int) -> tuple[int, ...]:
    """At most ``buckets`` multiples of ``unit``, the largest ``top``, minimising the summed
    bucket padding of microbatches of ``tokens`` (each at most ``top``): exact, a dynamic
    program over ``tokens`` rounded up to ``unit`` (where every optimal ladder's buckets lie)."""
    t = np.asarray(tokens, dtype=np.int64)
    candidates, where = np.unique(np.clip(-(-t // unit) * unit, unit, top), return_inverse=True)
    if not candidates.size or candidates[-1] != top:
        candidates = np.append(candidates, top)
    k = candidates.shape[0]
    counts = np.bincount(where, minlength=k).astype(np.float64)
    sums = np.bincount(where, weights=t.astype(np.float64), minlength=k)
    n_prefix = np.concatenate([[0.0], np.cumsum(counts)])  # n_prefix[j + 1]: counts of candidates 0..j
    s_prefix = np.concatenate([[0.0], np.cumsum(sums)])
    size = candidates.astype(np.float64)
    # best[j]: the least padding of every candidate 0..j with the last bucket at candidate j.
    best = size * n_prefix[1:] - s_prefix[1:]
    choices: list[np.ndarray] = []
    for _ in range(1, min(buckets, k)):
        nxt, arg = best.copy(), np.full(k, -1, dtype=np.int64)
        for j in range(1, k):  # the previous bucket at i < j; candidates i+1..j take bucket j
            covered = n_prefix[j + 1] - n_prefix[1 : j + 1]
            total = best[:j] + size[j] * covered - (s_prefix[j + 1] - s_prefix[1 : j + 1])
            i = int(np.argmin(total))
            if total[i] < nxt[j]:
                nxt[j], arg[j] = total[i], i
        choices.append(arg)
        best = nxt
    ladder, j = [int(candidates[-1])], k - 1
    for arg in reversed(choices):
        if arg[j] >= 0:
            j = int(arg[j])
            ladder.append(int(candidates[j]))
    return tuple(sorted(set(ladder)))


@dataclasses.dataclass(frozen=True)
class FixedPlans:
    """Static plans' step times for any ladder without re-planning: per plan, every
    microbatch's time without buckets and its padded tokens (``[M, dp]``; an empty one's
    filler); ``rate``: the cost of a bucket's extra token."""

    base: list[np.ndarray]
    grid_tokens: list[np.ndarray]
    rate: float
    sync: str

    @classmethod
    def of(cls, plans: Sequence[Schedule], family: CostModel, sync: str) -> FixedPlans:
        """``plans``: static plans (group ``m * dp + d`` is cell ``(m, d)``)."""
        base, tokens = [], []
        rate = 0.0
        for plan in plans:
            busy, shape = plan.group_counts > 0, (plan.num_microbatches, plan.dp_size)
            base.append(np.where(busy, group_times(plan, family), family.constant).reshape(shape))
            tokens.append(np.where(busy, plan.group_tokens(padded=True), plan.pad_multiple).reshape(shape))
            rate = family.at(plan.cp_size).linear
        return cls(base, tokens, rate, sync)

    @property
    def tokens(self) -> np.ndarray:
        """Every microbatch's padded tokens, all plans."""
        return np.concatenate([t.reshape(-1) for t in self.grid_tokens]) if self.grid_tokens else np.zeros(0, np.int64)

    def mean_time(self, ladder: tuple[int, ...]) -> float:
        """The plans' mean predicted step time with ``ladder``'s bucket padding."""
        price = BucketPrice(np.asarray(ladder, dtype=np.int64), self.rate)
        plans = zip(self.base, self.grid_tokens, strict=True)
        return sum(step_objective(b + price.extra(t), self.sync) for b, t in plans) / max(len(self.base), 1)

    def descend(self, starts: Sequence[tuple[int, ...]], sweeps: int = 3, candidates: int = 128) -> tuple[int, ...]:
        """The best ladder found by moving one bucket at a time (the largest stays) to the
        size, among the plans' microbatch sizes (``candidates`` quantiles at most), that
        lowers :meth:`mean_time` most, from each of ``starts``."""
        top = starts[0][-1]
        sizes = np.unique(self.tokens)
        sizes = sizes[(sizes > 0) & (sizes < top)]
        if sizes.shape[0] > candidates:
            sizes = np.unique(np.quantile(sizes, np.linspace(0, 1, candidates), method="higher").astype(np.int64))
        best, best_time = starts[0], self.mean_time(starts[0])
        for start in starts:
            ladder, now = list(start), self.mean_time(start)
            for _ in range(sweeps):
                moved = False
                for i in range(len(ladder) - 1):  # sorted: the largest (the capacity) stays
                    rest = ladder[:i] + ladder[i + 1 :]
                    trials = [(self.mean_time(tuple(sorted([*rest, s]))), s) for s in sizes.tolist() if s not in rest]
                    t, size = min(trials, default=(now, 0))  # ties: the smallest size
                    if t < now:
                        ladder, now, moved = sorted([*rest, size]), t, True
                if not moved:
                    break
            if now < best_time:
                best, best_time = tuple(ladder), now
        return best


def even_ladder(buckets: int, unit: int, top: int) -> tuple[int, ...]:
    """``buckets`` evenly spaced sizes up to ``top``, each rounded up to a multiple of
    ``unit`` (fewer where they coincide)."""
    step = top / buckets
    return tuple(sorted({min(top, -(-round(step * k) // unit) * unit) for k in range(1, buckets + 1)} - {0}))


def static_shapes_by_cost(
    steps: Sequence[Sequence[int] | np.ndarray],
    *,
    buckets: int,
    max_sequences: int,
    max_tokens_per_rank: int,
    dp_size: int,
    cp_size: int = 1,
    pad_multiple: int = 1,
    cost: CostModel | None = None,
    scheduler: str | Scheduler = "balanced",
    sync: str = "lockstep",
    tail_padding: TailPadding | str = TailPadding.APPEND_DUMMY_SEQ,
    refits: int = 2,
) -> StaticShapes:
    """A :class:`~seqpack.thd.StaticShapes` of at most ``buckets`` token buckets whose plans
    of ``steps`` by ``scheduler`` predict the least mean step time under ``sync`` (the log,
    INFO, reports each ladder tried). Give it many steps of the real data (docs/thd.md).

    Args:
        steps: One int array of real lengths per step (global order, as ``schedule``).
        max_sequences, tail_padding: As :class:`~seqpack.thd.StaticShapes`'; the other
            limits as :meth:`Scheduler.schedule <seqpack.schedulers.Scheduler.schedule>`'s
            (the training run's). Every bucket is a multiple of ``pad_multiple``.
        refits: Re-plans after the first ladder (0: the first ladder is kept).

    Raises:
        ConfigError: ``steps`` empty or not a list, ``buckets`` below 1, a capacity
            below ``pad_multiple``, or what the scheduler refuses.
    """
    buckets = check_positive_int("buckets", buckets, maximum=INT32_MAX)
    refits = check_int("refits", refits, minimum=0, maximum=16)
    planner = get_scheduler(scheduler)
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not len(steps):
        raise ConfigError(
            "steps must be a non-empty list of the steps' lengths (one int array per step, e.g. the first steps "
            f"of the data), got {steps!r:.80}"
        )
    of = functools.partial(Request.of, dp_size=dp_size, cp_size=cp_size, max_tokens_per_rank=max_tokens_per_rank)
    requests = [of(n, pad_multiple=pad_multiple, cost=cost, sync=sync) for n in steps]
    first = requests[0]
    top = min(first.capacity, INT32_MAX) // first.pad_multiple * first.pad_multiple  # a bucket is an int32 count
    if top < 1:
        raise ConfigError(
            f"max_tokens_per_rank={first.max_tokens_per_rank} x cp_size={first.cp_size} = {first.capacity} tokens "
            f"holds no multiple of pad_multiple={first.pad_multiple}: no token bucket fits the capacity"
        )
    family = planner.resolve_cost(first.cost) or default_cost_model()

    def evaluate(ladder: tuple[int, ...]) -> tuple[StaticShapes, float, FixedPlans]:
        shapes = StaticShapes(token_buckets=ladder, max_sequences=max_sequences, tail_padding=TailPadding(tail_padding))
        plans = [planner.plan(dataclasses.replace(request, static_shapes=shapes)) for request in requests]
        times = [predicted_step_time(plan, family, sync=first.sync, static_shapes=shapes) for plan in plans]
        return shapes, float(np.mean(times)), FixedPlans.of(plans, family, first.sync)

    return _search(evaluate, buckets=buckets, unit=first.pad_multiple, top=top, refits=refits)


_Evaluate = Callable[[tuple[int, ...]], tuple[StaticShapes, float, FixedPlans]]  # ladder: shapes, mean time, plans


def _search(evaluate: _Evaluate, *, buckets: int, unit: int, top: int, refits: int) -> StaticShapes:
    """:func:`static_shapes_by_cost`'s search: one bucket, the fitted ladders (re-planned
    ``refits`` times at most) and the even one; the least mean predicted step time wins."""
    best, best_time, fixed = evaluate((top,))
    logger.info("by_cost: one bucket %d: mean predicted step %.6g", top, best_time)
    tried: set[tuple[int, ...]] = {(top,)}
    even = even_ladder(buckets, unit, top)
    starts = [even]
    for _ in range(refits + 1):
        # On these plans: the least summed padding (exact), then the least predicted step
        # time (a microbatch past a bucket edge can set its round's or replica's time).
        ladder = fixed.descend([ladder_for(fixed.tokens, buckets=buckets, unit=unit, top=top), *starts])
        starts = []
        if ladder in tried:
            break
        tried.add(ladder)
        shapes, mean, fixed = evaluate(ladder)  # re-planned with the ladder: the next ladder fits these plans
        logger.info("by_cost: buckets %s: mean predicted step %.6g", shapes.token_buckets, mean)
        if mean < best_time:
            best, best_time = shapes, mean
    # Evenly spaced buckets too: a ladder fitted to a few plans' microbatches may not fit others.
    if even not in tried:
        shapes, mean, _ = evaluate(even)
        logger.info("by_cost: even buckets %s: mean predicted step %.6g", shapes.token_buckets, mean)
        if mean < best_time:
            best, best_time = shapes, mean
    return best
