"""Dynamic vs static CP, measured: a tiny hybrid LM trained on gloo CPU ranks, same data.

``R`` processes (gloo, one torch thread each) form one ``dp=1 x cp=R`` mesh; DP rank 0's
data (all ``R`` ranks read it, as CP ranks do) has a long tail: a lognormal body of short
sequences and a few up to ``R`` ranks' capacity. Two runs train ``TinyHybridLM`` (attention +
Mamba2, fp32, torch reference kernels) from the same weights on the same samples, taking
turns step by step so that the machine's noise falls on both:

* **static CP**: ``cp=R`` for every microbatch (what a run must size for its longest
  sequence): the ``balanced`` scheduler, every sequence padded to ``2R`` and sharded over all
  ranks, the model on the CP group;
* **dynamic CP**: ``PackingConfig(dynamic_cp=True)`` on the same mesh: per round the R ranks
  form groups; short sequences run alone, long ones on as many ranks as pay.

Before training, every rank times forward+backward of packs of equal-length sequences on CP
groups of every power-of-2 size (all groups of a size at once, as in a round) and the six
coefficients of the group cost (:class:`~seqpack.cost.CostModel`: compute, CP ring) are
fitted to those times (``nnls_fit`` of ``group_features``): both planners use this
measured cost (static CP its ``CostModel.at(R)``). A step's time is the slowest rank's, from
``next()`` (plan, exchange, pack) to after the gradient all-reduce.

    python benchmarks/dynamic_cp_gloo.py [--ranks 4] [--steps 6] [--out benchmarks/results/dynamic_cp_gloo.txt]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seqpack.collective.cp_groups import new_cp_groups
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.cost import CostModel, group_features
from seqpack.cost.fit import nnls_fit
from seqpack.loader import Step, wrap_data_iterator
from seqpack.schedulers import predicted_step_time
from seqpack.thd import pack_sequences
from seqpack.thd.cp import shard_for_cp
from seqpack.topology import Topology

CFG = TinyConfig(vocab_size=256, d_model=64, pattern="AMAM", num_heads=4, num_kv_heads=2, d_state=16, mamba_headdim=16)


def long_tail(rng: np.random.Generator, count: int, capacity: int, ranks: int) -> list[int]:
    """Lognormal body (mean ~capacity/5, 16..capacity) and 1 in 12 from a Pareto tail up to
    what all ranks hold."""
    body = np.clip(rng.lognormal(np.log(capacity / 8), 1.0, count), 16, capacity).astype(int)
    tail = rng.random(count) < 1 / 12
    body[tail] = np.clip(capacity * (1 + rng.pareto(1.2, int(tail.sum()))), capacity, ranks * capacity - 64)
    return [int(v) for v in body]


def fit_group_cost(topology: Topology, capacity: int, repeats: int = 3) -> CostModel:
    """Time packs on groups of every power-of-2 size (all blocks of a size busy at once) and
    fit the group cost's six coefficients; identical on every rank (rank 0's fit, broadcast)."""
    ranks = topology.cp_size
    groups = new_cp_groups(topology)
    model = TinyHybridLM(CFG)
    gen = torch.Generator().manual_seed(0)
    rows, times = [], []
    size = 1
    while size <= ranks:
        for length in (64, 256, capacity * size // 2, capacity * size):
            count = max(1, capacity * size // length)
            lengths = [length] * count
            pack = pack_sequences(
                [{"input_ids": torch.randint(0, CFG.vocab_size, (n,), generator=gen)} for n in lengths],
                pad_multiple=2 * size if size > 1 else 1,
            )
            start = groups.plane_rank // size * size
            batch = pack if size == 1 else shard_for_cp(pack, size, groups.plane_rank - start)
            if size > 1:
                batch = dataclasses.replace(batch, cp_group=groups.group(start, size))
            best = np.inf
            for _ in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                loss, _ = model.loss_sum(batch)
                loss.backward()
                elapsed = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best = min(best, float(elapsed))
            padded = np.array(lengths, dtype=np.float64)
            rows.append((size, padded.sum(), (padded * padded).sum()))
            times.append(best)
        size *= 2
    sizes, s, ss = (np.array(col) for col in zip(*rows, strict=True))
    features = group_features(sizes, s, ss, np.zeros(len(rows), dtype=bool))
    coef = torch.tensor(nnls_fit(features, np.array(times)), dtype=torch.float64)
    dist.broadcast(coef, src=0)
    return CostModel.from_group_coefficients(coef.numpy(), ranks_per_node=ranks)


class Run:
    """One mode's model, optimizer and iterator."""

    def __init__(self, name: str, topology: Topology, data: list, capacity: int, per_step: int, cost: CostModel):
        self.name = name
        dynamic = name == "dynamic CP"
        torch.manual_seed(0)
        self.model = TinyHybridLM(CFG, cp_group=None if dynamic else topology.group("cp"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        self.cost = cost
        options = {"dynamic_cp": True, "cost": cost} if dynamic else {"cost": cost.at(topology.cp_size)}
        self.steps = wrap_data_iterator(
            iter(data), topology, samples_per_rank=per_step, max_tokens_per_rank=capacity, prefetch=0,
            sync="lockstep", **options,
        )  # fmt: skip
        self.times: list[float] = []
        self.losses: list[float] = []
        self.rows: list[tuple[int, int, float, float]] = []  # (microbatches, real tokens, predicted s, loader s)

    def _compute(self, step: Step) -> tuple[float, torch.Tensor]:
        """Forward + backward of this rank's microbatches and the gradient all-reduce: the
        slowest rank's seconds, and the step's summed loss."""
        dist.barrier()
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for batch in step.microbatches:
            loss_sum, _ = self.model.loss_sum(batch)
            (loss_sum / step.num_loss_tokens).backward()
            total = total + loss_sum.detach()
        for p in self.model.parameters():  # every token ran on exactly one rank: SUM
            dist.all_reduce(p.grad)
        elapsed = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed), total

    def train_step(self, repeats: int) -> None:
        """One step: the loader's ``next()`` once, then the best of ``repeats`` runs of the
        step's forward+backward (the same microbatches: a loaded machine's noise only ever
        adds time), then the optimizer."""
        dist.barrier()
        t0 = time.perf_counter()
        step = next(self.steps)
        loader = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(loader, op=dist.ReduceOp.MAX)
        runs = [self._compute(step) for _ in range(repeats)]
        total = runs[-1][1]
        self.optimizer.step()
        dist.all_reduce(total)
        self.times.append(float(loader) + min(seconds for seconds, _ in runs))
        self.losses.append(float(total) / step.num_loss_tokens)
        if self.name == "dynamic CP":
            predicted = float(step.stats.predicted_step_time or 0.0)
        else:
            predicted = predicted_step_time(step.schedule, self.cost.at(step.schedule.cp_size), sync="lockstep")
        self.rows.append((step.num_microbatches, step.stats.real_tokens, predicted, float(loader)))


def worker(rank: int, world: int, store_path: str, args: argparse.Namespace, out: mp.Queue) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        topology = Topology.from_device_mesh(init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "cp")))
        cost = fit_group_cost(topology, args.capacity)
        rng = np.random.default_rng(args.seed)
        steps = args.steps + 1  # the first is a warm-up
        lengths = long_tail(rng, steps * args.per_step, args.capacity, world)
        data = [{"input_ids": torch.from_numpy(rng.integers(0, CFG.vocab_size, n))} for n in lengths]
        runs = [Run(name, topology, data, args.capacity, args.per_step, cost) for name in ("static CP", "dynamic CP")]
        for _ in range(steps):
            for run in runs:
                run.train_step(args.repeats)
        if rank == 0:
            load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
            out.put({"cost": cost, "runs": [(r.name, r.times, r.losses, r.rows) for r in runs], "load": load})
    finally:
        dist.destroy_process_group()


def report(result: dict, args: argparse.Namespace) -> str:
    cost = result["cost"]
    k, a, b, step, token, _ = cost.group_coefficients(1)
    lines = [
        f"dynamic vs static CP on gloo: {args.ranks} CPU ranks (1 torch thread each) on {os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
        f"TinyHybridLM {CFG.pattern} d_model={CFG.d_model}, fp32; capacity {args.capacity} tokens per rank; "
        f"{args.per_step} sequences per step (lognormal body, 1 in 12 up to {args.ranks}x capacity); "
        f"{args.steps} measured steps after 1 warm-up, modes alternating; a step's time: its loader next() plus the "
        f"best of {args.repeats} runs of its forward+backward and gradient all-reduce (slowest rank)",
        f"measured group cost: {k * 1e3:.2f} ms + {a * 1e6:.3f} us*S/c + {b * 1e9:.4f} ns*SS/c "
        f"+ (c-1) * ({step * 1e3:.2f} ms + {token * 1e6:.3f} us*S/c)",
        "",
        f"{'mode':<11} {'step s (mean)':>13} {'min':>7} {'max':>7} {'loader s':>8} {'mbs':>5} {'real tok/s':>11} "
        f"{'predicted s':>11} {'first loss':>11}",
    ]
    means = {}
    for name, times, losses, rows in result["runs"]:
        t = np.array(times[1:])
        tokens = sum(r[1] for r in rows[1:])
        predicted = np.mean([r[2] for r in rows[1:]])
        mbs = np.mean([r[0] for r in rows[1:]])
        loader = np.mean([r[3] for r in rows[1:]])
        means[name] = t.mean()
        lines.append(
            f"{name:<11} {t.mean():>13.3f} {t.min():>7.3f} {t.max():>7.3f} {loader:>8.3f} {mbs:>5.1f} "
            f"{tokens / t.sum():>11,.0f} {predicted:>11.3f} {losses[0]:>11.6f}"
        )
    per_step = " | ".join(
        f"{a:.2f} vs {b:.2f}" for a, b in zip(result["runs"][0][1], result["runs"][1][1], strict=True)
    )
    lines.append(f"per step, static vs dynamic (the first is the warm-up): {per_step}")
    static, dynamic = (np.array(run[1][1:]) for run in result["runs"])
    ratios = static / dynamic
    speedup = means["static CP"] / means["dynamic CP"]
    loss_gap = abs(result["runs"][0][2][0] - result["runs"][1][2][0])
    lines += [
        "",
        f"dynamic CP speedup (static / dynamic mean step time): {speedup:.2f}x; per step: median "
        f"{np.median(ratios):.2f}x, range {ratios.min():.2f}-{ratios.max():.2f}x; first-step losses differ by "
        f"{loss_gap:.1e} (same weights, same data)",
        f"machine load average while it ran: {result['load']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--per-step", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each step's forward+backward (best kept)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, args.ranks, store, args, queue)) for r in range(args.ranks)]
        for p in procs:
            p.start()
        result = queue.get(timeout=3600)
        for p in procs:
            p.join(timeout=120)
    text = report(result, args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
