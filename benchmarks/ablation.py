"""Ablation of ``balanced``: what each stage of the planner buys (issue 30, item 5).

Every stage of the plan seqpack runs (:data:`seqpack.schedulers.balanced.stages.DEFAULT`)
is taken out in turn (:data:`ABLATIONS`: the same composition without it, or with a plainer
stage in its place), and locality as a whole (``locality=False``), against the full planner
(``DEFAULT``, ``locality=True``), on:

* every workload of ``benchmarks/schedulers.py`` (``WORKLOADS``: 4,096 or 32,768 sequences
  into 256 replicas, Llama-3-8B training FLOPs), under each sync: ``"lockstep"`` (the default) and ``"replica"``;
* ``benchmarks/heavy_tail.py``'s heavy tail (4,096 ``128 x (1 + Pareto(1.3))`` lengths into
  32 replicas, ``sync="replica"``, forced microbatch counts 2-6 and the free count) and its
  verl-like tight batches (25 sequences of 50-90 tokens, capacity 300, at least 4
  microbatches; counted: batches given more microbatches than the fewest that hold them);
* ``benchmarks/scale.py``'s shapes (lognormal, capacity 16,384, ``24576*s + s**2``):
  65,536 and 1,048,576 sequences into 1,024 replicas, 1,048,576 into 16,384.

Besides the stages, one part of a stage: ``-pair_swaps``, the home swaps without their swaps
for a pair (the kernel module copied with ``PAIR_BIN = 1``, so that no bin offers a pair, and
swapped in for the stage's call: the product has no switch for it).

Reported per variant: predicted step time under the sync the plan is made for
(:func:`seqpack.schedulers.objective.step_objective`) over its
lower bound (lockstep: :func:`~seqpack.schedulers.objective.round_sum_lower_bound`;
replica: ``max(total / dp, costliest sequence)``; constants at the fewest microbatches),
both ratios, microbatches, tokens moved by the exchange, and plan CPU time
(``time.process_time``, best of ``--repeats``, variants interleaved). The summary gives per
stage the change of predicted step time when it is off (mean over the steps of each
workload; positive: the stage makes steps faster), the microbatches it saves and its plan
time, and the verdict of the rule: a stage that improves no workload by 0.5% and guarantees
nothing (capacity, fewest microbatches) goes.

    python benchmarks/ablation.py [--steps 3] [--repeats 3] [--verl 2000] [--no-16k] [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.cost import CostModel, model_preset  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402
from seqpack.schedulers import Schedule, _kernels, get_scheduler  # noqa: E402
from seqpack.schedulers.balanced import exact  # noqa: E402
from seqpack.schedulers.balanced.exact import FOUND, bin_lower_bound, pack_bins  # noqa: E402
from seqpack.schedulers.balanced.locality import home_swaps, per_replica  # noqa: E402
from seqpack.schedulers.balanced.replicas import replica_first_stage  # noqa: E402
from seqpack.schedulers.balanced.rounds import fill_order  # noqa: E402
from seqpack.schedulers.balanced.stages import DEFAULT, Stages, exact_search, first_fit, worst_fit  # noqa: E402
from seqpack.schedulers.objective import microbatch_costs, round_sum_lower_bound, step_objective  # noqa: E402
from seqpack.stats import StepStats  # noqa: E402
from seqpack.thd import padded_lengths  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ablation.txt"
GAIN = 0.005  # the rule: a stage must improve some workload's predicted step time by 0.5%


def sibling(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (its workloads are this benchmark's)."""
    spec = importlib.util.spec_from_file_location(f"seqpack_benchmark_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _mean_targets(sorted_costs: np.ndarray, dp_size: int, num_rounds: int) -> np.ndarray:
    """Every bin aims at the mean (no per-round targets)."""
    return np.full(num_rounds, float(sorted_costs.sum()) / max(dp_size * num_rounds, 1))


def _item_search_only(seqs: Any, targets: np.ndarray, num_rounds: int) -> Any:
    """The exact search without bin completion: with ``FEW_PER_BIN`` 0 no packing has few
    sequences per bin, so ``pack_bins`` runs the item search alone, with its whole budget."""
    saved, exact.FEW_PER_BIN = exact.FEW_PER_BIN, 0
    try:
        return exact_search(seqs, targets, num_rounds)
    finally:
        exact.FEW_PER_BIN = saved


_PAIRS_OFF: list[Any] = []  # the kernel without pair swaps, once loaded


def home_swaps_without_pairs(step: Any) -> Any:
    """The home swaps stage, its kernel copied with ``PAIR_BIN = 1``: no bin offers a pair,
    so that no sequence comes home by a swap with two (the rest of the kernel unchanged)."""
    if not _PAIRS_OFF:
        source = pathlib.Path(_kernels.__file__).with_name("locality_swaps.py").read_text()
        copy, count = re.subn(r"^PAIR_BIN = \d+", "PAIR_BIN = 1", source, flags=re.M)
        assert count == 1, "locality_swaps.PAIR_BIN not found"
        path = pathlib.Path(tempfile.gettempdir()) / "seqpack_ablation" / "locality_swaps_pairs_off.py"
        path.parent.mkdir(exist_ok=True)
        if not path.is_file() or path.read_text() != copy:  # unchanged: numba's cache of it holds
            path.write_text(copy)
        spec = importlib.util.spec_from_file_location("seqpack_ablation_locality_swaps_pairs_off", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _PAIRS_OFF.append(module.home_swaps)
    saved = _kernels.home_swaps
    _kernels.home_swaps = _PAIRS_OFF[0]
    try:
        return home_swaps(step)
    finally:
        _kernels.home_swaps = saved


def _without(stages: Stages, field: str, *dropped: Any) -> Stages:
    return dataclasses.replace(stages, **{field: tuple(s for s in getattr(stages, field) if s not in dropped)})


def _swap(stages: Stages, field: str, old: Any, new: Any) -> Stages:
    return dataclasses.replace(stages, **{field: tuple(new if s is old else s for s in getattr(stages, field))})


# stage -> the composition without it (applied to any composition, so that they stack).
ABLATIONS: dict[str, Callable[[Stages], Stages]] = {
    "round_targets": lambda s: dataclasses.replace(s, targets=_mean_targets),
    "token_rules": lambda s: _without(s, "bin_rules", worst_fit, first_fit),
    "exact_search": lambda s: _without(s, "bin_rules", exact_search),
    "bin_completion": lambda s: _swap(s, "bin_rules", exact_search, _item_search_only),
    "replica_first": lambda s: _without(s, "refine", replica_first_stage),
    "more_rounds": lambda s: dataclasses.replace(s, count_search=lambda plan, *_: plan),
    "origin_order": lambda s: dataclasses.replace(s, fill_order=lambda padded, origin: fill_order(padded, None)),
    "relabel": lambda s: dataclasses.replace(s, relabel=lambda replica_of, *_: replica_of),
    "per_replica": lambda s: _without(s, "locality", per_replica),
    "home_swaps": lambda s: _without(s, "locality", home_swaps),
    "pair_swaps": lambda s: _swap(s, "locality", home_swaps, home_swaps_without_pairs),
}


def composition(off: Sequence[str]) -> Stages:
    """:data:`DEFAULT` without the stages ``off`` (keys of :data:`ABLATIONS`)."""
    stages = DEFAULT
    for name in off:
        stages = ABLATIONS[name](stages)
    return stages


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    off: tuple[str, ...] = ()
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    reference: str = "full"  # what it is compared with


NO_LOCALITY = {"locality": False}
# The stages that keep samples home without locality, also measured where locality is off
# (the default for token-id samples: locality="auto"), against the plan without locality.
HOME_STAGES = ("origin_order", "relabel")
VARIANTS = [
    Variant("full", options={"locality": True}),
    *(Variant(f"-{stage}", (stage,), {"locality": True}) for stage in ABLATIONS),
    Variant("-locality", options=NO_LOCALITY),
    *(Variant(f"-locality-{s}", (s,), NO_LOCALITY, "-locality") for s in HOME_STAGES),
]
LINK = 25e9  # bytes per second and rank of the exchange: 200 Gb/s InfiniBand


@dataclasses.dataclass
class Case:
    """One workload under one sync: the lengths of its steps and how they are planned."""

    group: str  # schedulers.py, heavy tail, verl, scale
    name: str
    sync: str
    steps: list[np.ndarray]
    dp: int
    max_tokens_per_rank: int
    cp: int = 1
    pad_multiple: int = 1
    cost: CostModel | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    repeats: int = 3
    fewest: list[int] | None = None  # the fewest microbatches that hold each step (verl)


@dataclasses.dataclass
class Measured:
    """Per step of a case, for one variant."""

    pred: list[float] = dataclasses.field(default_factory=list)  # under the case's sync
    lockstep: list[float] = dataclasses.field(default_factory=list)  # over its bound
    replica: list[float] = dataclasses.field(default_factory=list)
    ratio: list[float] = dataclasses.field(default_factory=list)  # pred over its bound
    microbatches: list[int] = dataclasses.field(default_factory=list)
    moved: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)  # best of the repeats, seconds


def bounds(lengths: np.ndarray, case: Case, cost: CostModel) -> tuple[float, float]:
    """(lockstep, replica) lower bounds of one step, constants at the fewest microbatches."""
    padded = padded_lengths(lengths, case.pad_multiple)
    costs = cost.cost(padded)
    capacity = case.max_tokens_per_rank * case.cp
    fewest = -(-bin_lower_bound(padded, capacity) // case.dp)
    constants = cost.constant * max(fewest, case.options.get("num_microbatches") or 0)
    replica = max(float(costs.sum()) / case.dp, float(costs.max()))
    return round_sum_lower_bound(padded, costs, case.dp, capacity) + constants, replica + constants


def plan(case: Case, variant: Variant, lengths: np.ndarray) -> tuple[Schedule, float]:
    """One plan of ``lengths`` by ``variant`` and its CPU seconds."""
    sched = get_scheduler("balanced", **{**case.options, **variant.options}, stages=composition(variant.off))
    kwargs: dict[str, Any] = dict(
        dp_size=case.dp,
        cp_size=case.cp,
        max_tokens_per_rank=case.max_tokens_per_rank,
        pad_multiple=case.pad_multiple,
        cost=case.cost,
        sync=case.sync,
    )
    t = time.process_time()
    schedule = sched.schedule(lengths, **kwargs)
    return schedule, time.process_time() - t


def run_case(case: Case, variants: Sequence[Variant]) -> dict[str, Measured]:
    """Every variant on every step of ``case``: quality once, CPU time best of the repeats,
    the variants interleaved (one plan of each in turn) so that load changes hit them alike."""
    cost = get_scheduler("balanced").resolve_cost(case.cost)
    out = {v.name: Measured() for v in variants}
    for k, lengths in enumerate(case.steps):
        lock_bound, replica_bound = bounds(lengths, case, cost)
        best = {v.name: float("inf") for v in variants}
        for rep in range(case.repeats):
            for v in variants:
                schedule, seconds = plan(case, v, lengths)
                best[v.name] = min(best[v.name], seconds)
                if rep:
                    continue
                schedule.validate(
                    lengths, dp_size=case.dp, cp_size=case.cp, max_tokens_per_rank=case.max_tokens_per_rank
                )
                load = microbatch_costs(schedule, cost)
                m = out[v.name]
                lock, replica = step_objective(load, "lockstep"), step_objective(load, "replica")
                m.lockstep.append(lock / lock_bound)
                m.replica.append(replica / replica_bound)
                pred = step_objective(load, case.sync)
                bound = {"lockstep": lock_bound, "replica": replica_bound}[case.sync]
                m.pred.append(pred)
                m.ratio.append(pred / bound)
                m.microbatches.append(schedule.num_microbatches)
                m.moved.append(StepStats.from_schedule(schedule, cost).moved_fraction if case.dp > 1 else 0.0)
        for v in variants:
            out[v.name].cpu.append(best[v.name])
        del k
    return out


def saved_moved(reference: Measured, off: Measured) -> float:
    """Mean over steps of the share of tokens that moves without the stage and not with it."""
    return float(np.mean(off.moved) - np.mean(reference.moved))


def gain(full: Measured, off: Measured) -> float:
    """Mean over steps of how much slower the predicted step is without the stage."""
    return float(np.mean([o / f - 1.0 for f, o in zip(full.pred, off.pred, strict=True)]))


def extra_microbatches(case: Case, m: Measured) -> int:
    """Microbatches over the fewest, summed over the steps (verl), else the steps' total."""
    if case.fewest is not None:
        return sum(int(got > few) for got, few in zip(m.microbatches, case.fewest, strict=True))
    return sum(m.microbatches)


# -- the cases -------------------------------------------------------------------------------


def scheduler_cases(steps: int, repeats: int, quick: bool) -> list[Case]:
    bench = sibling("schedulers")
    cost = model_preset("llama3-8b").cost_model()
    cases = []
    for wl in bench.WORKLOADS:
        if quick:
            wl = dataclasses.replace(wl, sequences=wl.sequences // 16, dp=wl.dp // 16)
        lengths = []
        for seed in range(steps):
            params = dict(wl.params)
            if wl.dist != "constant":
                params["seed"] = seed
            lengths.append(generate_lengths(wl.dist, wl.sequences, **params))
        for sync in ("lockstep", "replica"):
            cases.append(
                Case(
                    "schedulers.py",
                    wl.name,
                    sync,
                    lengths,
                    wl.dp,
                    wl.max_tokens_per_rank,
                    cp=wl.cp,
                    pad_multiple=2 * wl.cp if wl.cp > 1 else 1,
                    cost=cost,
                    repeats=repeats,
                )
            )
    return cases


def heavy_tail_cases(steps: int, repeats: int, verl: int, quick: bool) -> list[Case]:
    ht = sibling("heavy_tail")
    lengths = [ht.heavy_tail(seed) for seed in range(steps)]
    if quick:
        lengths = [x[:1024] for x in lengths]
    cases = []
    for m in (None, 2, 3, 4, 5, 6):
        fits = [x for x in lengths if m is None or int(x.sum()) <= ht.DP * ht.CAPACITY * m]
        if not fits or (quick and m not in (None, 3)):
            continue
        options = {} if m is None else {"num_microbatches": m}
        name = "heavy-tail" if m is None else f"heavy-tail M={m}"
        cases.append(
            Case(
                "heavy tail", name, "replica", fits, ht.DP, ht.CAPACITY, cost=ht.COST, options=options, repeats=repeats
            )
        )
    if verl:
        batches = [ht.verl_lengths(seed) for seed in range(verl)]
        fewest = []
        for x in batches:
            count = max(4, bin_lower_bound(x, 300))
            while pack_bins(x, count, 300, max_work=1_000_000_000)[0] != FOUND:
                count += 1
            fewest.append(count)
        cases.append(
            Case(
                "verl",
                f"verl x{verl}",
                "lockstep",
                batches,
                1,
                300,
                options={"min_microbatches": 4},
                repeats=1,
                fewest=fewest,
            )
        )
    return cases


def scale_shapes(big: bool, quick: bool) -> list[tuple[int, int]]:
    """(sequences, replicas) of the scale cases: 65,536 and 1,048,576 into 1,024, and with
    ``big`` 1,048,576 into 16,384 (``--quick``: 4,096 into 64)."""
    if quick:
        return [(4_096, 64)]
    return [(65_536, 1_024), (1_048_576, 1_024)] + ([(1_048_576, 16_384)] if big else [])


def scale_cases(repeats: int, big: bool, quick: bool) -> list[Case]:
    sc = sibling("scale")
    shapes = scale_shapes(big, quick)
    return [
        Case(
            "scale",
            f"{n:,} into {dp:,}",
            "lockstep",
            [sc.lengths_for(n)],
            dp,
            sc.CAPACITY,
            cost=sc.COST,
            repeats=repeats if n < 1_000_000 else max(2, repeats - 1),
        )
        for n, dp in shapes
    ]


# -- output ----------------------------------------------------------------------------------


def label(case: Case) -> str:
    return f"{case.name} ({case.sync})" if case.group == "schedulers.py" else case.name


def detail(case: Case, results: dict[str, Measured], write: Callable[[str], None]) -> None:
    full = results["full"]
    write(
        f"## {label(case)}: {len(case.steps)} step(s), dp={case.dp}, capacity "
        f"{case.max_tokens_per_rank * case.cp:,}, plans for {case.sync}"
    )
    header = (
        f"{'variant':<24} {'pred/LB':>16} {'lockstep/LB':>11} {'replica/LB':>10} {'vs full':>8} "
        f"{'M':>6} {'moved %':>7} {'cpu ms':>9} {'cpu/full':>8}"
    )
    write(header)
    write("-" * len(header))
    full_cpu = float(np.sum(full.cpu))
    for name, m in results.items():
        cpu = float(np.sum(m.cpu))
        write(
            f"{name:<24} {np.mean(m.ratio):>7.4f} ({max(m.ratio):.4f}) {np.mean(m.lockstep):>11.4f} "
            f"{np.mean(m.replica):>10.4f} {100 * gain(full, m):>+7.2f}% {np.mean(m.microbatches):>6.2f} "
            f"{100 * np.mean(m.moved):>7.1f} {1e3 * cpu / len(m.cpu):>9.2f} {cpu / full_cpu:>8.2f}"
        )
    if case.fewest is not None:
        over = {name: extra_microbatches(case, m) for name, m in results.items()}
        listed = ", ".join(f"{name} {count}" for name, count in over.items() if count != over["full"])
        write(f"batches over the fewest microbatches: full {over['full']}; otherwise the same except: {listed or '-'}")
    write("")


def summary(cases: list[Case], results: list[dict[str, Measured]], write: Callable[[str], None]) -> dict[str, Any]:
    """Per stage: its best gain (where), its worst loss, tokens it keeps home, microbatches
    it saves, plan time."""
    write("## summary: each stage switched off, against the full planner (-locality-*: against -locality)")
    write(
        "gain: how much slower the predicted step is without it (mean over a workload's steps; the largest over\n"
        "workloads, and where); worst: the most it costs anywhere (negative gain); home: the most tokens (points\n"
        "of all tokens) that move without it and stay home with it; fewer M: workloads where it runs fewer\n"
        "microbatches (verl: fewer batches over the fewest); cpu: plan CPU time without it / with it (range over\n"
        f"workloads). Rule: keep a stage that gains >= {100 * GAIN:.1f}% somewhere or guarantees capacity or\n"
        "the fewest microbatches; locality's are judged by the tokens they keep home (locality itself:\n"
        "locality='auto')."
    )
    header = (
        f"{'stage':<24} {'best gain':>9}  {'where':<30} {'worst':>7} {'home':>6}  {'where':<26} "
        f"{'fewer M':<30} {'cpu off/on':>10}"
    )
    write(header)
    write("-" * len(header))
    verdicts: dict[str, Any] = {}
    pairs = list(zip(cases, results, strict=True))
    for v in VARIANTS[1:]:
        ref = v.reference
        gains = [(gain(r[ref], r[v.name]), label(c)) for c, r in pairs]
        best, where = max(gains)
        worst = min(g for g, _ in gains)
        home, home_where = max((saved_moved(r[ref], r[v.name]), label(c)) for c, r in pairs)
        fewer = [label(c) for c, r in pairs if extra_microbatches(c, r[v.name]) > extra_microbatches(c, r[ref])]
        cpu = [float(np.sum(r[v.name].cpu) / np.sum(r[ref].cpu)) for r in results]
        verdicts[v.name] = dict(
            best=best, where=where, worst=worst, home=home, home_where=home_where, fewer=fewer, cpu=(min(cpu), max(cpu))
        )
        shown = ", ".join(fewer[:2]) + (f" +{len(fewer) - 2}" if len(fewer) > 2 else "")
        write(
            f"{v.name:<24} {100 * best:>+8.2f}%  {where:<30} {100 * worst:>+6.2f}% {100 * home:>+5.1f}  "
            f"{home_where if home > 0.0005 else '-':<26} {shown or '-':<30} {min(cpu):>4.2f}-{max(cpu):<4.2f}"
        )
    write("")
    return verdicts


def locality_costs(cases: list[Case], results: list[dict[str, Measured]], write: Callable[[str], None]) -> None:
    """What locality costs (plan CPU per sequence) and saves (tokens kept home per rank), and
    the bytes per token at which the two are equal at :data:`LINK` (the measured break-even,
    beside :func:`seqpack.schedulers.balanced.locality.break_even_bytes_per_token`'s)."""
    from seqpack.schedulers.balanced.locality import break_even_bytes_per_token

    write(f"## locality: plan CPU it adds against the tokens it keeps home, at {LINK / 1e9:g} GB/s per rank")
    header = (
        f"{'workload':<34} {'extra us/seq':>12} {'moved on %':>10} {'off %':>6} {'kept MB/rank @20B':>17} "
        f"{'break-even B/token':>18} {'rule':>9}"
    )
    write(header)
    write("-" * len(header))
    for case, r in zip(cases, results, strict=True):
        if case.dp == 1:
            continue
        on, off = r["full"], r["-locality"]
        sequences = float(np.mean([x.shape[0] for x in case.steps]))
        tokens = float(np.mean([padded_lengths(x, case.pad_multiple).sum() for x in case.steps]))
        extra = (float(np.sum(on.cpu)) - float(np.sum(off.cpu))) / len(on.cpu)
        kept = max(0.0, float(np.mean(off.moved) - np.mean(on.moved))) * tokens / case.dp  # tokens per rank
        measured = extra * LINK / kept if kept > 0 else float("inf")
        rule = break_even_bytes_per_token(sequences=int(sequences), tokens=int(tokens), dp_size=case.dp)
        write(
            f"{label(case):<34} {1e6 * extra / sequences:>12.2f} {100 * np.mean(on.moved):>10.1f} "
            f"{100 * np.mean(off.moved):>6.1f} {20 * kept / 1e6:>17.2f} {measured:>18,.0f} {rule:>9,.0f}"
        )
    write("")


def auto_table(shapes: list[tuple[int, int]], repeats: int, write: Callable[[str], None]) -> list[float]:
    """``locality="auto"`` (the default) on token-id samples (``bytes_per_token`` unknown: 20)
    against ``locality=False`` and ``True`` at ``benchmarks/scale.py``'s shapes: CPU time, best
    of ``repeats``, the three interleaved; returns auto / off per shape."""
    sc = sibling("scale")
    write("## locality='auto' on token-id samples (20 bytes a token) against off and on: plan CPU s, best of each")
    header = f"{'shape':<24} {'auto':>8} {'off':>8} {'on':>8} {'auto/off':>8} {'on/off':>7} {'auto ran it':>11}"
    write(header)
    write("-" * len(header))
    ratios = []
    for n, dp in shapes:
        lengths = sc.lengths_for(n)
        kwargs: dict[str, Any] = dict(dp_size=dp, max_tokens_per_rank=sc.CAPACITY, cost=sc.COST)
        variants = {"auto": get_scheduler("balanced"), "off": get_scheduler("balanced", locality=False)}
        variants["on"] = get_scheduler("balanced", locality=True)
        best = dict.fromkeys(variants, float("inf"))
        prints = {}
        for _ in range(repeats):
            for name, sched in variants.items():
                t = time.process_time()
                schedule = sched.schedule(lengths, **kwargs)
                best[name] = min(best[name], time.process_time() - t)
                prints[name] = schedule.fingerprint()
        ran = prints["auto"] == prints["on"] != prints["off"]
        ratios.append(best["auto"] / best["off"])
        write(
            f"{f'{n:,} into {dp:,}':<24} {best['auto']:>8.3f} {best['off']:>8.3f} {best['on']:>8.3f} "
            f"{ratios[-1]:>8.2f} {best['on'] / best['off']:>7.2f} {'yes' if ran else 'no':>11}"
        )
    write("")
    return ratios


def warm_up() -> None:
    """Load (or compile) every kernel the variants call before anything is timed: locality's,
    the exact search and bin completion (a verl batch), the replica-first pass (a heavy tail)."""
    ht = sibling("heavy_tail")
    for off in ((), ("pair_swaps",)):  # the kernel without pair swaps is compiled too
        get_scheduler("balanced", locality=True, stages=composition(off)).schedule(
            ht.heavy_tail(0)[:512], dp_size=4, max_tokens_per_rank=32768
        )
    get_scheduler("balanced", min_microbatches=4).schedule(ht.verl_lengths(349), dp_size=1, max_tokens_per_rank=300)
    get_scheduler("balanced", num_microbatches=3).schedule(
        ht.heavy_tail(0), dp_size=ht.DP, max_tokens_per_rank=ht.CAPACITY, cost=ht.COST, sync="replica"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="steps (seeds) per workload")
    parser.add_argument("--repeats", type=int, default=3, help="CPU time: best of this many plans per step")
    parser.add_argument("--verl", type=int, default=2000, help="verl-like batches (seeds 0..N-1)")
    parser.add_argument("--no-16k", dest="big", action="store_false", help="skip 1,048,576 into 16,384")
    parser.add_argument("--quick", action="store_true", help="toy sizes, one step, one repeat (a smoke test)")
    parser.add_argument(
        "--auto-only", action="store_true", help="only locality='auto' against off and on at the scale shapes"
    )
    parser.add_argument("--out", default=None, help=f"where to save the output (default {RESULTS}; --quick: none)")
    args = parser.parse_args(argv)
    steps, repeats, verl = (1, 1, 20) if args.quick else (args.steps, args.repeats, args.verl)
    out_path = args.out if args.out is not None else (None if args.quick else str(RESULTS))
    lines: list[str] = []

    def write(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    warm_up()
    machine = sibling("schedulers").machine()
    write(f"# machine: {machine}; load average at start {os.getloadavg()[0]:.1f}")
    write(f"# {steps} step(s) per workload; plan CPU time best of {repeats}, variants interleaved")
    write("")
    shapes = scale_shapes(args.big, args.quick)
    if args.auto_only:
        ratios = auto_table(shapes, repeats, write)
        if out_path:
            pathlib.Path(out_path).write_text("\n".join(lines) + "\n")
        return {"auto_over_off": ratios}
    cases = (
        scheduler_cases(steps, repeats, args.quick)
        + heavy_tail_cases(steps, repeats, verl, args.quick)
        + scale_cases(repeats, args.big, args.quick)
    )
    results = []
    t0 = time.perf_counter()
    for case in cases:
        results.append(run_case(case, VARIANTS))
        detail(case, results[-1], write)
    verdicts = summary(cases, results, write)
    locality_costs(cases, results, write)
    auto = auto_table(shapes, repeats, write)
    write(f"# load average at the end {os.getloadavg()[0]:.1f}; {time.perf_counter() - t0:.0f} s in all")
    if out_path:
        pathlib.Path(out_path).write_text("\n".join(lines) + "\n")
    return {"cases": [label(c) for c in cases], "verdicts": verdicts, "results": results, "auto_over_off": auto}


if __name__ == "__main__":
    main()
