"""The parts of the replica repair and replica-first planning, each switched off (issue 40).

``benchmarks/ablation.py`` measures the replica-first stage and the per-replica layout as a
whole; this measures what is inside them, on its workloads (the same builders, both syncs),
each part switched off by monkeypatching the kernel's arguments or a copy of its code from
here (the product has no switches), against the full planner (``locality=True``):

* ``-lpt_repair``: replica-first keeps its LPT plan unrepaired;
* ``-local_repair``: the per-replica layout keeps its plan unrepaired;
* ``swaps=1`` / ``swaps=16``: swaps with the 1 / 16 lightest replicas, not 4;
* ``scan=1`` / ``scan=all``: the walk checks 1 partner per item / every one, not 16;
* ``lpt_first_fit``: replica-first puts a sequence in the first round of its replica it fits,
  not the fullest (a copy of the kernel);
* ``matching_rows``: the relabel matches replicas in index order, each to its heaviest free
  rank, not the heaviest (replica, rank) overlaps first.

The workloads are ablation.py's (schedulers.py's under both syncs, the heavy tail, the scale
shapes) and small batches, a few sequences a replica (:func:`small_cases`). This file's
version of commit 28e3f7a (with ``small_cases`` added) also measured the parts since removed
by the rule (benchmarks/results/repair_parts.txt): the repair's moves and its round budget
under lockstep (the per-replica layout is now repaired under ``sync="replica"`` only).

Reported as in ablation.py (its ``detail`` and ``summary``): predicted step time against the
full planner, tokens moved, microbatches, plan CPU time.

    python benchmarks/repair_parts.py [--steps 3] [--repeats 1] [--big] [--quick] [--out FILE]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.schedulers import _kernels  # noqa: E402
from seqpack.schedulers._kernels import replica_repair  # noqa: E402
from seqpack.schedulers.balanced import locality, replicas, rounds  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results" / "repair_parts.txt"


def _load(name: str, path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ablation = _load("seqpack_benchmark_ablation", HERE / "ablation.py")
REAL_REPAIR = replica_repair.repair_replicas


def _kernel_copy(old: str, new: str) -> ModuleType:
    """A copy of ``_kernels/replica_repair.py`` with ``old`` replaced by ``new`` (once)."""
    source = pathlib.Path(replica_repair.__file__).read_text()
    assert source.count(old) == 1, old
    folder = pathlib.Path(tempfile.mkdtemp(prefix="repair_parts_"))
    path = folder / "replica_repair_copy.py"
    path.write_text(source.replace(old, new))
    return _load("replica_repair_copy", path)


@contextlib.contextmanager
def repair_args(**changed: Any) -> Iterator[None]:
    """``repair_replicas`` called with some arguments changed (by position or name)."""
    positions = {"swap_candidates": 10, "max_work": 11}

    def wrapped(*args: Any, **kwargs: Any) -> int:
        args_list = list(args)
        for key, value in changed.items():
            if key in positions and positions[key] < len(args_list):
                args_list[positions[key]] = value
            else:
                kwargs[key] = value
        return int(REAL_REPAIR(*args_list, **kwargs))

    _kernels.repair_replicas = wrapped
    try:
        yield
    finally:
        _kernels.repair_replicas = REAL_REPAIR


@contextlib.contextmanager
def patched(module: ModuleType, name: str, value: Any) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _unrepaired(grid: Any, *args: Any, **kwargs: Any) -> Any:
    return grid


_FIRST_FIT = None


def first_fit_lpt() -> Any:
    global _FIRST_FIT
    if _FIRST_FIT is None:
        _FIRST_FIT = _kernel_copy(
            "if r >= size and (best < 0 or r < room[d, best]):", "if r >= size and best < 0:"
        ).replica_lpt
    return patched(_kernels, "replica_lpt", _FIRST_FIT)


def relabel_rows(replica_of: np.ndarray, origin: np.ndarray, weight: np.ndarray, dp_size: int) -> np.ndarray:
    """relabel_replicas with the pairs in replica order, each replica's heaviest first."""
    if replica_of.size == 0 or dp_size == 1:
        return replica_of
    replica_of = np.asarray(replica_of, dtype=np.int64)
    pair = replica_of * dp_size + np.asarray(origin, dtype=np.int64)
    by_pair = np.argsort(pair)
    sorted_pair = pair[by_pair]
    starts = np.flatnonzero(np.r_[True, sorted_pair[1:] != sorted_pair[:-1]])
    overlap = np.add.reduceat(np.asarray(weight, dtype=np.int64)[by_pair], starts)
    keys = sorted_pair[starts]
    rows, cols = keys // dp_size, keys % dp_size
    order = np.lexsort((cols, -overlap, rows))
    return _kernels.greedy_matching(rows[order], cols[order], dp_size)[replica_of]


PATCHES: dict[str, Callable[[], Any]] = {
    "-lpt_repair": lambda: patched(replicas, "repair", _unrepaired),
    "-local_repair": lambda: patched(locality, "repair", _unrepaired),
    "swaps=1": lambda: repair_args(swap_candidates=1),
    "swaps=16": lambda: repair_args(swap_candidates=16),
    "scan=1": lambda: repair_args(scan_limit=1),
    "scan=all": lambda: repair_args(scan_limit=1 << 40),
    "lpt_first_fit": first_fit_lpt,
}
ablation.ABLATIONS["matching_rows"] = lambda s: dataclasses.replace(s, relabel=relabel_rows)
ON = {"locality": True}
VARIANTS = [
    ablation.Variant("full", options=ON),
    *(ablation.Variant(name, options=ON) for name in PATCHES),
    ablation.Variant("matching_rows", ("matching_rows",), ON),
]
_plan = ablation.plan


def plan(case: Any, variant: Any, lengths: np.ndarray) -> Any:
    with PATCHES.get(variant.name, contextlib.nullcontext)():
        return _plan(case, variant, lengths)


ablation.plan = plan
ablation.VARIANTS = VARIANTS  # summary() reads them
assert rounds.relabel_replicas is not relabel_rows


def small_cases(seeds: int, repeats: int) -> list[Any]:
    """Few sequences a replica (like the requests of the plan digests): ``k * dp``
    lognormal(5.5, 1) lengths (mean about 400 tokens, at most 512) for ``k`` = 4 and 12, into
    ``dp`` = 2, 8 and 16 replicas of 1,024 tokens a microbatch, the default cost, both syncs;
    ``seeds`` steps each."""
    cases = []
    for dp in (2, 8, 16):
        for k in (4, 12):
            steps = [
                np.clip(np.random.default_rng(seed).lognormal(5.5, 1.0, k * dp).astype(np.int64), 1, 512)
                for seed in range(seeds)
            ]
            for sync in ("lockstep", "replica"):
                name = f"small {k}/replica dp={dp} ({sync})"
                cases.append(ablation.Case("small", name, sync, steps, dp, 1024, repeats=repeats))
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--big", action="store_true", help="also 1,048,576 sequences into 1,024 replicas")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="run only workloads whose label contains this")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    steps, repeats = (1, 1) if args.quick else (args.steps, args.repeats)
    lines: list[str] = []

    def write(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    tail = ablation.sibling("heavy_tail").heavy_tail(0)[:512]
    for variant in VARIANTS:  # compile every kernel and kernel copy before anything is timed
        with PATCHES.get(variant.name, contextlib.nullcontext)():
            ablation.warm_up()
            ablation.get_scheduler("balanced", locality=True).schedule(  # the repair (sync="replica" only)
                tail, dp_size=4, max_tokens_per_rank=32768, sync="replica"
            )
    write(f"# python benchmarks/repair_parts.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    write(f"# machine: {ablation.sibling('schedulers').machine()}; load average {os.getloadavg()[0]:.1f}")
    write(f"# {steps} step(s) per workload; plan CPU time best of {repeats}, variants interleaved")
    write("")
    cases = ablation.scheduler_cases(steps, repeats, args.quick) + ablation.heavy_tail_cases(
        steps, repeats, 0, args.quick
    )
    cases += small_cases(2 if args.quick else 4 * steps, repeats)
    shapes = [(4_096, 64)] if args.quick else [(65_536, 1_024)] + ([(1_048_576, 1_024)] if args.big else [])
    sc = ablation.sibling("scale")
    for n, dp in shapes:
        cases.append(
            ablation.Case("scale", f"{n:,} into {dp:,}", "lockstep", [sc.lengths_for(n)], dp, sc.CAPACITY, cost=sc.COST)
        )
        cases[-1].repeats = repeats
    cases = [c for c in cases if args.only in ablation.label(c)]
    results = []
    t0 = time.perf_counter()
    for case in cases:
        results.append(ablation.run_case(case, VARIANTS))
        ablation.detail(case, results[-1], write)
    ablation.summary(cases, results, write)
    write(f"# {time.perf_counter() - t0:.0f} s in all")
    out = args.out if args.out is not None else (None if args.quick else str(RESULTS))
    if out:
        pathlib.Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
