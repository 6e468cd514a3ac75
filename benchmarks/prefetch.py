"""Prefetch: how much of the wrapper's time a training loop still waits for, gloo ranks (CPU; 4 by default).

Each rank runs a training stand-in: per step ``next(steps)``, then C ms of work in the main
thread, then a small all-reduce on the default group (the gradient sync that keeps ranks in
lockstep; it runs while the wrapper's thread uses its own groups). Measured per step:
``blocked`` (time inside ``next()``) and the step time (``next()`` + work + all-reduce),
for prefetch 0, 1 and 2 and for C from 0.5x to 4x the synchronous wrapper's time W.

Two stand-ins:
  compute: torch matmuls on one thread per rank (release the GIL, but use a core).
  sleep:   the host waits (like a host waiting for its GPU), releasing the core.
On a machine with fewer cores than ranks x 2 the compute stand-in and the wrapper's thread
compete for cores: prefetch can only hide what spare cores can absorb. The sleep stand-in shows
the overlap itself. Ratios are compared within one run (same machine state).

    python benchmarks/prefetch.py [--layout dp4|dp2|dp2xcp2|dp2xtp2] [--samples-per-rank 250] [--factors 0.5 1 2 4]

``--layout dp2`` runs one rank per core of a 2-core machine (the wrapper thread then has a
core while the host waits).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from wrapper import _samples  # benchmarks/wrapper.py: the same lognormal samples per rank

LAYOUTS = {
    "dp4": ((4,), ("dp",)),
    "dp2": ((2,), ("dp",)),
    "dp2xcp2": ((2, 2), ("dp", "cp")),
    "dp2xtp2": ((2, 2), ("dp", "tp")),
}


class StandIn:
    """C ms of "training" per step: matmuls (compute) or a wait (sleep)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.a = torch.randn(192, 192)
        self.per_iteration = 0.0

    def calibrate(self) -> None:
        # Every rank calibrates at the same time, so the rate includes the time-sharing of
        # the cores the measured runs will see.
        dist.barrier()
        iterations = 400
        tick = time.perf_counter()
        self._matmuls(iterations)
        self.per_iteration = (time.perf_counter() - tick) / iterations
        rate = torch.tensor([self.per_iteration])
        dist.all_reduce(rate)  # one rate for all ranks: the same work everywhere
        self.per_iteration = float(rate) / dist.get_world_size()

    def _matmuls(self, n: int) -> None:
        x = self.a
        for _ in range(n):
            x = torch.tanh(x @ self.a)

    def run(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.kind == "sleep":
            time.sleep(seconds)
        else:
            self._matmuls(max(1, round(seconds / self.per_iteration)))


def _loop(it, standin: StandIn, seconds: float, steps: int, skip: int) -> list[tuple[float, float]]:
    """(blocked, step time) of ``steps`` steps after ``skip`` unmeasured ones."""
    out = []
    grad = torch.ones(16)
    for index in range(skip + steps):
        tick = time.perf_counter()
        if it is not None:
            next(it)
        got = time.perf_counter()
        standin.run(seconds)
        dist.all_reduce(grad)  # the model's collective, on the default group, main thread
        done = time.perf_counter()
        if index >= skip:
            out.append((got - tick, done - tick))
    return out


def _worker(rank: int, store_path: str, args, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from seqpack.loader import wrap_data_iterator
    from seqpack.topology import Topology

    torch.set_num_threads(1)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    world = math.prod(LAYOUTS[args.layout][0])
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    shape, dims = LAYOUTS[args.layout]
    topo = Topology.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=dims))
    reads = topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage)
    # Each segment runs `skip` unmeasured steps (an iterator that idled has its next k steps
    # ready: they would flatter prefetch) and `args.segment` measured ones.
    skip = max(args.depths) + 1
    per_iterator = args.rounds * (skip + args.segment) + max(args.depths) + 2
    samples = _samples(topo.dp_rank, args.samples_per_rank * per_iterator, args) if reads else None

    def wrapped(k: int):
        return wrap_data_iterator(
            iter(samples) if reads else None,
            topo,
            samples_per_rank=args.samples_per_rank,
            max_tokens_per_rank=args.max_tokens // topo.cp_size,
            scheduler=args.scheduler,
            prefetch=k,
        )

    # What the wrapper's own groups cost at construction (prefetch 1 creates them; 0 does not).
    build: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(3):
        for k in (0, 1):
            dist.barrier()
            tick = time.perf_counter()
            it = wrapped(k)
            build[k].append(time.perf_counter() - tick)
            it.close()
    slowest = torch.tensor([statistics.median(build[0]), statistics.median(build[1])])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)

    standins = {kind: StandIn(kind) for kind in args.standins}
    for standin in standins.values():
        if standin.kind == "compute":
            standin.calibrate()
    # W: the synchronous wrapper's time per step (prefetch 0, no work between steps).
    with wrapped(0) as it:
        sync = _loop(it, standins[args.standins[0]], 0.0, args.rounds * args.segment, skip)
    w = torch.tensor([statistics.median(b for b, _ in sync)])
    dist.all_reduce(w)
    wrapper_seconds = float(w) / dist.get_world_size()
    records: dict = {"W": wrapper_seconds, "build": slowest.tolist()}
    for kind, standin in standins.items():
        for factor in args.factors:
            seconds = factor * wrapper_seconds
            # The configurations of one C take turns, a segment each, so that the load of this
            # shared machine drifting over time weighs on all of them alike.
            iterators = {k: wrapped(k) for k in args.depths}
            for key in ["alone", *args.depths]:
                records[(kind, factor, key)] = []
            for _ in range(args.rounds):
                records[(kind, factor, "alone")] += _loop(None, standin, seconds, args.segment, skip)
                for k, it in iterators.items():
                    records[(kind, factor, k)] += _loop(it, standin, seconds, args.segment, skip)
            for it in iterators.values():
                it.close()
    results.put((rank, records))
    dist.barrier()
    dist.destroy_process_group()


def _mean_over_ranks(per_rank: list[dict], key, column: int) -> float:
    """Median over steps of the mean over ranks."""
    steps = len(per_rank[0][key])
    return statistics.median(statistics.fmean(r[key][s][column] for r in per_rank) for s in range(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="dp4", choices=list(LAYOUTS))
    parser.add_argument("--samples-per-rank", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=6, help="turns every configuration of one C takes")
    parser.add_argument("--segment", type=int, default=3, help="measured steps per turn")
    parser.add_argument("--mean-len", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens per microbatch before the CP split")
    parser.add_argument("--scheduler", default="balanced")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0], help="C / W")
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 1, 2], help="prefetch values")
    parser.add_argument("--standins", nargs="+", default=["compute", "sleep"], choices=["compute", "sleep"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval in every rank (Python's default: 0.005 s)",
    )
    args = parser.parse_args()
    world = math.prod(LAYOUTS[args.layout][0])

    load_before = os.getloadavg()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="seqpack-bench-") as tmp:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(tmp, "store"), args, results)) for r in range(world)]
        start = time.perf_counter()
        for p in procs:
            p.start()
        got = dict(results.get(timeout=1800) for _ in range(world))
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - start
    per_rank = [got[r] for r in range(world)]
    w = per_rank[0]["W"]

    print(
        f"# seqpack prefetch benchmark: {world} gloo ranks ({args.layout}) on {os.cpu_count()} CPU cores "
        f"({platform.machine()}), torch {torch.__version__}, 1 torch thread per rank + the wrapper's thread"
    )
    print(
        f"# {args.samples_per_rank} samples per DP rank per step (lognormal, mean {args.mean_len}, clip "
        f"16..{args.max_len}), scheduler {args.scheduler}, {args.max_tokens} tokens per microbatch; "
        f"{args.rounds} turns of {args.segment} measured steps per configuration, configurations of one C "
        f"interleaved; GIL switch interval "
        f"{args.switch_interval if args.switch_interval is not None else sys.getswitchinterval()} s; "
        f"wall {elapsed:.0f} s"
    )
    load = os.getloadavg()
    print(
        f"# load average (1 min) of this shared machine: {load_before[0]:.1f} before, {load[0]:.1f} after "
        f"(this benchmark's own {world} ranks add about {world})"
    )
    build = per_rank[0]["build"]
    print(
        f"# construction, slowest rank, median of 3: prefetch 0 {1e3 * build[0]:.1f} ms; prefetch 1 "
        f"{1e3 * build[1]:.1f} ms (creates the wrapper's own gloo group per axis)"
    )
    print(f"# W = synchronous wrapper time per step (prefetch 0, blocked in next(), mean over ranks): {1e3 * w:.1f} ms")
    cores = os.cpu_count() or 1
    if cores < 2 * world:
        print(
            f"# NOTE: {world} ranks x (training thread + wrapper thread) on {cores} cores: the machine is "
            "oversubscribed; the compute stand-in competes with the wrapper's thread for cores"
        )
    header = ["stand-in", "C/W", "C ms", "alone ms", "prefetch", "blocked ms", "blocked/W", "step ms", "step/alone"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    verdicts = []
    for kind in args.standins:
        for factor in args.factors:
            alone = _mean_over_ranks(per_rank, (kind, factor, "alone"), 1)
            for k in args.depths:
                key = (kind, factor, k)
                blocked = _mean_over_ranks(per_rank, key, 0)
                step = _mean_over_ranks(per_rank, key, 1)
                print(
                    f"| {kind} | {factor:g} | {1e3 * factor * w:.1f} | {1e3 * alone:.1f} | {k} | "
                    f"{1e3 * blocked:.2f} | {blocked / w:.3f} | {1e3 * step:.1f} | {step / alone:.3f} |"
                )
                if factor >= 2 and k > 0:
                    ok = blocked <= 0.10 * w and step <= 1.05 * alone
                    verdicts.append(
                        f"{kind} C={factor:g}W prefetch={k}: blocked {blocked / w:.1%} of W "
                        f"(target <= 10%), step {step / alone:.3f}x alone (target <= 1.05): "
                        f"{'met' if ok else 'NOT met'}"
                    )
    print(
        "# blocked = time inside next(); step = next() + C of work + one all-reduce on the default group; "
        "alone = the same loop without the wrapper; median over steps of the mean over ranks"
    )
    for line in verdicts:
        print("# " + line)


if __name__ == "__main__":
    main()
