"""Bucketed plans against unbucketed ones: what fixed pack shapes cost in predicted step time.

On the workloads of ``benchmarks/schedulers.py`` (imported from there), ``balanced`` plans
every step under each sync (``lockstep``, ``replica``) with

* no buckets (every pack its own padded size: what eager training runs);
* buckets chosen by cost (:func:`seqpack.schedulers.static_shapes_by_cost`, 4 and 8 buckets,
  chosen on held-out steps of the workload: seeds 100, 101, ...), and 8 chosen on the measured
  steps themselves (``in-sample``: what the choice reaches when the sample is the data);
* the multiples ladder ``capacity/8, 2*capacity/8, ..., capacity``
  (:meth:`~seqpack.thd.StaticShapes.multiples_of`; Megatron's
  ``--pad-packed-seq-alignment capacity/8``);
* one bucket, the capacity (``token_buckets="capacity"``; Megatron's
  ``--pad-packed-seq-alignment max``),

every bucketed plan with ``static_shapes`` (bucket padding priced, ``max_sequences`` the most
sequences an unbucketed microbatch of the workload holds plus one: a limit that does not bind,
so that the rows measure the buckets). Reported per workload and sync: the mean predicted step
time (Llama-3-8B training FLOPs, :func:`~seqpack.schedulers.predicted_step_time` with the
bucket padding's linear cost), its ratio to the unbucketed plans', and the padding fraction
(tokens the packs hold that are not real: sequence padding plus bucket padding).

    python benchmarks/static_shapes_plans.py [--steps 3] [--quick] [--model llama3-8b]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from types import ModuleType  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.cost import CostModel, model_preset  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402
from seqpack.schedulers import get_scheduler, predicted_step_time, static_shapes_by_cost  # noqa: E402
from seqpack.stats import StepStats  # noqa: E402
from seqpack.thd import StaticShapes  # noqa: E402

SYNCS = ("lockstep", "replica")


def _schedulers_benchmark() -> ModuleType:
    """``benchmarks/schedulers.py`` (its workloads and machine line), loaded by path."""
    name = "seqpack_benchmark_schedulers"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name("schedulers.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def step_lengths(wl, seed: int) -> np.ndarray:
    params = dict(wl.params)
    if wl.dist != "constant":
        params["seed"] = seed
    return generate_lengths(wl.dist, wl.sequences, **params)


def evaluate(wl, steps: list[np.ndarray], shapes: StaticShapes | None, cost: CostModel, sync: str) -> dict[str, float]:
    """Mean predicted step time and padding fraction of ``balanced``'s plans of ``steps``."""
    pm = 2 * wl.cp if wl.cp > 1 else 1
    scheduler = get_scheduler("balanced")
    times, real, held, micro = [], 0, 0, []
    for lengths in steps:
        plan = scheduler.schedule(
            lengths, dp_size=wl.dp, cp_size=wl.cp, max_tokens_per_rank=wl.max_tokens_per_rank, pad_multiple=pm,
            cost=cost, sync=sync, static_shapes=shapes,
        )  # fmt: skip
        plan.validate(lengths, static_shapes=shapes)
        stats = StepStats.from_schedule(plan, cost, sync=sync, static_shapes=shapes)
        times.append(predicted_step_time(plan, cost, sync=sync, static_shapes=shapes))
        real += stats.real_tokens
        held += stats.padded_tokens + stats.bucket_tokens
        micro.append(plan.num_microbatches)
    return {"time": float(np.mean(times)), "pad": 1.0 - real / held, "microbatches": float(np.mean(micro))}


def most_sequences(wl, steps: list[np.ndarray], cost: CostModel) -> int:
    """The most sequences any unbucketed microbatch of ``steps`` holds (under either sync)."""
    pm = 2 * wl.cp if wl.cp > 1 else 1
    most = 1
    for lengths in steps:
        for sync in SYNCS:
            plan = get_scheduler("balanced").schedule(
                lengths, dp_size=wl.dp, cp_size=wl.cp, max_tokens_per_rank=wl.max_tokens_per_rank, pad_multiple=pm,
                cost=cost, sync=sync,
            )  # fmt: skip
            most = max(most, int(plan.group_counts.max(initial=0)))
    return most


def run(steps: int, model: str, quick: bool) -> list[dict[str, object]]:
    bench = _schedulers_benchmark()
    cost = model_preset(model).cost_model()
    workloads = bench.WORKLOADS
    if quick:  # toy sizes: 1/16 of the sequences and replicas
        workloads = [dataclasses.replace(wl, sequences=wl.sequences // 16, dp=wl.dp // 16) for wl in workloads]
    rows: list[dict[str, object]] = []
    for wl in workloads:
        pm = 2 * wl.cp if wl.cp > 1 else 1
        capacity = wl.max_tokens_per_rank * wl.cp
        measured = [step_lengths(wl, seed) for seed in range(steps)]
        sample = [step_lengths(wl, 100 + seed) for seed in range(steps)]
        slots = most_sequences(wl, measured + sample, cost) + 2  # + the tail's slot (append_dummy_seq)
        for sync in SYNCS:
            start = time.perf_counter()
            limits = dict(
                max_sequences=slots, max_tokens_per_rank=wl.max_tokens_per_rank, dp_size=wl.dp, cp_size=wl.cp,
                pad_multiple=pm, cost=cost, sync=sync,
            )  # fmt: skip
            configs: list[tuple[str, StaticShapes | None]] = [
                ("unbucketed", None),
                ("by cost, 4", static_shapes_by_cost(sample, buckets=4, **limits)),  # type: ignore[arg-type]
                ("by cost, 8", static_shapes_by_cost(sample, buckets=8, **limits)),  # type: ignore[arg-type]
                ("in-sample, 8", static_shapes_by_cost(measured, buckets=8, **limits)),  # type: ignore[arg-type]
                ("multiples c/8", StaticShapes.multiples_of(capacity // 8, capacity, max_sequences=slots)),
                ("capacity", StaticShapes(token_buckets="capacity", max_sequences=slots)),
            ]
            base = None
            for label, shapes in configs:
                result = evaluate(wl, measured, shapes, cost, sync)
                base = result["time"] if base is None else base
                buckets = "-" if shapes is None else _shown(shapes, capacity)
                rows.append(
                    dict(
                        workload=wl.name,
                        sync=sync,
                        config=label,
                        buckets=buckets,
                        ratio=result["time"] / base,
                        **result,
                    )
                )
            rows.append(dict(workload=wl.name, sync=sync, config="(seconds)", seconds=time.perf_counter() - start))
    return rows


def _shown(shapes: StaticShapes, capacity: int) -> str:
    ladder = shapes.buckets(capacity)
    return ",".join(str(b) for b in ladder) if len(ladder) <= 4 else f"{ladder[0]},...,{ladder[-1]} ({len(ladder)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="steps per workload (seeds 0..steps-1; by cost: 100..)")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--quick", action="store_true", help="1 step, workloads at 1/16 of their size")
    args = parser.parse_args(argv)
    steps = 1 if args.quick else args.steps
    print(f"# machine: {_schedulers_benchmark().machine()}")
    print(f"# cost: {args.model} training FLOPs; scheduler balanced; {steps} step(s) per workload, mean")
    if args.quick:
        print("# --quick: workloads at 1/16 of their sequences and replicas")
    print()
    report(run(steps, args.model, args.quick))
    return 0


def report(rows: list[dict[str, object]]) -> None:
    """Print ``rows`` (:func:`run`) as the table."""
    header = (
        f"{'workload':<16} {'sync':<9} {'buckets':<14} {'ladder':<28} {'step (FLOPs)':>13} {'x unbucketed':>12} "
        f"{'padding':>8} {'microbatches':>12}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row["config"] == "(seconds)":
            print(f"{'':<16} {'':<9} (planned in {row['seconds']:.1f} s)")
            continue
        print(
            f"{row['workload']:<16} {row['sync']:<9} {row['config']:<14} {row['buckets']!s:<28} {row['time']:>13.4e} "
            f"{row['ratio']:>12.4f} {row['pad']:>8.2%} {row['microbatches']:>12.1f}"
        )
    print()
    print("step: mean predicted step time, bucket padding priced at the model's linear (per-token) cost.")
    print("padding: share of the tokens the packs hold that are not real (sequence padding + bucket padding).")


if __name__ == "__main__":
    raise SystemExit(main())
