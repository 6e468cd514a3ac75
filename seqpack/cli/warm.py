"""``seqpack doctor --warm``: compile every scheduler kernel ahead of a job.

numba compiles a kernel on its first call and caches it on disk (docs/scale.md). Each family
below plans a small step that calls every kernel of its family with the argument types real
plans use, so that a job started afterwards with the same cache loads them instead
(tests/cli/test_cli_warm.py checks that together they compile every kernel function).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from seqpack.cost import CostModel, default_cost_model
from seqpack.packing import pack_lengths
from seqpack.schedulers import get_scheduler

__all__ = ["FAMILIES", "Family", "plan_family"]

# verl-like lengths (25 of 50-90 tokens, 300 per microbatch) that every greedy rule packs
# into 7 microbatches where 6 hold them: the exact search runs, and hands over to bin
# completion (tests/schedulers/test_bin_completion.py, seed 349).
_TIGHT = [81, 67, 80, 66, 55, 83, 70, 70, 75, 64, 74, 50, 76, 63, 62, 88, 59, 74, 65, 67, 78, 69, 79, 67, 79]


def _lognormal(n: int, cap: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.minimum(rng.lognormal(6.5, 1.0, n).astype(np.int64) + 1, cap)


def _next_fit() -> None:
    lengths = _lognormal(256, 4096)
    for name in ("dp_balanced", "empty"):
        get_scheduler(name).schedule(lengths, dp_size=4, max_tokens_per_rank=4096)


def _balanced() -> None:
    get_scheduler("balanced", locality=True).schedule(_lognormal(512, 4096), dp_size=4, max_tokens_per_rank=4096)


def _exact() -> None:
    get_scheduler("balanced", min_microbatches=4).schedule(_TIGHT, dp_size=1, max_tokens_per_rank=300)


def _replica_first() -> None:
    # Heavy tails (Pareto) under sync="replica": a few long sequences each cost most of a
    # replica's share, the grid's busiest replica stays above the bound and the
    # replica-first pass runs (tests/schedulers/test_quality.py's workload, smaller).
    rng = np.random.default_rng(4)
    lengths = np.clip((128 * (1 + rng.pareto(1.3, 256))).astype(np.int64), 16, 8192)
    cost = CostModel(24576.0, 1.0)
    # Locality asked for (its default, "auto", leaves it off for token ids): under
    # sync="replica" it runs the per-replica layout (grid_local and its heaps).
    sched = get_scheduler("balanced", locality=True)
    sched.schedule(lengths, dp_size=4, max_tokens_per_rank=8192, cost=cost, sync="replica")


def _dynamic_cp() -> None:
    lengths = _lognormal(256, 8192)
    cost = dataclasses.replace(default_cost_model(), ranks_per_node=4, reference_size=1)
    for sync, sizes in (("lockstep", "pow2"), ("replica", "any")):
        sched = get_scheduler("dynamic_cp", group_sizes=sizes)
        sched.schedule(lengths, dp_size=4, cp_size=2, max_tokens_per_rank=2048, cost=cost, sync=sync)


def _packing() -> None:
    # The single-rank packer (pack_dataset, and balanced at dp_size=1 where it reaches the bound).
    lengths = _lognormal(512, 4096)
    get_scheduler("balanced").schedule(lengths, dp_size=1, max_tokens_per_rank=4096)
    pack_lengths(lengths, 4096)


@dataclasses.dataclass(frozen=True)
class Family:
    """Kernels that one small plan compiles."""

    name: str
    kernels: str
    plan: Callable[[], None]
    # Start order under `doctor --warm --jobs N`: the families that compile longest start
    # first, so the others fill in beside them (docs/scale.md's table of cold compiles).
    order: int


FAMILIES: tuple[Family, ...] = (
    Family("dp_balanced, empty", "next_fit", _next_fit, order=4),
    Family(
        "balanced (locality, dp=4)",
        "grid_lpt, grid_local, home_swaps, repair_replicas, greedy_matching",
        _balanced,
        order=0,
    ),
    Family("balanced, exact search", "dfs, complete_bins", _exact, order=1),
    Family("balanced, replica-first", "replica_lpt", _replica_first, order=3),
    Family("dynamic_cp", "cp_planner", _dynamic_cp, order=2),
    Family("packing (pack_dataset, balanced at dp=1)", "pack_sizes, group_by_pack", _packing, order=5),
)


def plan_family(name: str) -> tuple[float, float]:
    """Plan the step of the family called ``name`` in this process; its (wall, CPU) seconds."""
    (family,) = (f for f in FAMILIES if f.name == name)
    start, start_cpu = time.perf_counter(), time.process_time()
    family.plan()
    return time.perf_counter() - start, time.process_time() - start_cpu
