"""seqpack's packing scheduler against Megatron-LM's own ``DpBalancedScheduler``, both as
Megatron's ``wrap_data_iterator`` calls them: ``get_groups_and_subsamples`` on a step's
``(global_id, padded_seq_len)`` pairs. Run in the Megatron venv (tests/interop/megatron_venv.sh)::

    ../megatron-venv/bin/python benchmarks/megatron_compare.py [--seeds 2] [--quick]

Workloads: benchmarks/schedulers.py's (the first, ``sft-lognormal``, is Megatron's mock SFT
config), each DP rank reading the same number of sequences as there (16; 128 for
``pretrain-pareto``), so a step holds ``dp`` times that; dp 8, 64 and 1,024; the VPP multiple
(``microbatch_group_size_per_vp_stage``) 1, 2 and 4. Lengths are padded to ``2 * cp`` first
(Megatron schedules padded lengths).

Per row, mean over seeds: ``M``, microbatches per DP rank; ``rounds``, the sum of per-round
maxima over the sum of per-round means of Llama-3-8B training FLOPs (what a lockstep step
waits for); ``replica``, the busiest replica's total over the mean; ``step``, seqpack's
predicted step time over Megatron's under ``sync="replica"`` (Megatron's DDP: the slowest
replica's total; ``lockstep`` in brackets); ``ms``, planning time of one step (median of 3,
one core). ``assert``: Megatron's scheduler failed ("Not enough samples to move").

``--scaling``: plan time against the step it must hide behind, dp 1,024 to 16,384 (one plan
a row, seed 0): Megatron's and seqpack's plan ms and the predicted step of one Llama-3-8B
replica (its training FLOPs under ``sync="replica"`` over ``cp`` H100s at 40% of bf16 peak).

``--overlap``: Megatron's own ``wrap_data_iterator`` on one gloo rank (CUDA pointed at the
CPU as in tests/interop/test_megatron_dist.py), a sleep standing in for the GPU's step:
the time each call blocks the loop with ``install(prefetch=0)`` and ``install(prefetch=1)``.
Then what a plan running beside the training loop costs that loop's thread (a loop waking
every millisecond, as one launching kernels): the plan on a thread, and in a process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402

import numpy as np  # noqa: E402
from megatron.core.datasets.data_schedule import DpBalancedScheduler  # noqa: E402

from seqpack.cost import INTERCONNECTS, model_preset  # noqa: E402
from seqpack.interop.megatron import SeqpackPackingScheduler  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402
from seqpack.schedulers import Schedule, predicted_step_time  # noqa: E402
from seqpack.stats import StepStats  # noqa: E402
from seqpack.thd import padded_lengths  # noqa: E402


def _schedulers_benchmark() -> ModuleType:
    """benchmarks/schedulers.py (its workloads and machine line), loaded by path (its
    dataclasses resolve their annotations through ``sys.modules``)."""
    name = "seqpack_benchmark_schedulers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("schedulers.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


WORKLOADS, machine = _schedulers_benchmark().WORKLOADS, _schedulers_benchmark().machine


def as_schedule(groups: list[list[list[int]]], lengths: np.ndarray, dp: int, cp: int, capacity: int) -> Schedule:
    """Megatron's groups (rank ``j`` is CP rank ``j % cp`` of replica ``j // cp``) as a seqpack plan."""
    rounds = [[np.array(m[d * cp], dtype=np.int64) for d in range(dp)] for m in groups]
    return Schedule.from_assignment(
        rounds,
        lengths=lengths,
        original_lengths=lengths,
        dp_size=dp,
        cp_size=cp,
        max_tokens_per_rank=capacity,
        pad_multiple=1,
    )


def plan(make, lengths: np.ndarray, repeats: int) -> tuple[list[list[list[int]]], float]:
    pairs = list(enumerate(lengths.tolist()))
    times, groups = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        groups = make().get_groups_and_subsamples(pairs)
        times.append(time.perf_counter() - start)
    return groups, statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="sft-lognormal at dp 8 only, one seed")
    parser.add_argument("--scaling", action="store_true", help="plan time against step time, dp 1,024 to 16,384")
    parser.add_argument("--overlap", action="store_true", help="wrap_data_iterator's blocking, prefetch 0 and 1")
    args = parser.parse_args()
    if args.overlap:
        return overlap(quick=args.quick)
    if args.scaling:
        return scaling(quick=args.quick)
    cost = model_preset("llama3-8b").cost_model()
    SeqpackPackingScheduler(8, 1, 2, None).get_groups_and_subsamples([(0, 1), (1, 2)])  # load the kernels
    print(f"# machine: {machine()}")
    print(
        f"# {'workload':<16} {'dp':>5} {'VPP':>3} | {'Megatron M':>10} {'rounds':>6} {'replica':>7} {'ms':>7}", end=""
    )
    print(f" | {'seqpack M':>9} {'rounds':>6} {'replica':>7} {'step':>13} {'ms':>7}")
    for wl in WORKLOADS[:1] if args.quick else WORKLOADS:
        per_rank = wl.sequences // wl.dp
        for dp in (8,) if args.quick else (8, 64, 1024):
            for multiple in (1, 2, 4):
                rows: dict[str, list[tuple[float, ...]]] = {"megatron": [], "seqpack": []}
                failed = 0
                for seed in range(1 if args.quick else args.seeds):
                    params = dict(wl.params) | ({} if wl.dist == "constant" else {"seed": seed})
                    raw = generate_lengths(wl.dist, dp * per_rank, **params)
                    lengths = padded_lengths(raw, 2 * wl.cp if wl.cp > 1 else 1)
                    g = None if multiple == 1 else multiple
                    repeats = 1 if dp * per_rank > 20_000 else 3
                    makers = {
                        "megatron": (DpBalancedScheduler, {}),
                        "seqpack": (SeqpackPackingScheduler, {"cost": cost}),
                    }
                    times = {}
                    for name, (cls, options) in makers.items():
                        sizes = (wl.max_tokens_per_rank, wl.cp, dp, g)
                        try:
                            groups, seconds = plan(lambda cls=cls, o=options, s=sizes: cls(*s, **o), lengths, repeats)
                        except AssertionError:
                            failed += 1
                            continue
                        schedule = as_schedule(groups, lengths, dp, wl.cp, wl.max_tokens_per_rank)
                        stats = StepStats.from_schedule(schedule, cost)
                        times[name] = [predicted_step_time(schedule, cost, sync=s) for s in ("replica", "lockstep")]
                        row = [len(groups), stats.round_imbalance, stats.imbalance, 1e3 * seconds]
                        rows[name].append((*row, *times[name]))
                    if len(times) == 2:
                        rows["seqpack"][-1] += tuple(
                            a / b for a, b in zip(times["seqpack"], times["megatron"], strict=True)
                        )
                print_row(wl.name, dp, multiple, rows, failed)
    return 0


def print_row(workload: str, dp: int, multiple: int, rows: dict[str, list[tuple[float, ...]]], failed: int) -> None:
    mean = {k: np.mean(np.array([r[:4] for r in v]), axis=0) if v else None for k, v in rows.items()}
    theirs, ours = mean["megatron"], mean["seqpack"]
    left = "assert" if theirs is None else f"{theirs[0]:>10.1f} {theirs[1]:>6.3f} {theirs[2]:>7.3f} {theirs[3]:>7.2f}"
    ratios = [r[6:] for r in rows["seqpack"] if len(r) == 8]
    step = "-" if not ratios else "{:.3f} ({:.3f})".format(*np.mean(np.array(ratios), axis=0))
    note = f"  Megatron asserted on {failed} seed(s)" if failed and theirs is not None else ""
    print(f"  {workload:<16} {dp:>5} {multiple:>3} | {left:>33}", end="")
    print(f" | {ours[0]:>9.1f} {ours[1]:>6.3f} {ours[2]:>7.3f} {step:>13} {ours[3]:>7.2f}{note}")


H100_SUSTAINED = INTERCONNECTS["h100-nvlink-ib400"].device_flops  # FLOP/s: bf16 dense peak at its assumed MFU


def scaling(quick: bool) -> int:
    cost = model_preset("llama3-8b").cost_model()
    SeqpackPackingScheduler(8, 1, 2, None).get_groups_and_subsamples([(0, 1), (1, 2)])  # load the kernels
    print(f"# machine: {machine()}")
    print(f"# {'workload':<16} {'dp':>6} {'N':>8} | {'Megatron ms':>11} {'seqpack ms':>10}", end="")
    print(f" | {'step s':>6} {'plan/step':>9}")
    for wl in WORKLOADS[:1] if quick else WORKLOADS:
        for dp in (8, 64) if quick else (1024, 4096, 16384):
            n = dp * (wl.sequences // wl.dp)
            params = dict(wl.params) | ({} if wl.dist == "constant" else {"seed": 0})
            lengths = padded_lengths(generate_lengths(wl.dist, n, **params), 2 * wl.cp if wl.cp > 1 else 1)
            sizes = (wl.max_tokens_per_rank, wl.cp, dp, None)
            theirs = plan(lambda s=sizes: DpBalancedScheduler(*s), lengths, 1)[1]
            groups, ours = plan(lambda s=sizes: SeqpackPackingScheduler(*s, cost=cost), lengths, 1)
            schedule = as_schedule(groups, lengths, dp, wl.cp, wl.max_tokens_per_rank)
            step = predicted_step_time(schedule, cost, sync="replica") / (wl.cp * H100_SUSTAINED)
            print(f"  {wl.name:<16} {dp:>6} {n:>8} | {1e3 * theirs:>11.1f} {1e3 * ours:>10.1f} | {step:>6.2f}", end="")
            print(f" {ours / step:>9.3f}", flush=True)
    return 0


def overlap(quick: bool) -> int:
    """Megatron's loop on one rank: ``wrap_data_iterator``, then a sleep for the GPU's step."""
    import datetime
    import logging
    import re
    from types import SimpleNamespace

    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule
    from megatron.core.rerun_state_machine import RerunDataIterator

    from seqpack.interop.megatron import install

    n, per_item, capacity, train_s, steps = (2048, 64, 16384, 0.05, 6) if quick else (16384, 64, 65536, 0.5, 8)
    shape = dict(min_seq_len=64, max_seq_len=4096, mean_seq_len=512, sigma=1.1, seed=0)
    raw = generate_lengths("lognormal", n * steps, **shape)
    base = torch.arange(int(raw.max()))
    samples = [
        {"tokens": base[:k], "labels": base[:k], "loss_mask": torch.ones(k), "position_ids": base[:k]}
        | {"padded_seq_len": torch.tensor([k]), "original_seq_len": torch.tensor([k])}
        for k in raw.tolist()
    ]
    config = SimpleNamespace(
        max_seqlen_per_dp_cp_rank=capacity,
        sequence_packing_scheduler="dp_balanced",
        microbatch_group_size_per_vp_stage=None,
        virtual_pipeline_model_parallel_size=None,
    )
    saved = torch.cuda.current_device, torch.Tensor.cuda
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(60))
    ps.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    print(f"# machine: {machine()}")
    print(f"# {n} sequences a step (lognormal 64-4096, mean 512) in items of {per_item}, capacity {capacity},")
    print(f"# the GPU's step a {1e3 * train_s:.0f} ms sleep; ms per wrap_data_iterator call, median of steps 4-{steps}")
    megatrons = data_schedule.scheduler_map[data_schedule.PackingSchedulerEnum.DP_BALANCED]
    alone = plan(lambda: SeqpackPackingScheduler(capacity, 1, 1, None), raw[:n], 3)[1]
    print(f"  seqpack's plan alone (get_groups_and_subsamples): {1e3 * alone:.1f} ms")
    waits: list[float] = []  # ms the step waited for the plan made ahead (seqpack.interop.megatron's debug log)
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda r: waits.extend(float(w) for w in re.findall(r"waited ([0-9.]+)", r.getMessage()))  # type: ignore[method-assign]
    logging.getLogger("seqpack.interop.megatron").addHandler(handler)
    logging.getLogger("seqpack.interop.megatron").setLevel(logging.DEBUG)
    for name, options in [("Megatron's dp_balanced", None), ("seqpack, prefetch=0", 0), ("seqpack, prefetch=1", 1)]:
        if options is not None:
            install(prefetch=options)
        items = [samples[i : i + per_item] for i in range(0, len(samples), per_item)]
        source = RerunDataIterator(iter(items))
        blocked = []
        for _ in range(steps):
            start = time.perf_counter()
            new, m, *_ = data_schedule.wrap_data_iterator(source, config, n // per_item)
            packs = [next(new) for _ in range(m)]
            blocked.append(time.perf_counter() - start)
            time.sleep(train_s)
        data_schedule.scheduler_map[data_schedule.PackingSchedulerEnum.DP_BALANCED] = megatrons
        wait = f", {statistics.median(waits):.2f} ms of it waiting for the plan" if options == 1 else ""
        print(f"  {name:<24} {statistics.median(blocked[3:]) * 1e3:>8.1f} ms blocked ({len(packs)} packs{wait})")
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    torch.cuda.current_device, torch.Tensor.cuda = saved
    return beside_the_loop(quick)


def beside_the_loop(quick: bool) -> int:
    """The loop's thread wakes every millisecond while one plan runs on a thread, then in a
    process: how long it was held off (wake-ups later than 2 ms, summed) and the longest wait."""
    import threading

    from seqpack.interop.megatron import _Planner  # prefetch=1's planning process

    cost = model_preset("llama3-8b").cost_model()
    name, dp = ("sft-lognormal", 64) if quick else ("pretrain-pareto", 1024)
    wl = next(w for w in WORKLOADS if w.name == name)
    lengths = generate_lengths(wl.dist, dp * (wl.sequences // wl.dp), **(dict(wl.params) | {"seed": 0}))
    scheduler = SeqpackPackingScheduler(wl.max_tokens_per_rank, wl.cp, dp, None, cost=cost)
    sizes = dict(max_seqlen_per_dp_cp_rank=wl.max_tokens_per_rank, cp_size=wl.cp, dp_size=dp, cost=cost)
    print(f"# {name}, dp {dp}, {len(lengths)} sequences: a plan beside a loop waking every ms")
    process = _Planner()
    process.submit(lengths, scheduler.options, sizes).result()  # started, kernels loaded
    pairs = list(enumerate(lengths.tolist()))
    for where in ("thread", "process"):
        done = threading.Event()
        if where == "thread":
            threading.Thread(target=lambda d=done: (scheduler.get_groups_and_subsamples(pairs), d.set())).start()
        else:
            future = process.submit(lengths, scheduler.options, sizes)
            future.add_done_callback(lambda _, d=done: d.set())
        start = last = time.perf_counter()
        gaps = []
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        if where == "process":
            future.result()
        held = sum(g for g in gaps if g > 0.002)
        print(f"  plan on a {where:<7} {1e3 * (last - start):>7.1f} ms;", end="")
        print(f" the loop held off {1e3 * held:>6.1f} ms in all, {1e3 * max(gaps):.1f} ms at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
