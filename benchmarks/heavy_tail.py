"""Issue 24, items 11 and 12: heavy tails per replica, and verl-like tight packings.

Item 11: 4,096 lengths ``128 x (1 + Pareto(1.3))`` clipped to [16, 32768], 32 replicas,
32,768 tokens per microbatch, cost ``24576*s + s**2``, ``sync="replica"``, forced microbatch
counts 2-6 (a count the sequences do not fit is skipped). Printed: busiest replica /
``max(total / dp, costliest sequence)`` (the plain bound) and the plan's CPU time (best of
``--repeats``), with the replica-first plan (after) and with it switched off, i.e. the
repaired grid alone (before), interleaved in the same run; the capacity-aware bound
(:func:`capacity_replica_bound` below) over the plain one,
and the plan over it; and LPT over replicas without capacity, for reference.

Item 12: verl's ``test_seqlen_balancing_distributed_params`` batch of rank 1 (25 sequences of
50-90 valid tokens, ``max_token_len=300``, ``min_num_micro_batch=4``; verl draws the lengths
from numpy's unseeded global generator, so here seeds 0..N-1): how many batches ``balanced``
gives more microbatches than the fewest that hold them (found by the exact search with a
work limit 250x the default), and the plan's CPU time (best of ``--repeats`` per batch),
with bin completion (after) and with the item search alone (before, ``FEW_PER_BIN = 0``),
interleaved per batch.

    python benchmarks/heavy_tail.py [--seeds 8] [--verl 2000] [--repeats 7]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.cost import CostModel  # noqa: E402
from seqpack.errors import ScheduleError  # noqa: E402
from seqpack.schedulers import Schedule, get_scheduler  # noqa: E402
from seqpack.schedulers.balanced import exact, replicas  # noqa: E402
from seqpack.schedulers.balanced.exact import FOUND, bin_lower_bound, pack_bins  # noqa: E402

COST = CostModel(24576.0, 1.0)
DP, CAPACITY = 32, 32768


def _holds(padded: np.ndarray, costs: np.ndarray, dp_size: int, room: int, target: float) -> bool:
    """False only when no plan keeps every replica at most ``target`` with ``room`` tokens
    per replica (:func:`capacity_replica_bound`'s relaxation)."""
    if float(costs.max()) > target or dp_size * target < float(costs.sum()):
        return False
    anchor = costs > target / 2  # two of them exceed the target together: one replica each
    k = int(anchor.sum())
    if k > dp_size:
        return False
    small = ~anchor & (padded > 0)
    # Each small sequence's cost splits into rho tokens' worth and a token-free rest, both
    # divisible: a relaxation in which the rest only needs the total-cost check above.
    rho = float((costs[small] / padded[small]).min()) if small.any() else 0.0
    tokens = np.full(dp_size, float(room))  # anchors in replicas 0..k-1, one each
    budget = np.full(dp_size, target)
    tokens[:k] -= padded[anchor]
    budget[:k] -= costs[anchor]
    takes = np.minimum(tokens, budget / rho) if rho > 0 else tokens
    return float(takes.sum()) >= float(padded[~anchor].sum())


def capacity_replica_bound(
    padded: np.ndarray, costs: np.ndarray, dp_size: int, capacity: int, num_rounds: int, *, rel_tol: float = 1e-5
) -> float:
    """A lower bound on the busiest replica's cost over every plan with ``num_rounds``
    microbatches of ``capacity`` tokens per replica: at least ``max(total / dp, costliest
    sequence)``, larger where capacity binds (``inf`` when the tokens do not fit).

    Certificate: a target ``B`` is impossible when the sequences costing more than ``B/2``
    (one per replica at most) leave the other replicas too little room. Relaxed: each
    replica holds at most ``num_rounds * capacity`` tokens (microbatch boundaries ignored),
    and each other sequence is divisible, its cost split into ``rho`` per token (``rho``
    the lowest cost per token among them) and a token-free rest. A replica with anchor cost
    ``a`` and ``t`` anchor tokens then takes at most ``min(room - t, (B - a) / rho)`` of
    the other tokens. Bisection keeps its lower end at a target so proven impossible (or
    the plain bound), so the result is a bound whether or not the test is monotone in ``B``.

    Args:
        padded: int64 padded lengths. costs: float64 cost of each sequence.
        dp_size, capacity, num_rounds: Replicas, tokens per microbatch, microbatches each.
        rel_tol: Bisection stops when its ends are this close (relative).
    """
    padded = np.asarray(padded, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    if padded.size == 0:
        return 0.0
    room = int(num_rounds) * int(capacity)
    if int(padded.sum()) > dp_size * room or int(padded.max()) > capacity:
        return float("inf")
    lo = max(float(costs.sum()) / dp_size, float(costs.max()))
    hi = max(lo, 1e-300)
    while not _holds(padded, costs, dp_size, room, hi):
        lo, hi = hi, 2 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if _holds(padded, costs, dp_size, room, mid):
            hi = mid
        else:
            lo = mid
    return lo


def heavy_tail(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip((128 * (1 + rng.pareto(1.3, 4096))).astype(np.int64), 16, CAPACITY)


def busiest(schedule: Schedule, costs: np.ndarray) -> float:
    totals = np.zeros(schedule.dp_size)
    for row in schedule.assignment:
        for d, ids in enumerate(row):
            totals[d] += costs[ids].sum()
    return float(totals.max())


@contextmanager
def grid_only() -> Iterator[None]:
    """The plan before the change: the repaired grid, no replica-first plan."""
    original = replicas.replica_first
    replicas.replica_first = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        replicas.replica_first = original


def plan_ratio(lengths: np.ndarray, m: int, bound: float, costs: np.ndarray) -> tuple[float, float]:
    """Busiest replica / ``bound`` of the plan at ``m`` microbatches, and its CPU seconds."""
    sched = get_scheduler("balanced", num_microbatches=m)
    t = time.process_time()
    schedule = sched.schedule(lengths, dp_size=DP, max_tokens_per_rank=CAPACITY, cost=COST, sync="replica")
    seconds = time.process_time() - t
    schedule.validate(lengths)
    return busiest(schedule, costs) / bound, seconds


def before_after(lengths: np.ndarray, m: int, bound: float, costs: np.ndarray, repeats: int) -> list[float]:
    """``[before, after, before CPU ms, after CPU ms]``: ratios, and best-of-``repeats``
    CPU times taken interleaved (before, after, before, ...)."""
    out = [0.0, 0.0, float("inf"), float("inf")]
    for _ in range(repeats):
        for k in (0, 1):
            if k == 0:
                with grid_only():
                    out[0], seconds = plan_ratio(lengths, m, bound, costs)
            else:
                out[1], seconds = plan_ratio(lengths, m, bound, costs)
            out[2 + k] = min(out[2 + k], 1e3 * seconds)
    return out


def lpt(costs: np.ndarray) -> float:
    totals = np.zeros(DP)
    for c in np.sort(costs)[::-1]:
        totals[np.argmin(totals)] += c
    return float(totals.max())


def item_11(seeds: int, repeats: int) -> None:
    print(
        "# item 11: busiest replica / plain bound max(total/dp, costliest) (plan CPU ms, best of "
        f"{repeats}, interleaved), sync='replica', forced microbatches;\n#   cap: the capacity-aware bound "
        "(capacity_replica_bound) / the plain one; after/cap: busiest / the capacity-aware bound"
    )
    print(f"{'seed':>4} {'M':>2} {'fill':>5} {'before':>16} {'after':>16} {'cap':>7} {'after/cap':>9} {'LPT':>7}")
    worst = {"before": 1.0, "after": 1.0, "after/cap": 1.0}
    loose = {"before": 1.0, "after": 1.0}  # where the tokens fill at most 90% of the capacity
    for seed in range(seeds):
        lengths = heavy_tail(seed)
        costs = COST.cost(lengths)
        bound = max(float(costs.sum()) / DP, float(costs.max()))
        reference = lpt(costs) / bound
        for m in range(2, 7):
            try:
                before, after, t_before, t_after = before_after(lengths, m, bound, costs, repeats)
            except ScheduleError:
                continue  # the sequences need more microbatches
            cap = capacity_replica_bound(lengths, costs, DP, CAPACITY, m) / bound
            fill = float(lengths.sum()) / (DP * m * CAPACITY)
            for key, value in (("before", before), ("after", after), ("after/cap", after / cap)):
                worst[key] = max(worst[key], value)
                if fill <= 0.9 and key in loose:
                    loose[key] = max(loose[key], value)
            print(
                f"{seed:>4} {m:>2} {fill:>5.0%} {before:>8.4f} ({t_before:5.1f}) {after:>8.4f} ({t_after:5.1f}) "
                f"{cap:>7.4f} {after / cap:>9.4f} {reference:>7.4f}"
            )
    print(
        f"# worst: before {worst['before']:.4f}, after {worst['after']:.4f} (of the plain bound); after "
        f"{worst['after/cap']:.4f} of the capacity-aware bound (goal <= 1.02)"
    )
    print(
        f"# worst where the tokens fill <= 90% of the microbatches: before {loose['before']:.4f}, "
        f"after {loose['after']:.4f} (goal <= 1.02)"
    )


def verl_lengths(seed: int) -> np.ndarray:
    rs = np.random.RandomState(seed)
    lengths = []
    for _ in range(25):
        rs.randint(0, 11)  # left padding
        lengths.append(int(rs.randint(50, 91)))
    return np.array(lengths, dtype=np.int64)


@contextmanager
def item_search_only() -> Iterator[None]:
    """The exact search before bin completion: the item search alone, with its whole budget."""
    original = getattr(exact, "FEW_PER_BIN", None)
    if original is None:  # the tree before the change has no bin completion
        yield
        return
    exact.FEW_PER_BIN = 0
    try:
        yield
    finally:
        exact.FEW_PER_BIN = original


def plan_cpu(lengths: np.ndarray, repeats: int) -> tuple[float, int]:
    """Best-of-``repeats`` CPU seconds of one balanced plan, and its microbatch count."""
    sched = get_scheduler("balanced", min_microbatches=4)
    best, count = float("inf"), 0
    for _ in range(repeats):
        t = time.process_time()
        count = sched.schedule(lengths, dp_size=1, max_tokens_per_rank=300).num_microbatches
        best = min(best, time.process_time() - t)
    return best, count


def item_12(batches: int, repeats: int) -> None:
    if batches <= 0:
        return
    more = {"before": 0, "after": 0}
    times: dict[str, list[float]] = {"before": [], "after": []}
    fewest_total = 0
    for seed in range(batches):
        lengths = verl_lengths(seed)
        fewest = max(4, bin_lower_bound(lengths, 300))
        while pack_bins(lengths, fewest, 300, max_work=1_000_000_000)[0] != FOUND:
            fewest += 1
        fewest_total += fewest
        for key in ("before", "after"):  # interleaved, per batch
            if key == "before":
                with item_search_only():
                    seconds, got = plan_cpu(lengths, repeats)
            else:
                seconds, got = plan_cpu(lengths, repeats)
            times[key].append(1e3 * seconds)
            more[key] += got > fewest
    print(
        f"# item 12: {batches} verl-like batches (mean fewest {fewest_total / batches:.2f} microbatches); "
        f"plan CPU ms, best of {repeats} per batch"
    )
    for key in ("before", "after"):
        t = np.array(times[key])
        print(
            f"#   {key:>6} (item search{' + bin completion' if key == 'after' else ' alone'}): more microbatches "
            f"than the fewest in {more[key]}; median {np.median(t):.3f}, p99 {np.percentile(t, 99):.3f}, "
            f"max {t.max():.1f}, total {t.sum():.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="heavy-tail batches (seeds 0..N-1)")
    parser.add_argument("--verl", type=int, default=2000, help="verl-like batches (seeds 0..N-1)")
    parser.add_argument("--repeats", type=int, default=7, help="best of this many plans (CPU time)")
    args = parser.parse_args()
    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}")
    get_scheduler("balanced").schedule([1, 2, 3], dp_size=2, max_tokens_per_rank=8)  # compile outside timings
    item_11(args.seeds, args.repeats)
    item_12(args.verl, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
