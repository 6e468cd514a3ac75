"""Scale: plan time, peak memory and moved tokens of one step, from 64 to 65,536 replicas.

Workload (issue 12): lognormal SFT lengths (mean 4096, sigma 1.1, clipped to 1024..8192),
capacity 16,384 tokens per microbatch, cost ``24576*s + s**2`` per sequence; samples sit on
DP ranks in contiguous equal blocks (what the wrapper reads).

Three sweeps, each a table, a plot (``docs/scale.png``) and a log-log slope (how the plan
time grows with N or dp; 1.0 = linear):

1. N from 65,536 to 4,194,304 sequences into 16,384 replicas.
2. dp from 64 to 65,536 replicas with 64 sequences each (N = 4,096 ... 4,194,304): every rank
   reads the same share as the job grows.
3. Locality on vs off at ~1,000 sequences per replica (1M into dp = 1,024) and at the 16K
   plan: CPU time of each, their ratio, and moved tokens.
4. Moved tokens vs dp (as in 2), for ``balanced`` under each sync (``lockstep``, the
   default: FSDP; ``replica``: DDP), with locality on and off, and for ``dp_balanced``.

Time: wall clock and CPU time (``time.process_time``; the machine is shared, CPU time is the
steadier figure) of ``Scheduler.schedule``, numba compiled beforehand, best of ``--repeat``.
Memory: peak resident memory above the start of the call (``/proc/self/status`` VmHWM, reset
before the call: numpy, Python and numba allocations), each in a fresh process (in a process
that planned before, freed pages are reused and the growth under-reports); and once, for the
16K plan, the ``tracemalloc`` peak (numpy and Python allocations only), the figure issue 12
quotes.

    python benchmarks/scale.py [--quick] [--repeat 2] [--plot docs/scale.png]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from seqpack.cli.memory import PeakMemory  # noqa: E402
from seqpack.cost import CostModel  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.schedulers import get_scheduler  # noqa: E402
from seqpack.stats import StepStats  # noqa: E402

CAPACITY = 16384
COST = CostModel(24576.0, 1.0)
N_SWEEP = [65_536, 262_144, 1_048_576, 4_194_304]
DP_SWEEP = [64, 256, 1024, 4096, 16_384, 65_536]
PER_REPLICA = 64
# "balanced" here runs locality (the default, locality="auto", turns it off for these
# token-id samples: they plan as the "locality off" figures).
LOCAL = {"locality": True}
MOVED_SEEDS = 3
GOAL_SECONDS, GOAL_RATIO, GOAL_BYTES, GOAL_MOVED, GOAL_BALANCE = 2.0, 4.0, 1 << 30, 0.5, 1.005
GOAL_LOCALITY = 3.0  # locality on costs at most this many times the plan without it
# The shapes of the locality table: ~1,000 sequences per replica is where home_swaps was a
# cliff (issue "locality is a performance cliff"); 4 per replica, the tightest of the sweeps
# (16,384 homes' setup against a ~60 ms plan); the headline shape for comparison.
LOCALITY_SHAPES = [(1_048_576, 1024), (65_536, 16_384), (1_048_576, 16_384)]


def lengths_for(n: int, seed: int = 0) -> np.ndarray:
    return lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=seed)


def measure(name: str, lengths: np.ndarray, dp: int, repeat: int, sync: str = "lockstep", **options) -> dict:
    """Best-of-``repeat`` wall and CPU time, the largest peak memory, and the step's stats."""
    sched = get_scheduler(name, **options)
    best_wall = best_cpu = float("inf")
    peak = 0
    stats = None
    for _ in range(repeat):
        gc.collect()
        cpu = time.process_time()
        with PeakMemory() as mem:
            schedule = sched.schedule(lengths, dp_size=dp, max_tokens_per_rank=CAPACITY, cost=COST, sync=sync)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, mem.seconds)
        peak = max(peak, mem.bytes or 0)
        if stats is None:
            schedule.validate(lengths, dp_size=dp, max_tokens_per_rank=CAPACITY)
            stats = StepStats.from_schedule(schedule, sched.resolve_cost(COST))
        del schedule
    return {"wall": best_wall, "cpu": best_cpu, "peak": peak, "stats": stats}


def peak_in_child(name: str, n: int, dp: int) -> int:
    """Peak resident bytes of one plan, measured in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, str(n), str(dp)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def child(name: str, n: int, dp: int) -> None:
    sched = get_scheduler(name, **(LOCAL if name == "balanced" else {}))
    sched.schedule(lengths_for(4096), dp_size=64, max_tokens_per_rank=CAPACITY, cost=COST)  # compile first
    lengths = lengths_for(n)
    gc.collect()
    with PeakMemory() as mem:
        sched.schedule(lengths, dp_size=dp, max_tokens_per_rank=CAPACITY, cost=COST)
    print(mem.bytes or 0)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}; {os.cpu_count()} logical CPUs shared with other jobs (numba and BLAS pinned to 1 thread); "
        f"Python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}"
    )


def sweep_table(title: str, key: str, points: list[int], fixed: dict, repeat: int) -> list[dict]:
    print(f"## {title}")
    header = (
        f"{key:>10} {'M':>5} {'balanced wall s':>15} {'cpu s':>7} {'peak MB':>8} {'dp_balanced cpu s':>17} "
        f"{'peak MB':>8} {'ratio':>6} {'replica/LB':>10} {'moved %':>8}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for value in points:
        dp = value if key == "dp" else fixed["dp"]
        n = value if key == "N" else value * PER_REPLICA
        lengths = lengths_for(n)
        bal = measure("balanced", lengths, dp, repeat, **LOCAL)
        ref = measure("dp_balanced", lengths, dp, repeat)
        bal["peak"], ref["peak"] = peak_in_child("balanced", n, dp), peak_in_child("dp_balanced", n, dp)
        st = bal["stats"]
        row = {"x": value, "dp": dp, "n": n, "bal": bal, "ref": ref}
        rows.append(row)
        print(
            f"{value:>10,} {st.num_microbatches:>5} {bal['wall']:>15.2f} {bal['cpu']:>7.2f} "
            f"{bal['peak'] / 2**20:>8.0f} "
            f"{ref['cpu']:>17.2f} {ref['peak'] / 2**20:>8.0f} {bal['cpu'] / ref['cpu']:>6.2f} "
            f"{st.bound_ratio:>10.5f} {100 * st.moved_fraction:>8.1f}",
            flush=True,
        )
    xs = [r["x"] for r in rows]
    big = [r for r in rows if r["bal"]["peak"] >= 16 << 20]  # below that, page granularity is noise
    memory = f"{slope([r['x'] for r in big], [r['bal']['peak'] for r in big]):.2f}" if len(big) > 1 else "n/a"
    print(
        f"slope of CPU time vs {key} (log-log): balanced {slope(xs, [r['bal']['cpu'] for r in rows]):.2f}, "
        f"dp_balanced {slope(xs, [r['ref']['cpu'] for r in rows]):.2f}; of balanced's peak memory (points over "
        f"16 MB): {memory}"
    )
    print()
    return rows


def moved_table(points: list[int], repeat: int) -> dict:
    print(f"## moved tokens vs dp ({PER_REPLICA} sequences per replica)")
    variants = [
        ("lockstep", dict(sync="lockstep", **LOCAL)),
        ("replica", dict(sync="replica", **LOCAL)),
        ("lockstep, locality off", dict(sync="lockstep", locality=False)),
    ]
    header = f"{'dp':>7} " + " ".join(f"{v:>22}" for v, _ in variants) + f" {'dp_balanced':>12}"
    print(
        f"balanced, moved % (worst replica/LB, step time vs locality off under the same sync); mean of "
        f"{MOVED_SEEDS} draws up to dp=4,096, one beyond"
    )
    print(header)
    print("-" * len(header))
    out: dict = {name: [] for name, _ in variants}
    out["dp_balanced"] = []
    out["dp"] = points
    for dp in points:
        seeds = range(MOVED_SEEDS if dp <= 4096 else 1)
        samples: dict = {name: [] for name, _ in variants}
        samples["dp_balanced"] = []
        for seed in seeds:
            lengths = lengths_for(dp * PER_REPLICA, seed=seed + 1)
            off = {}
            for sync in ("lockstep", "replica"):
                off[sync] = measure("balanced", lengths, dp, 1, sync=sync, locality=False)["stats"]
            for name, options in variants:
                st = measure("balanced", lengths, dp, 1, **options)["stats"]
                sync = options["sync"]
                wait = _wait(st, sync) / _wait(off[sync], sync) - 1
                samples[name].append((st.moved_fraction, st.bound_ratio, wait))
            ref = measure("dp_balanced", lengths, dp, 1)["stats"]
            samples["dp_balanced"].append((ref.moved_fraction, ref.bound_ratio, 0.0))
        cells = []
        for name in out:
            if name == "dp":
                continue
            moved, balance, wait = (float(np.mean([v[k] for v in samples[name]])) for k in range(3))
            worst = max(v[1] for v in samples[name])
            out[name].append((moved, worst, wait))
            cells.append(f"{100 * moved:5.1f} ({worst:.4f}, {100 * wait:+.2f}%)")
        print(f"{dp:>7,} " + " ".join(f"{c:>22}" for c in cells[:-1]) + f" {cells[-1][:5]:>12}", flush=True)
    print(
        "step time: the sync's predicted wait (lockstep: sum of round maxima; replica: busiest replica)\n"
        "relative to balanced without locality; locality keeps a plan only within +0.10%."
    )
    print()
    return out


def locality_table(shapes: list[tuple[int, int]], repeat: int) -> list[tuple[str, bool, str]]:
    """Plan CPU time with locality on and off, and their ratio, at each (N, dp) of ``shapes``."""
    print("## locality on vs off")
    header = f"{'N':>10} {'dp':>7} {'on cpu s':>9} {'off cpu s':>9} {'ratio':>6} {'moved % on':>10} {'off':>6}"
    print(header)
    print("-" * len(header))
    checks = []
    for n, dp in shapes:
        lengths = lengths_for(n)
        on = measure("balanced", lengths, dp, repeat, **LOCAL)
        off = measure("balanced", lengths, dp, repeat, locality=False)
        ratio = on["cpu"] / off["cpu"]
        print(
            f"{n:>10,} {dp:>7,} {on['cpu']:>9.2f} {off['cpu']:>9.2f} {ratio:>6.2f} "
            f"{100 * on['stats'].moved_fraction:>10.1f} {100 * off['stats'].moved_fraction:>6.1f}",
            flush=True,
        )
        checks.append(
            (f"{n:,} into {dp:,}: locality on <= {GOAL_LOCALITY}x off (CPU)", ratio <= GOAL_LOCALITY, f"{ratio:.2f}x")
        )
    print()
    return checks


def _wait(st: StepStats, sync: str) -> float:
    if sync == "replica":
        return float(np.max(st.replica_cost))
    return st.round_imbalance * float(np.sum(st.replica_cost)) / st.dp_size


def headline(repeat: int) -> list[tuple[str, bool, str]]:
    """The issue's numbers: 1,048,576 sequences into 16,384 replicas."""
    n, dp = 1_048_576, 16_384
    lengths = lengths_for(n)
    print(f"## the 16K plan: {n:,} sequences into {dp:,} replicas")
    bal = measure("balanced", lengths, dp, repeat, **LOCAL)
    ref = measure("dp_balanced", lengths, dp, repeat)
    off = measure("balanced", lengths, dp, repeat, locality=False)
    bal["peak"], ref["peak"] = peak_in_child("balanced", n, dp), peak_in_child("dp_balanced", n, dp)
    off["peak"] = 0
    sched = get_scheduler("balanced", **LOCAL)
    tracemalloc.start()
    sched.schedule(lengths, dp_size=dp, max_tokens_per_rank=CAPACITY, cost=COST)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    st = bal["stats"]
    for label, m in (("balanced", bal), ("balanced, locality off", off), ("dp_balanced", ref)):
        s = m["stats"]
        peak = f"peak {m['peak'] / 2**20:.0f} MB (resident), " if m["peak"] else ""
        print(
            f"{label:<24} wall {m['wall']:.2f} s, cpu {m['cpu']:.2f} s, {peak}"
            f"{s.num_microbatches} microbatches, replica/LB {s.bound_ratio:.5f}, round imb. {s.round_imbalance:.5f}, "
            f"moved {100 * s.moved_fraction:.1f}%"
        )
    print(f"balanced tracemalloc peak (numpy/Python allocations): {traced / 2**20:.0f} MB")
    print()
    ratio = bal["cpu"] / ref["cpu"]
    return [
        (f"plan {n:,} into {dp:,} in <= {GOAL_SECONDS} s (CPU)", bal["cpu"] <= GOAL_SECONDS, f"{bal['cpu']:.2f} s"),
        (f"<= {GOAL_RATIO}x dp_balanced's CPU time", ratio <= GOAL_RATIO, f"{ratio:.2f}x"),
        ("peak memory <= 1 GB (tracemalloc)", traced <= GOAL_BYTES, f"{traced / 2**20:.0f} MB"),
        ("peak memory <= 1 GB (resident)", bal["peak"] <= GOAL_BYTES, f"{bal['peak'] / 2**20:.0f} MB"),
        (f"replica/LB <= {GOAL_BALANCE}", st.bound_ratio <= GOAL_BALANCE, f"{st.bound_ratio:.5f}"),
    ]


def plot(path: str, n_rows: list[dict], dp_rows: list[dict], moved: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    panels = (
        (axes[0], n_rows, "x", "sequences N (dp = 16,384)"),
        (axes[1], dp_rows, "x", f"replicas dp ({PER_REPLICA} sequences each)"),
    )
    for ax, rows, key, label in panels:
        xs = [r[key] for r in rows]
        ax.loglog(xs, [r["bal"]["cpu"] for r in rows], "o-", label="balanced")
        ax.loglog(xs, [r["ref"]["cpu"] for r in rows], "s--", label="dp_balanced")
        ax.set_xlabel(label)
        ax.set_ylabel("plan CPU time (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax = axes[2]
    for rows, label, marker in ((n_rows, "N sweep (dp = 16,384)", "o-"), (dp_rows, "dp sweep (64 per replica)", "s-")):
        shown = [r for r in rows if r["bal"]["peak"] >= 1 << 20]  # below a MB: page granularity
        ax.loglog([r["n"] for r in shown], [r["bal"]["peak"] / 2**20 for r in shown], marker, label=label)
    ax.set_xlabel("sequences N")
    ax.set_ylabel("balanced peak resident MB")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax = axes[3]
    styles = (
        ("lockstep", "o-"),
        ("replica", "s-"),
        ("lockstep, locality off", "x--"),
        ("dp_balanced", "d:"),
    )
    for name, style in styles:
        ax.semilogx(moved["dp"], [100 * m for m, _, _ in moved[name]], style, label=name)
    ax.axhline(100 * GOAL_MOVED, color="grey", lw=0.8)
    ax.set_xlabel(f"replicas dp ({PER_REPLICA} sequences each)")
    ax.set_ylabel("tokens moved by the exchange (%)")
    ax.set_ylim(0, 105)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sweeps (a smoke test)")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per point (best is kept)")
    parser.add_argument("--plot", default="docs/scale.png", help="where to draw the figure ('' for none)")
    parser.add_argument("--child", nargs=3, metavar=("SCHEDULER", "N", "DP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    n_sweep, dp_sweep = N_SWEEP, DP_SWEEP
    if args.quick:
        n_sweep, dp_sweep = N_SWEEP[:2], DP_SWEEP[:3]
    for name in ("balanced", "dp_balanced"):  # compile numba kernels before timing
        get_scheduler(name).schedule(lengths_for(4096), dp_size=64, max_tokens_per_rank=CAPACITY, cost=COST)
    print(f"# machine: {machine()}")
    print(f"# workload: lognormal lengths (mean 4096, sigma 1.1, 1024..8192), capacity {CAPACITY}, cost 24576*s + s^2")
    print(f"# best of {args.repeat}; peak = resident memory above the start of the call")
    print()
    checks = [] if args.quick else headline(args.repeat)
    n_rows = sweep_table("plan vs N (dp = 16,384)", "N", n_sweep, {"dp": 16_384}, args.repeat)
    dp_rows = sweep_table(f"plan vs dp ({PER_REPLICA} sequences per replica)", "dp", dp_sweep, {}, args.repeat)
    checks += locality_table(LOCALITY_SHAPES[:1] if args.quick else LOCALITY_SHAPES, args.repeat)
    moved = moved_table(dp_sweep, 1)
    for dp in (64, 16_384):
        if dp in moved["dp"]:
            k = moved["dp"].index(dp)
            for name in ("lockstep", "replica"):
                frac, balance, _ = moved[name][k]
                ok = frac <= GOAL_MOVED and balance <= GOAL_BALANCE
                label = f"dp={dp:,} {name}: moved <= 50% with replica/LB <= 1.005"
                checks.append((label, ok, f"{100 * frac:.1f}%, {balance:.4f}"))
    if args.plot:
        plot(args.plot, n_rows, dp_rows, moved)
    print("targets")
    for label, ok, value in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
