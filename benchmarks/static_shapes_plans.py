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

``--ablate`` measures instead what each part of ``static_shapes_by_cost``'s search buys
(benchmarks/results/static_shapes_ladder.txt): the search re-run (monkeypatched, the
product has no switches) with one part off at a time, on sample steps of each seed of
``--sample-seeds`` (``--sample-steps`` each), and the kept ladder's mean predicted step
time on the measured steps (seeds 0..steps-1, held out) against the whole search's:

* ``-even_final``: evenly spaced buckets not tried as a ladder of their own;
* ``-even_start``: nor as a start of ``FixedPlans.descend``;
* ``-descend``: the least-padding ladder (``ladder_for``) as fitted, not improved for the
  predicted step time (``FixedPlans.descend``);
* ``-refits``: ``refits=0`` (the first fitted ladder, no re-plans);
* ``-one``: one bucket (the capacity) not a candidate of its own.

    python benchmarks/static_shapes_plans.py --ablate [--sample-seeds 100,200] [--sample-steps 3]
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
from collections.abc import Callable  # noqa: E402
from types import ModuleType  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.cost import CostModel, model_preset  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402
from seqpack.schedulers import bucket_ladder, get_scheduler, predicted_step_time, static_shapes_by_cost  # noqa: E402
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


PARTS = ("even_final", "even_start", "descend", "refits", "one")  # --ablate: each switched off alone


def ablated_search(off: str | None) -> Callable[..., StaticShapes]:
    """``bucket_ladder._search`` with the part ``off`` switched off (None: the whole search,
    which :func:`ablate` checks against the product's pick)."""

    def search(evaluate, *, buckets: int, unit: int, top: int, refits: int) -> StaticShapes:
        best, best_time, fixed = evaluate((top,))
        if off == "one":
            best, best_time = None, float("inf")
        tried = {(top,)}
        even = bucket_ladder.even_ladder(buckets, unit, top)
        starts = [] if off == "even_start" else [even]
        for _ in range((0 if off == "refits" else refits) + 1):
            ladder = bucket_ladder.ladder_for(fixed.tokens, buckets=buckets, unit=unit, top=top)
            if off != "descend":
                ladder = fixed.descend([ladder, *starts])
            starts = []
            if ladder in tried:
                break
            tried.add(ladder)
            shapes, mean, fixed = evaluate(ladder)
            if mean < best_time:
                best, best_time = shapes, mean
        if off != "even_final" and even not in tried:
            shapes, mean, _ = evaluate(even)
            if mean < best_time:
                best, best_time = shapes, mean
        return best if best is not None else evaluate((top,))[0]

    return search


def _cached(search: Callable[..., StaticShapes], planned: dict, saved: list[float]) -> Callable[..., StaticShapes]:
    """``search`` with ``evaluate`` answered from ``planned`` (ladder -> (answer, CPU s)) where
    a variant planned the ladder already; ``saved[0]`` sums the CPU seconds so answered."""

    def patched(evaluate, **kw):  # noqa: ANN001, ANN003, ANN202
        def once(ladder: tuple[int, ...]):  # noqa: ANN202
            if ladder in planned:
                saved[0] += planned[ladder][1]
            else:
                start = time.process_time()
                answer = evaluate(ladder)
                planned[ladder] = (answer, time.process_time() - start)
            return planned[ladder][0]

        return search(once, **kw)

    return patched


def ablate(steps: int, model: str, quick: bool, seeds: list[int], sample_steps: int) -> list[dict[str, object]]:
    """Per workload, sync, bucket count (4, 8) and sample seed: the held-out mean predicted
    step time of the ladder each variant keeps, and its search's CPU seconds (re-plans of a
    ladder another variant planned already are counted at their first cost)."""
    bench = _schedulers_benchmark()
    cost = model_preset(model).cost_model()
    workloads = bench.WORKLOADS
    if quick:
        workloads = [dataclasses.replace(wl, sequences=wl.sequences // 16, dp=wl.dp // 16) for wl in workloads]
    rows: list[dict[str, object]] = []
    for wl in workloads:
        pm = 2 * wl.cp if wl.cp > 1 else 1
        measured = [step_lengths(wl, seed) for seed in range(steps)]
        samples = {s: [step_lengths(wl, s + k) for k in range(sample_steps)] for s in seeds}
        slots = most_sequences(wl, measured + [x for v in samples.values() for x in v], cost) + 2
        for sync, (seed, sample) in ((y, x) for y in SYNCS for x in samples.items()):
            limits = dict(
                max_sequences=slots, max_tokens_per_rank=wl.max_tokens_per_rank, dp_size=wl.dp, cp_size=wl.cp,
                pad_multiple=pm, cost=cost, sync=sync,
            )  # fmt: skip
            planned: dict[tuple[int, ...], tuple[object, float]] = {}  # ladder -> (evaluate's answer, CPU s)
            held: dict[tuple[int, ...], float] = {}
            for buckets in (4, 8):
                for off in (None, *PARTS):
                    saved = [0.0]
                    original, bucket_ladder._search = (
                        bucket_ladder._search,
                        _cached(ablated_search(off), planned, saved),
                    )
                    try:
                        start = time.process_time()
                        shapes = static_shapes_by_cost(sample, buckets=buckets, **limits)  # type: ignore[arg-type]
                        seconds = time.process_time() - start + saved[0]
                    finally:
                        bucket_ladder._search = original
                    ladder = shapes.token_buckets
                    assert isinstance(ladder, tuple)
                    if off is None:  # the replica of the search is the product's
                        assert ladder == static_shapes_by_cost(sample, buckets=buckets, **limits).token_buckets  # type: ignore[arg-type]
                    if ladder not in held:
                        held[ladder] = evaluate(wl, measured, shapes, cost, sync)["time"]
                    variant = f"-{off}" if off else "full"
                    rows.append(
                        dict(workload=wl.name, sync=sync, buckets=buckets, seed=seed, variant=variant, ladder=ladder,
                             time=held[ladder], seconds=seconds)
                    )  # fmt: skip
    return rows


def ablation_report(rows: list[dict[str, object]]) -> None:
    """Print ``rows`` (:func:`ablate`): each variant's held-out step time against the whole
    search's (+: slower without the part, what the part buys), then per part the most it buys."""
    variants = [f"-{p}" for p in PARTS]
    full = {(r["workload"], r["sync"], r["buckets"], r["seed"]): r for r in rows if r["variant"] == "full"}
    header = f"{'workload':<16} {'sync':<9} {'b':>2} {'seed':>5} {'full ladder':<26}" + "".join(
        f"{v:>12}" for v in variants
    )
    print(header)
    print("-" * len(header))
    gains: dict[str, list[float]] = {v: [] for v in ["full", *variants]}
    seconds: dict[str, list[float]] = {v: [] for v in gains}
    for key, base in full.items():
        cells = ""
        for r in rows:
            if (r["workload"], r["sync"], r["buckets"], r["seed"]) == key:
                gain = float(r["time"]) / float(base["time"]) - 1  # type: ignore[arg-type]
                gains[str(r["variant"])].append(gain)
                seconds[str(r["variant"])].append(float(r["seconds"]))  # type: ignore[arg-type]
                cells += "" if r["variant"] == "full" else f"{gain:>+12.3%}"
        ladder = base["ladder"]
        shown = ",".join(map(str, ladder)) if len(ladder) <= 3 else f"{ladder[0]},...,{ladder[-1]} ({len(ladder)})"  # type: ignore[arg-type]
        print(f"{key[0]:<16} {key[1]:<9} {key[2]:>2} {key[3]:>5} {shown:<26}{cells}")
    print()
    print(f"{'variant':<14} {'buys at most':>12} {'at least':>9} {'mean':>8} {'rows >= 0.5%':>12} {'search CPU s':>12}")
    for v in gains:
        g = gains[v]
        print(
            f"{v:<14} {max(g):>+12.3%} {min(g):>+9.3%} {float(np.mean(g)):>+8.3%} "
            f"{sum(x >= 0.005 for x in g):>5} of {len(g):<4} {float(np.mean(seconds[v])):>12.3f}"
        )
    print()
    print("+x%: the variant's kept ladder predicts x% slower held-out steps than the whole search's: the part buys x%.")
    print("search CPU s: mean per call, re-plans counted at their first cost (planning the sample steps per ladder).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="steps per workload (seeds 0..steps-1; by cost: 100..)")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--quick", action="store_true", help="1 step, workloads at 1/16 of their size")
    parser.add_argument("--ablate", action="store_true", help="what each part of static_shapes_by_cost buys")
    parser.add_argument("--sample-seeds", default="100", help="--ablate: first seeds of the sample steps")
    parser.add_argument("--sample-steps", type=int, default=3, help="--ablate: sample steps per seed")
    args = parser.parse_args(argv)
    steps = 1 if args.quick else args.steps
    print(f"# machine: {_schedulers_benchmark().machine()}")
    print(f"# cost: {args.model} training FLOPs; scheduler balanced; {steps} step(s) per workload, mean")
    if args.quick:
        print("# --quick: workloads at 1/16 of their sequences and replicas")
    if args.ablate:
        seeds = [int(s) for s in args.sample_seeds.split(",")]
        print(f"# --ablate: static_shapes_by_cost on {args.sample_steps} sample step(s) from each seed of {seeds}")
        print()
        ablation_report(ablate(steps, args.model, args.quick, seeds, args.sample_steps))
        return 0
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
