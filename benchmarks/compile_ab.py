"""Cold compile of the numba kernels, tree against tree: CPU time of the first plans in a fresh
process with an empty numba cache, then warm in a second process on that cache.

Each tree (``--tree LABEL=PATH``, any checkout; ``now`` is this one) runs in fresh Python
processes of its own: ``PYTHONPATH`` the tree, ``NUMBA_CACHE_DIR`` a new empty directory. A
process imports numpy, numba and seqpack and builds its inputs (not timed), then times
(``time.process_time``, and wall) the plans of a set, one after the other, as the first use
of a job does. A second process on the same cache runs them again (warm: numba loads the
cache). Trees are interleaved (a, b, c, a, b, c, ...) ``--repeat`` times; the best CPU time of
each tree is printed, and every run's.

Sets:

* ``first``: the first ``balanced``, ``dp_balanced`` and ``empty`` plans at dp=8: 512
  lognormal sequences (``benchmarks/scale.py``'s workload, 64 per replica, capacity 16,384,
  cost ``24576*s + s**2``), locality on; each plan timed on its own too.
* ``doctor``: ``seqpack doctor --warm``'s families (``seqpack.cli.warm.FAMILIES``) one after
  the other in one process, as the command runs them; each family timed on its own.
* ``full``: every kernel: ``balanced`` (locality, the repair, the layout's matching) and under
  ``sync="replica"`` (grid_local), ``dp_balanced`` and ``empty`` (next_fit), tight
  packings (the exact search: the item search, and bin completion on a verl batch it gives up
  on), a heavy tail under ``sync="replica"`` (the replica-first LPT), and ``plan_dynamic_cp``
  under both syncs and both group-size rules (every dynamic-CP kernel). Trees from before
  these kernels (5ea2a6b) lack some of them: run ``first`` there.

    python benchmarks/compile_ab.py --tree before=/tmp/before5ea --tree main=/tmp/main00102be --repeat 3
    python benchmarks/compile_ab.py --set full --repeat 3
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve()


def _verl_lengths(seed: int) -> np.ndarray:
    """tests/schedulers/test_quality.py's verl batch (25 rows of 50..90 valid tokens)."""
    rs = np.random.RandomState(seed)
    lengths = []
    for _ in range(25):
        rs.randint(0, 11)  # left padding
        lengths.append(int(rs.randint(50, 91)))
    return np.array(lengths, dtype=np.int64)


def _first_plans() -> list[tuple[str, Callable[[], Any]]]:
    from seqpack.cost import CostModel
    from seqpack.mock_data import lognormal_lengths
    from seqpack.schedulers import get_scheduler

    lengths = lognormal_lengths(512, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=0)
    step = dict(dp_size=8, max_tokens_per_rank=16384, cost=CostModel(24576.0, 1.0))
    # Locality asked for: its default ("auto" since f4e3716, on before) leaves it off for
    # token ids, and trees before that would compile home_swaps where this one does not.
    options = {"balanced": {"locality": True}}
    return [
        (name, lambda name=name: get_scheduler(name, **options.get(name, {})).schedule(lengths, **step))
        for name in ("balanced", "dp_balanced", "empty")
    ]


def _full_plans() -> list[tuple[str, Callable[[], Any]]]:
    from seqpack.cost import CostModel, default_cost_model
    from seqpack.mock_data import lognormal_lengths
    from seqpack.schedulers import get_scheduler

    try:
        from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
    except ImportError:  # a tree before dynamic CP's one plan (its plans are skipped)
        plan_dynamic_cp = None  # type: ignore[assignment]
    ring: Any = None
    if plan_dynamic_cp is not None:
        figures = dict(ring_step=0.5, ring_token=0.05, ranks_per_node=4)
        try:  # a tree before the one cost type: the ring on a GroupCost
            from seqpack.cost import GroupCost  # type: ignore[attr-defined]

            ring = GroupCost(CostModel(0.1, 0.01, 0.0), **figures)
        except ImportError:
            ring = CostModel(0.1, 0.01, 0.0, **figures, reference_size=1)  # type: ignore[arg-type]

    rng = np.random.default_rng(0)
    lognormal = lognormal_lengths(96, min_seq_len=16, max_seq_len=4096, mean_seq_len=1024, sigma=1.1, seed=0)
    pareto = np.clip((64 * (1 + rng.pareto(1.3, 64))).astype(np.int64), 16, 4096)
    # seqpack doctor --warm's replica-first workload (seqpack/cli/warm.py): a heavy tail whose
    # busiest replica stays above the bound, so the replica-first pass runs.
    heavy = np.clip((128 * (1 + np.random.default_rng(4).pareto(1.3, 256))).astype(np.int64), 16, 8192)
    tight = np.array(
        [86, 61, 60, 68, 86, 54, 60, 71, 59, 66, 64, 52, 51, 54, 77, 90, 88, 78, 87, 68, 72, 76, 66, 61, 78]
    )
    step = dict(dp_size=4, max_tokens_per_rank=4096, cost=default_cost_model())

    def plan(name: str, lengths: np.ndarray, options: dict | None = None, **kw: Any) -> Callable[[], Any]:
        return lambda: get_scheduler(name, **(options or {})).schedule(lengths, **(kw or step))

    def dynamic() -> None:
        lengths = [900, 500, 300, 120, 90, 60, 30, 20, 10, 5]
        for sync in ("lockstep", "replica"):
            for sizes in ("pow2", "any"):
                step = dict(dp_size=4, cp_size=2, max_tokens_per_rank=128, cost=ring, sync=sync)
                if "request" in inspect.signature(plan_dynamic_cp).parameters:  # it takes the one Request
                    from seqpack.schedulers import Request

                    plan_dynamic_cp(Request.of(lengths, **step), group_sizes=sizes)
                else:  # a tree before it did: the scheduler's keywords
                    plan_dynamic_cp(lengths, **step, group_sizes=sizes)

    replica = dict(dp_size=4, max_tokens_per_rank=8192, cost=CostModel(24576.0, 1.0), sync="replica")
    return [
        ("balanced", plan("balanced", lognormal, {"locality": True})),
        ("balanced replicas", plan("balanced", pareto, **step, sync="replica")),
        ("dp_balanced", plan("dp_balanced", lognormal)),
        ("empty", plan("empty", lognormal)),
        ("exact search", plan("balanced", tight, dp_size=1, max_tokens_per_rank=300)),
        ("bin completion", plan("balanced", _verl_lengths(349), dp_size=1, max_tokens_per_rank=300)),
        ("replica-first", plan("balanced", heavy, {"locality": True}, **replica)),
        ("dynamic CP", dynamic),
    ]


def _doctor_plans() -> list[tuple[str, Callable[[], Any]]]:
    from seqpack.cli.warm import FAMILIES

    return [(family.name, family.plan) for family in FAMILIES]


def child(which: str) -> None:
    """Time the plans of set ``which`` in this process; one JSON line."""
    import numba  # noqa: F401  (imported before timing, as seqpack is)

    import seqpack  # noqa: F401

    plans = {"first": _first_plans, "full": _full_plans, "doctor": _doctor_plans}[which]()
    parts, skipped = {}, []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for name, run in plans:
        t = time.process_time()
        try:
            run()
        except Exception as err:  # an API the tree lacks (dynamic CP, an option): left out
            skipped.append(f"{name}: {type(err).__name__}: {str(err)[:120]}")
            continue
        parts[name] = time.process_time() - t
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"cpu": cpu, "wall": wall, "parts": parts, "skipped": skipped}), flush=True)


def run_tree(tree: str, which: str) -> tuple[dict, dict]:
    """A cold process on an empty cache, then a warm one on the same cache."""
    cache = tempfile.mkdtemp(prefix="compile_ab_numba_")
    try:
        env = dict(os.environ, PYTHONPATH=tree, NUMBA_CACHE_DIR=cache, PYTHONWARNINGS="ignore")
        env.pop("NUMBA_DISABLE_JIT", None)
        out = []
        for _ in range(2):
            proc = subprocess.run(
                [sys.executable, str(HERE), "--child", which], cwd=tree, env=env, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise RuntimeError(f"{tree}: {proc.stderr[-2000:]}")
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        return out[0], out[1]
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a source tree (repeatable)")
    parser.add_argument("--set", choices=("first", "full", "doctor"), default="first")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-now", action="store_true", help="leave out this tree")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    trees = [tuple(t.split("=", 1)) for t in args.tree]
    if not args.no_now:
        trees.append(("now", str(HERE.parents[1])))
    print(
        f"# cold compile, set {args.set!r}: CPU s of the first plans in a fresh process with an empty numba cache "
        f"(warm: a second process on it); {args.repeat} rounds, trees interleaved; {os.cpu_count()} logical CPUs, "
        f"load {os.getloadavg()[0]:.1f} at the start",
        flush=True,
    )
    runs: dict[str, list[tuple[dict, dict]]] = {label: [] for label, _ in trees}
    for r in range(args.repeat):
        for label, path in trees:
            cold, warm = run_tree(path, args.set)
            runs[label].append((cold, warm))
            parts = ", ".join(f"{k} {v:.1f}" for k, v in cold["parts"].items())
            print(
                f"round {r + 1} {label:<8} cold cpu {cold['cpu']:6.1f} s wall {cold['wall']:6.1f} s ({parts}); "
                f"warm cpu {warm['cpu']:5.2f} s  [load {os.getloadavg()[0]:.1f}]",
                flush=True,
            )
    for label, _ in trees:
        for skip in runs[label][0][0].get("skipped", []):
            print(f"{label}: skipped {skip}")
    common = set.intersection(*(set(runs[label][0][0]["parts"]) for label, _ in trees))
    if len(trees) > 1 and any(set(runs[label][0][0]["parts"]) != common for label, _ in trees):
        print(f"plans every tree ran: {', '.join(sorted(common))}; best cold CPU s over them:")
        for label, _ in trees:
            print(f"  {label:<8} {min(sum(c['parts'][k] for k in common) for c, _ in runs[label]):8.1f}")
    print(f"\n{'tree':<8} {'best cold CPU s':>16} {'median':>8} {'best warm CPU s':>16}")
    for label, _ in trees:
        colds = sorted(c["cpu"] for c, _ in runs[label])
        warms = sorted(w["cpu"] for _, w in runs[label])
        print(f"{label:<8} {colds[0]:16.1f} {colds[len(colds) // 2]:8.1f} {warms[0]:16.2f}")
    if len(trees) > 1:
        now = min(c["cpu"] for c, _ in runs[trees[-1][0]])
        for label, _ in trees[:-1]:
            other = min(c["cpu"] for c, _ in runs[label])
            print(f"{trees[-1][0]} / {label}: {now / other:.2f}x (best cold CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
