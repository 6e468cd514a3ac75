"""Wrapper cost per step on 4 gloo ranks (CPU), split by phase, and exchange traffic.

For each layout (dp=4; dp=2 x cp=2; dp=2 x tp=2 with TP broadcast; pp=2 x dp=2) and each
scheduler, runs ``wrap_data_iterator`` over pre-generated lognormal SFT samples and prints
milliseconds per step per 1000 samples for gather / schedule / exchange / pack+shard /
broadcast (mean over ranks, median over steps), and the bytes the exchange
sent as a fraction of the step's payload (tokens of all samples packed this step).

``round_robin`` is a benchmark-only scheduler that sends sample ``k`` to replica ``k % dp``:
about ``(dp-1)/dp`` of the payload moves, a high-traffic reference; ``empty`` moves nothing.

    python benchmarks/wrapper.py [--samples-per-rank 250] [--steps 6] [--mean-len 512]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
LAYOUTS = {
    "dp4": ((4,), ("dp",)),
    "dp2xcp2": ((2, 2), ("dp", "cp")),
    "dp2xtp2": ((2, 2), ("dp", "tp")),
    "pp2xdp2": ((2, 2), ("pp", "dp")),
}
PHASES = ("gather", "schedule", "exchange", "pack", "broadcast", "wait")


def _round_robin():
    from seqpack.schedulers import EmptyScheduler, GridScheduler

    class RoundRobin(GridScheduler):
        name = "round_robin"

        def _plan(self, request):
            # "empty" packs every sample where it sits: tell it sample k sits on replica k % dp.
            replica = np.arange(request.num_sequences, dtype=np.int64) % request.dp_size
            return EmptyScheduler()._plan(dataclasses.replace(request, origin=replica))

    return RoundRobin()


def _samples(rank: int, count: int, args) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng([args.seed, rank])
    sigma = 1.1
    mu = np.log(args.mean_len) - sigma**2 / 2
    lengths = np.clip(rng.lognormal(mu, sigma, size=count), 16, args.max_len).astype(np.int64)
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    return [{"input_ids": torch.randint(1, 32000, (int(n),), generator=g)} for n in lengths]


def _worker(rank: int, store_path: str, args, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from seqpack.loader import wrap_data_iterator
    from seqpack.schedulers import available_schedulers
    from seqpack.topology import Topology

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD)
    schedulers = [s for s in available_schedulers() if s in args.schedulers] + ["round_robin"]
    for name in args.layouts:
        shape, dims = LAYOUTS[name]
        topo = Topology.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=dims))
        reads = topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage)
        samples = _samples(topo.dp_rank, args.samples_per_rank * (args.steps + 1), args) if reads else None
        for scheduler in schedulers:
            it = wrap_data_iterator(
                iter(samples) if reads else None,
                topo,
                samples_per_rank=args.samples_per_rank,
                max_tokens_per_rank=args.max_tokens // topo.cp_size,
                scheduler=_round_robin() if scheduler == "round_robin" else scheduler,
                prefetch=0,  # the synchronous wrapper: next() does all of the step's work (see prefetch.py)
            )
            records = []
            for _ in range(args.steps + 1):
                dist.barrier()  # untimed: each step starts together, so a phase does not absorb the last step's skew
                cpu = time.process_time()
                step = next(it)
                step.timings["cpu"] = time.process_time() - cpu  # all threads of this rank, immune to time-sharing
                records.append((step.timings, step.exchange_bytes, step.stats.num_sequences, step.num_microbatches))
            results.put((rank, name, scheduler, records[1:]))  # the first step warms up
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples-per-rank", type=int, default=250, help="samples each DP rank reads per step")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mean-len", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens per microbatch before CP split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--schedulers", nargs="+", default=["balanced", "dp_balanced", "empty"])
    args = parser.parse_args()

    from seqpack.schedulers import available_schedulers

    schedulers = [s for s in available_schedulers() if s in args.schedulers] + ["round_robin"]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    got: dict = {}
    with tempfile.TemporaryDirectory(prefix="seqpack-bench-") as tmp:
        procs = [ctx.Process(target=_worker, args=(r, os.path.join(tmp, "store"), args, results)) for r in range(WORLD)]
        start = time.perf_counter()
        for p in procs:
            p.start()
        for _ in range(WORLD * len(args.layouts) * len(schedulers)):
            rank, name, scheduler, records = results.get(timeout=900)
            got[(rank, name, scheduler)] = records
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - start

    print(
        f"# seqpack wrapper benchmark: {WORLD} gloo ranks on {os.cpu_count()} CPU cores ({platform.machine()}), "
        f"torch {torch.__version__}, 1 thread per rank"
    )
    print(
        f"# {args.samples_per_rank} samples per DP rank per step, lognormal lengths (mean {args.mean_len}, "
        f"clip 16..{args.max_len}), {args.max_tokens} tokens per microbatch, median of {args.steps} steps "
        f"of the mean over ranks, wall {elapsed:.0f} s"
    )
    header = ["layout", "scheduler", "samples/step", "mbs", *PHASES, "total", "slowest rank", "cpu", "sent/payload"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.layouts:
        for scheduler in sorted({k[2] for k in got if k[1] == name}, key=lambda s: (s == "round_robin", s)):
            per_rank = [got[(r, name, scheduler)] for r in range(WORLD)]
            steps = len(per_rank[0])
            samples = per_rank[0][0][2]
            scale = 1000.0 / samples  # per 1000 samples
            cells = []
            for phase in PHASES:
                mean = [statistics.fmean(per_rank[r][k][0].get(phase, 0.0) for r in range(WORLD)) for k in range(steps)]
                cells.append(f"{1e3 * statistics.median(mean) * scale:.2f}")
            wrapper = [
                statistics.fmean(
                    per_rank[r][k][0]["total"] - per_rank[r][k][0].get("read", 0.0) - per_rank[r][k][0].get("wait", 0.0)
                    for r in range(WORLD)
                )
                for k in range(steps)
            ]
            slowest = [max(per_rank[r][k][0]["total"] for r in range(WORLD)) for k in range(steps)]
            cpu = [statistics.fmean(per_rank[r][k][0]["cpu"] for r in range(WORLD)) for k in range(steps)]
            sent = sum(per_rank[r][k][1].get("sent", 0) for r in range(WORLD) for k in range(steps))
            payload = sum(per_rank[r][k][1].get("payload", 0) for r in range(WORLD) for k in range(steps))
            mbs = statistics.median(per_rank[0][k][3] for k in range(steps))
            print(
                f"| {name} | {scheduler} | {samples} | {mbs:g} | "
                + " | ".join(cells)
                + f" | {1e3 * statistics.median(wrapper) * scale:.2f} | {1e3 * statistics.median(slowest) * scale:.2f}"
                + f" | {1e3 * statistics.median(cpu) * scale:.2f}"
                + f" | {sent / payload if payload else 0:.3f} |"
            )
    print(
        "# times in ms per step per 1000 samples of the step, mean over the 4 ranks (ranks that skip a phase "
        "count 0); pack = pack + CP shard; broadcast = TP + PP sends, receives, decoding and the PP agreement; "
        "wait = broadcast receivers waiting for their source; total = wrapper work without reading the data "
        "and without wait; slowest rank = the step's longest next() including both; cpu = CPU time of next() "
        "(all threads, mean over ranks): the cost without the time-sharing of 4 ranks on this machine's cores"
    )
    print("# sent/payload = bytes the exchange put on the wire / bytes of the samples packed this step")


if __name__ == "__main__":
    main()
