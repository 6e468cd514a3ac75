"""The schedulers' objective (a plan's step time under each sync, docs/schedulers.md) and
lower bounds no plan can beat: the planners optimize them, :mod:`seqpack.stats` reports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from seqpack.errors import ConfigError
from seqpack.options import INT64_MAX, Sync
from seqpack.validation import check_choice, check_numbers

if TYPE_CHECKING:
    from collections.abc import Sequence

    from seqpack.cost import CostModel
    from seqpack.schedulers.schedule import Schedule

__all__ = [
    "as_sample_cost",
    "exact_sum",
    "microbatch_costs",
    "round_lower_bound",
    "round_sum_lower_bound",
    "sequence_costs",
    "step_objective",
]


def step_objective(costs: np.ndarray, sync: str = Sync.LOCKSTEP) -> float:
    """Predicted step time of microbatch costs ``[M, dp]`` (constants included): ``sum_m max_d``
    under ``"lockstep"``, ``max_d sum_m`` under ``"replica"``."""
    if sync not in (Sync.LOCKSTEP, Sync.REPLICA):
        check_choice("sync", sync, Sync)  # raises, naming the value
    if costs.size == 0:
        return 0.0
    if sync == Sync.LOCKSTEP:
        return float(costs.max(axis=1).sum())
    return float(costs.sum(axis=0).max())


def as_sample_cost(sample_cost: Sequence[float] | np.ndarray | None, num_samples: int) -> np.ndarray | None:
    """:meth:`Request.of <seqpack.schedulers.request.Request.of>`'s ``sample_cost`` as float64
    ``[num_samples]`` (None when none is given), checked: one finite value >= 0 per sample."""
    if sample_cost is None:
        return None
    arr = check_numbers("sample_cost", sample_cost)
    if np.ndim(sample_cost) != 1 or arr.shape != (num_samples,):
        raise ConfigError(
            f"sample_cost must hold one cost per sample ({num_samples}), got shape {np.shape(sample_cost)}"
        )
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"sample_cost of sample {i} is {float(arr[i])!r}; a sample's cost must be finite and >= 0")
    return arr


def sequence_costs(schedule: Schedule, cost: CostModel | None) -> np.ndarray:
    """float64, one per entry of ``schedule.assigned``: its padded length's cost plus its
    ``sample_cost`` (without a cost model: its padded tokens, the sample cost left out)."""
    padded = schedule.padded_assigned()
    if cost is None:
        return padded.astype(np.float64)
    per_seq = cost.cost(padded)
    if schedule.sample_cost is not None:
        per_seq = per_seq + schedule.sample_cost[schedule.assigned]
    return per_seq


def microbatch_costs(schedule: Schedule, cost: CostModel | None) -> np.ndarray:
    """Cost of every microbatch, float64 ``[num_microbatches, dp_size]``: its sequences'
    :func:`sequence_costs` plus ``constant`` (an empty one runs a padding-only filler)."""
    per_seq = sequence_costs(schedule, cost)
    constant = 0.0 if cost is None else cost.constant
    groups = np.bincount(schedule.group_of, weights=per_seq, minlength=schedule.num_groups) + constant
    out = np.zeros((schedule.num_microbatches, schedule.dp_size), dtype=np.float64)
    np.add.at(out, (schedule.group_round, schedule.leading_replica()), groups)
    return out


def round_sum_lower_bound(
    padded: np.ndarray, per_seq_cost: np.ndarray, dp_size: int, capacity: int, *, order: np.ndarray | None = None
) -> float:
    """Lower bound on ``sum_m max_d cost[m, d]`` of sequences of ``padded`` lengths and
    ``per_seq_cost`` costs (constants left out), ``capacity`` tokens a microbatch:
    ``total/dp + max(0, largest - K/dp)``, ``K`` the cost of the ``dp_size * capacity`` tokens
    densest in cost (a fractional knapsack by cost per padded token, costliest first;
    docs/multimodal.md). ``order``: a permutation used instead of the sort when it is that order.
    """
    if padded.size == 0:
        return 0.0
    density = per_seq_cost / np.maximum(padded, 1)
    if order is None or order.shape != padded.shape or not np.all(density[order][:-1] >= density[order][1:]):
        order = np.argsort(-density, kind="stable")
    tokens = np.cumsum(padded[order])
    budget = min(dp_size * capacity, INT64_MAX)  # token sums fit int64: beyond, everything fits
    full = int(np.searchsorted(tokens, budget, side="right"))
    knapsack = float(per_seq_cost[order[:full]].sum())
    if full < order.shape[0]:
        used = int(tokens[full - 1]) if full else 0
        nxt = order[full]
        knapsack += float(per_seq_cost[nxt]) * (budget - used) / float(padded[nxt])
    mean = float(per_seq_cost.sum()) / dp_size
    return mean + max(0.0, float(per_seq_cost.max()) - knapsack / dp_size)


def round_lower_bound(
    padded: np.ndarray, per_seq_cost: np.ndarray, dp_size: int, capacity: int, total_cost: float
) -> float:
    """Smallest ``round_imbalance`` any schedule of these sequences can reach:
    :func:`round_sum_lower_bound` over the mean round sum, ``total_cost`` the step's cost with
    constants (``sum_m sum_d cost[m, d]``)."""
    if padded.size == 0 or total_cost <= 0:
        return 1.0
    mean = total_cost / dp_size
    bound = round_sum_lower_bound(padded, per_seq_cost, dp_size, capacity)
    gap = bound - float(per_seq_cost.sum()) / dp_size
    return (mean + gap) / mean


def exact_sum(values: np.ndarray, *, squares: bool = False) -> int:
    """Sum of non-negative integer ``values`` (or of their squares) as an exact Python int:
    numpy's int64 sum wraps past 2**63, so large inputs are summed in Python ints."""
    values = np.asarray(values)
    if values.size == 0:
        return 0
    top = int(values.max())
    if (top * top if squares else top) * values.size <= INT64_MAX:
        return int(np.dot(values, values)) if squares else int(values.sum(dtype=np.int64))
    return sum(v * v for v in values.tolist()) if squares else sum(values.tolist())
