"""Plan time before vs now: two source trees, interleaved, CPU time, best of N, same plans.

Each tree runs in a worker process of its own (its own ``PYTHONPATH`` and ``NUMBA_CACHE_DIR``,
so they compile and cache apart; ``--before`` may be given several times, each tree labelled
by its folder's name); the driver asks them for the same shape in turn (before, ..., now,
before, ...), after one untimed warm-up each, and prints per shape the best CPU time
(``time.process_time`` around ``Scheduler.schedule``) of each, now's ratio to each, whether
the plans are identical (a digest of every microbatch's ids), and the best CPU time of each
numba kernel within the plan (the kernels are wrapped by timers; ``_kernels.X`` lookups).
Give ``--cache`` a fresh prefix for a fresh numba cache (the default is reused between runs).

Shapes (``kind:args``):

* ``scale:N:dp[:option=value...]``: ``benchmarks/scale.py``'s workload (lognormal SFT
  lengths, capacity 16,384, cost ``24576*s + s**2``), e.g. ``scale:65536:1024``,
  ``scale:1048576:1024:locality=True`` (the default is ``locality="auto"``, off for these
  token-id samples), ``scale:65536:1024:locality=True``;
* ``sched:WORKLOAD:SEED[:option=value...]``: a workload of ``benchmarks/schedulers.py``
  (llama3-8b cost);
* ``ht:SEED[:SYNC[:M]]``: issue 24 item 11's heavy tail (4,096 Pareto(1.3) lengths, 32
  replicas, capacity 32,768), ``sync`` and forced microbatch count optional.

``--ratio`` instead times locality on against off in the ``--now`` tree alone, interleaved
(shapes ``NxDP``): the best of each, their ratio, and the median per-run ratio.

    python benchmarks/plans_ab.py --before /tmp/before --repeat 9 scale:65536:1024 ht:0
    python benchmarks/plans_ab.py --before /tmp/5ea2a6b --before /tmp/00102be --cache /tmp/fresh1 scale:4096:64
    python benchmarks/plans_ab.py --ratio --repeat 7 1048576x1024 65536x1024

The before tree is any checkout (``git archive 988af75 | tar -x -C /tmp/before``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

KERNELS = ("grid_lpt", "grid_local", "home_swaps", "repair_replicas", "greedy_matching", "next_fit")


def shape(name: str) -> tuple[str, dict, np.ndarray, dict]:
    """``(scheduler, options, lengths, schedule keywords)`` of a shape name (worker side)."""
    from seqpack.cost import CostModel, model_preset
    from seqpack.mock_data import generate_lengths, lognormal_lengths

    kind, *args = name.split(":")
    if kind == "scale":
        n, dp = int(args[0]), int(args[1])
        opts: dict[str, Any] = {}
        for kv in args[2:]:
            key, value = kv.split("=")
            opts[key] = {"False": False, "True": True}.get(value, value)
        lengths = lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=0)
        return "balanced", opts, lengths, dict(dp_size=dp, max_tokens_per_rank=16384, cost=CostModel(24576.0, 1.0))
    if kind == "sched":
        from schedulers import WORKLOADS  # benchmarks/schedulers.py, beside this file

        wl = {w.name: w for w in WORKLOADS}[args[0]]
        params = dict(wl.params) if wl.dist == "constant" else dict(wl.params, seed=int(args[1]))
        sched_opts: dict[str, Any] = {}
        for kv in args[2:]:
            key, value = kv.split("=")
            sched_opts[key] = {"False": False, "True": True}.get(value, value)
        cp = wl.cp
        kw = dict(
            dp_size=wl.dp, cp_size=cp, max_tokens_per_rank=wl.max_tokens_per_rank, pad_multiple=2 * cp if cp > 1 else 1
        )
        return (
            "balanced",
            sched_opts,
            generate_lengths(wl.dist, wl.sequences, **params),
            dict(kw, cost=model_preset("llama3-8b").cost_model()),
        )
    if kind == "ht":
        rng = np.random.default_rng(int(args[0]))
        lengths = np.clip((128 * (1 + rng.pareto(1.3, 4096))).astype(np.int64), 16, 32768)
        kw = dict(dp_size=32, max_tokens_per_rank=32768, cost=CostModel(24576.0, 1.0))
        if len(args) > 1 and args[1]:
            kw["sync"] = args[1]
        opts = {"num_microbatches": int(args[2])} if len(args) > 2 else {}
        return "balanced", opts, lengths, kw
    raise ValueError(f"unknown shape {name!r} (kinds: scale, sched, ht)")


def _lazy_kernels() -> list[tuple[Any, list[tuple[str, str]]]]:
    """The kernels callers reach through lazy modules, where this tree has them: (proxy,
    [(attribute, label)])."""
    found: list[tuple[Any, list[tuple[str, str]]]] = []
    try:
        from seqpack.schedulers.balanced import exact, replicas
    except ImportError:  # a tree from before the balanced package
        return found
    if not hasattr(exact, "_search"):  # a tree that reaches them through _kernels (KERNELS)
        return found
    found.append((exact._search, [("dfs", "dfs"), ("complete_bins", "complete_bins")]))
    if hasattr(exact, "_completion"):
        found.append((exact._completion, [("complete_bins", "complete_bins")]))
    found.append((replicas._kernel, [("replica_lpt", "replica_lpt"), ("lpt", "replica_lpt")]))
    return found


def worker() -> None:
    """Answer shape names on stdin with one JSON line each: CPU seconds, digest, kernels."""
    from seqpack.schedulers import _kernels, get_scheduler

    spent: dict[str, float] = {}

    def timed(holder: Any, name: str, label: str) -> None:
        kernel = getattr(holder, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            out = kernel(*args, **kwargs)
            spent[label] = spent.get(label, 0.0) + time.process_time() - t
            return out

        setattr(holder, name, run)

    for name in KERNELS + ("dfs", "complete_bins", "replica_lpt"):
        if name in dir(_kernels):
            timed(_kernels, name, name)
    for holder, names in _lazy_kernels():
        for name, label in names:
            if hasattr(holder, name):
                timed(holder, name, label)
    shapes: dict[str, tuple] = {}
    print("ready", flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name not in shapes:
            shapes[name] = shape(name)
        scheduler, opts, lengths, kw = shapes[name]
        sched = get_scheduler(scheduler, **opts)
        gc.collect()
        spent.clear()
        t = time.process_time()
        schedule = sched.schedule(lengths, **kw)
        cpu = time.process_time() - t
        digest = hashlib.sha1(str(schedule.num_microbatches).encode())
        for row in schedule.assignment:
            for ids in row:
                digest.update(np.asarray(ids, dtype=np.int64).tobytes() + b"|")
        print(json.dumps({"cpu": cpu, "digest": digest.hexdigest()[:12], "kernels": spent}), flush=True)


class Worker:
    def __init__(self, tree: str, cache: str) -> None:
        env = dict(os.environ, PYTHONPATH=tree, PYTHONWARNINGS="ignore")
        if cache:  # else the environment's: numba's cache beside the tree's sources unless NUMBA_CACHE_DIR is set
            env["NUMBA_CACHE_DIR"] = cache
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.tree = tree
        if self.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker of {tree} did not start")

    def ask(self, name: str) -> dict:
        self.stdin.write(name + "\n")
        self.stdin.flush()
        line = self.stdout.readline()
        if not line:  # the worker died: its traceback is on stderr, above
            raise SystemExit(f"plans_ab: the worker of {self.tree} ended on shape {name!r} (its error above)")
        return json.loads(line)


def compare(befores: list[tuple[str, Worker]], now: Worker, names: list[str], repeat: int) -> None:
    """Per shape: each tree's best CPU time, now's ratio to each, whether the plans are the same."""
    sides = [*befores, ("now", now)]
    for name in names:
        for _, worker in sides:
            worker.ask(name)  # warm-up: compile or load the kernels, build the shape
        runs: dict[str, list[dict]] = {label: [] for label, _ in sides}
        for _ in range(repeat):
            for label, worker in sides:
                runs[label].append(worker.ask(name))
        best = {label: min(runs[label], key=lambda r: r["cpu"]) for label, _ in sides}
        b = best["now"]
        columns = []
        for label, _ in befores:
            a = best[label]
            same = "same plan" if a["digest"] == b["digest"] else f"DIFFERENT plan ({a['digest']} vs {b['digest']})"
            columns.append(f"{label} {1e3 * a['cpu']:9.1f} ms (now/{label} {b['cpu'] / a['cpu']:.3f}, {same})")
        print(f"{name:<38} now {1e3 * b['cpu']:9.1f} ms  " + "  ".join(columns), flush=True)
        kernels = sorted({k for label, _ in sides for r in runs[label] for k in r["kernels"]})
        order = [label for label, _ in sides]
        per_kernel = {k: [min(r["kernels"].get(k, 0.0) for r in runs[label]) for label in order] for k in kernels}
        print(
            f"    kernels, best ms {'/'.join(order)}: "
            + ", ".join(f"{k} " + "/".join(f"{1e3 * v:.1f}" for v in vs) for k, vs in per_kernel.items()),
            flush=True,
        )


def ratios(now: Worker, names: list[str], repeat: int) -> None:
    for name in names:
        n, dp = name.split("x")
        on, off = f"scale:{n}:{dp}:locality=True", f"scale:{n}:{dp}:locality=False"
        now.ask(on), now.ask(off)
        a, b = [], []
        for _ in range(repeat):
            a.append(now.ask(on)["cpu"])
            b.append(now.ask(off)["cpu"])
        per_run = [x / y for x, y in zip(a, b, strict=True)]
        print(
            f"{int(n):>10,} into {int(dp):>6,}: on {min(a):7.3f} s  off {min(b):7.3f} s  "
            f"best-of {min(a) / min(b):.2f}x  "
            f"per-run median {statistics.median(per_run):.2f}x ({min(per_run):.2f}-{max(per_run):.2f}, {repeat} runs)",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*")
    parser.add_argument(
        "--before",
        action="append",
        default=[],
        help="another source tree (a checkout; repeatable, labelled by its folder)",
    )
    parser.add_argument("--now", default=str(Path(__file__).resolve().parents[1]), help="this tree by default")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--ratio", action="store_true", help="locality on vs off in --now (shapes NxDP)")
    parser.add_argument(
        "--cache",
        default="/tmp/plans_ab_numba",
        help="NUMBA_CACHE_DIR prefix (one per tree); '' keeps the environment's (a smoke test's warm cache)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    print(f"# CPU time, best of {args.repeat}, interleaved; machine: {os.cpu_count()} logical CPUs (shared)")
    now = Worker(args.now, args.cache and args.cache + "_now")
    if args.ratio:
        ratios(now, args.shapes, args.repeat)
        return 0
    if not args.before:
        parser.error("--before PATH is needed (or --ratio)")
    befores = [(Path(b).name, Worker(b, args.cache and f"{args.cache}_{Path(b).name}")) for b in args.before]
    compare(befores, now, args.shapes, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
