"""Ablation of the dynamic-CP planner: what each sub-stage of ``plan_dynamic_cp`` buys.

The planner's search (``seqpack.schedulers.dynamic_cp.planner._search``) is composed here
again with switches, and installed in its place for one variant at a time (monkeypatching:
the product has no switches). With every switch on, the composition plans exactly what the
product plans (checked on every step: the ``copy`` variant). One sub-stage off per variant:

* ``-fine``: no refinement of the height grid between the best coarse height's neighbours;
* ``-widen_try``: the best height is not tried again without widening;
* ``-widen``: no widening at all (``_rounds.build(..., widen=False)`` everywhere);
* ``-more``: the best height is not tried with more (replica: fewer / more) rounds;
* ``-anchors``: the longest sequence's own time on each size is not tried;
* ``-inf``: the coarse pass does not try ``H = inf`` (every sequence on the smallest size
  that holds it);
* ``-need_group``: the grid is made of the 64 longest sequences only, not also of every one
  that needs a group;
* ``-lockstep_builder``: under ``sync="replica"`` only the replica builder's search runs;
* ``-pow2_search``: under ``"any"`` the power-of-2-only search does not run;
* ``-static``: no static-CP candidate (the fill's, nor under replica sync ``balanced``'s);
* ``-run_order``: a candidate's rounds run in the order built, not heaviest first;
* ``-in_nodes``: under ``"any"`` rounds are laid out left to right (``layout``), groups
  smaller than a node not kept inside one.

(A fourteenth, ``-look``, the replica builder's per-rank fill choosing the rank that ends
least busy among the two least busy, not the least busy, bought at most 0.30% and was
removed from the planner: benchmarks/results/dynamic_cp_ablation.txt.)

Workloads: ``benchmarks/dynamic_cp.py``'s (lengths, cost, ring scales; ``--quick``: 8, 64 and
512 ranks), seeds ``R + k`` for ``k < --seeds``, both syncs, ``"pow2"`` and ``"any"``.
Reported per variant and (sync, sizes, workload): the mean and the largest change of
predicted step time when the sub-stage is off (positive: the sub-stage makes steps faster),
the steps it changes, the microbatches it saves and the plan CPU time, off / on. A variant
that is no-op in a setting (``-look`` under lockstep, ``-in_nodes`` under ``"pow2"``, ...)
is not run there. Verdict by ``benchmarks/ablation.py``'s rule: keep a sub-stage that
improves some workload's predicted step time by ``GAIN`` (0.5%; a workload: one (sync,
sizes, workload, R, ring scale) over its seeds, or one small step) or guarantees something
(:data:`GUARANTEES`).

Small steps (``--small``): random steps of 1-200 sequences on 2-64 ranks under the planner
tests' costs (tests/schedulers/test_dynamic_cp_planner.py) and the plan digests', where the
search meets corner cases the benchmark's large steps do not: per variant, the steps whose
plan changes, those it makes slower, and the range of the change.

    python benchmarks/dynamic_cp_ablation.py [--quick] [--seeds 2] [--out benchmarks/results/dynamic_cp_ablation.txt]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import numpy as np  # noqa: E402
from dynamic_cp import CLOCK, RANKS, SCALES, WORKLOADS, dynamic_plan, fitted_cost, workload  # noqa: E402

from seqpack.cost import CostModel  # noqa: E402
from seqpack.options import Sync  # noqa: E402
from seqpack.schedulers import Request, _kernels, predicted_step_time  # noqa: E402
from seqpack.schedulers.dynamic_cp import _rounds, plan_dynamic_cp, planner  # noqa: E402
from seqpack.schedulers.dynamic_cp._rounds import Bins, Problem  # noqa: E402

GAIN = 0.005  # benchmarks/ablation.py's rule
GUARANTEES = {  # what a sub-stage promises besides step time on the benchmark's steps
    "static": "the plan is never slower than static CP (tests/schedulers/test_dynamic_cp_planner.py)",
    "run_order": "rounds run heaviest first, as static plans: an out-of-memory shows at the first microbatch",
    "inf": "the only height giving every sequence its smallest allowed size (the grid has power-of-2 sizes "
    "only): under 'any' on ranks no power of two, small steps up to +28%",
}
SWITCHES = (
    "fine",
    "widen_try",
    "widen",
    "more",
    "anchors",
    "inf",
    "need_group",
    "lockstep_builder",
    "pow2_search",
    "static",
    "run_order",
    "in_nodes",
)
# Where a switch can change a plan: (syncs, group sizes); None: every one.
APPLIES: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...] | None]] = {
    "lockstep_builder": (("replica",), None),
    "pow2_search": (None, ("any",)),
    "in_nodes": (None, ("any",)),
}


def _score(p: Problem, bins: Bins, on: frozenset[str]) -> Bins:
    """``_rounds.score`` with the run order and the node-aware layout as switches."""
    nb = bins.size.shape[0]
    if bins.start is None:
        order = np.lexsort((np.arange(nb), -bins.size, bins.round))
        if p.in_nodes and "in_nodes" in on:
            bins.start = _kernels.cp_planner.layout_in_nodes(
                order, bins.round, bins.size, p.ranks_per_node, p.num_ranks
            )
        else:
            bins.start = _kernels.cp_planner.layout(order, bins.round, bins.size)
    if bins.run_round is None and "run_order" not in on:
        bins.run_round = bins.round.copy()
    return _rounds.score(p, bins)


def _height_grid(p: Problem, on: frozenset[str], top_n: int | None = None) -> np.ndarray:
    if top_n is None and "need_group" not in on:
        top_n = min(planner._TOP, p.lengths.shape[0])  # noqa: SLF001
    return planner._height_grid(p, top_n)  # noqa: SLF001


def _search_heights(p: Problem, on: frozenset[str], replica: bool = False) -> Bins:
    """``planner._search_heights`` with its sub-stages as switches."""
    tried: dict[tuple[float, int, bool], Bins] = {}
    widen_ok = "widen" in on

    def attempt(height: float, more: int = 0, widen: bool = True) -> Bins:
        widen = widen and widen_ok
        if (height, more, widen) not in tried:
            built = _rounds.build_replica(p, height, more) if replica else _rounds.build(p, height, more, widen)
            tried[(height, more, widen)] = _score(p, built, on)
        return tried[(height, more, widen)]

    grid = _height_grid(p, on)
    coarse_n, fine_n = (planner._COARSE // 2 - 2, planner._FINE // 2) if replica else (planner._COARSE, planner._FINE)  # noqa: SLF001
    picks = np.unique(np.linspace(0, grid.shape[0] - 1, min(coarse_n, grid.shape[0])).round().astype(np.int64))
    coarse = [*grid[picks].tolist(), *([math.inf] if "inf" in on or grid.shape[0] == 0 else [])]
    best_i = min(range(len(coarse)), key=lambda i: (attempt(coarse[i]).score, i))
    best_h = coarse[best_i]
    if "fine" in on:
        lo = int(picks[best_i - 1]) + 1 if best_i > 0 else 0
        hi = int(picks[best_i + 1]) if best_i + 1 < picks.shape[0] else grid.shape[0]
        between = grid[lo:hi]
        spots = np.linspace(0, between.shape[0] - 1, min(fine_n, between.shape[0])).round().astype(np.int64)
        best_h = min([coarse[best_i], *between[np.unique(spots)].tolist()], key=lambda h: attempt(h).score)
    best = attempt(best_h)
    widen = replica or "widen_try" not in on or attempt(best_h, widen=False).score >= best.score
    best = attempt(best_h, widen=widen)
    if "more" in on:
        for more in (-1, 1) if replica else (1, 2):
            candidate = attempt(best_h, more, widen)
            if candidate.score < best.score:
                best = candidate
            elif not replica:
                break
    if "anchors" in on and replica == (p.sync == Sync.REPLICA):
        for height in _height_grid(p, on, top_n=1).tolist():
            if height >= best.score:
                continue
            for more in (0, -1) if replica else (0,):
                candidate = attempt(height, more)
                best = candidate if candidate.score < best.score else best
    return best


def search(on: frozenset[str]):  # noqa: ANN201
    """``planner._search`` with its candidates as switches."""

    def _search(p: Problem) -> Bins:
        candidates = []
        if p.sync != Sync.REPLICA or "lockstep_builder" in on:
            candidates.append(_search_heights(p, on))
        if p.sync == Sync.REPLICA:
            candidates.append(_search_heights(p, on, replica=True))
        if p.in_nodes and "pow2_search" in on:
            candidates.append(_search_heights(dataclasses.replace(p, sizes=p.pow2_sizes), on))
        if "static" in on:
            candidates.append(_score(p, _rounds.build_static(p), on))
            if p.sync == Sync.REPLICA:
                candidates.extend(_score(p, bins, on) for bins in _rounds.build_balanced(p))
        return min(candidates, key=lambda bins: bins.score)

    return _search


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The planner with sub-stage ``name`` off (``copy``: the composition with all on;
    ``full``: the product, untouched)."""
    if name == "full":
        yield
        return
    saved = planner._search  # noqa: SLF001
    planner._search = search(frozenset(SWITCHES) - {name.removeprefix("-")})  # noqa: SLF001
    try:
        yield
    finally:
        planner._search = saved  # noqa: SLF001


def applies(name: str, sync: str, sizes: str) -> bool:
    syncs, modes = APPLIES.get(name.removeprefix("-"), (None, None))
    return (syncs is None or sync in syncs) and (modes is None or sizes in modes)


def run(ranks: tuple[int, ...], seeds: int, names: list[str]) -> list[dict]:
    """One row per (variant, step): predicted step time, microbatches, plan CPU seconds."""
    cost = fitted_cost(CLOCK)[0]
    for sync in ("lockstep", "replica"):  # compile (or load) every kernel before timing
        for sizes in ("pow2", "any"):
            dynamic_plan(workload("tail256k", 16, seed=0), 16, cost, sync, sizes)
    rows = []
    for sync in ("lockstep", "replica"):
        for sizes in ("pow2", "any"):
            for scale in SCALES:
                scaled = cost.scaled_ring(scale)
                for kind in WORKLOADS:
                    for r in ranks:
                        for k in range(seeds):
                            lengths = workload(kind, r, seed=r + k)
                            step = {"sync": sync, "sizes": sizes, "scale": scale, "workload": kind, "ranks": r}
                            for name in names:  # interleaved: the CPU's load changes alike for all
                                if not applies(name, sync, sizes):
                                    continue
                                with variant(name):
                                    t0 = time.process_time()
                                    plan = dynamic_plan(lengths, r, scaled, sync, sizes)
                                    cpu = time.process_time() - t0
                                plan.validate(lengths)
                                rows.append(
                                    {
                                        **step,
                                        "seed": r + k,
                                        "variant": name,
                                        "time": predicted_step_time(plan, scaled, sync=sync),
                                        "mb": plan.num_microbatches,
                                        "cpu": cpu,
                                        "fp": plan.fingerprint(),
                                    }
                                )
                            print(sync, sizes, scale, kind, r, r + k, file=sys.stderr, flush=True)
    return rows


def _key(r: dict) -> tuple:
    return r["sync"], r["sizes"], r["scale"], r["workload"], r["ranks"], r["seed"]


def summarize(rows: list[dict], names: list[str], out: list[str]) -> dict[str, dict]:
    """Per variant and (sync, sizes, workload): gains, changed steps, microbatches, CPU."""
    base = {
        (r["sync"], r["sizes"], r["scale"], r["workload"], r["ranks"], r["seed"]): r
        for r in rows
        if r["variant"] == "full"
    }
    copies = [r for r in rows if r["variant"] == "copy"]
    same = sum(r["fp"] == base[_key(r)]["fp"] for r in copies)
    out.append(f"composition with every sub-stage on = the product: {same} of {len(copies)} plans identical\n")
    out.append(
        f"{'variant':<18} {'sync':<9} {'sizes':<5} {'workload':<12} {'steps':>5} {'changed':>7} {'mean gain':>9} "
        f"{'best gain':>9} {'worst':>8} {'+M':>4} {'cpu off/on':>10}"
    )
    verdicts: dict[str, dict] = {}
    for name in names:
        if name in ("full", "copy"):
            continue
        best_any, best_step, where, fewer = -math.inf, -math.inf, "", 0
        for sync in ("lockstep", "replica"):
            for sizes in ("pow2", "any"):
                for kind in WORKLOADS:
                    sel = [
                        r
                        for r in rows
                        if r["variant"] == name and r["sync"] == sync and r["sizes"] == sizes and r["workload"] == kind
                    ]
                    if not sel:
                        continue
                    pairs = [(r, base[_key(r)]) for r in sel]
                    gains = [off["time"] / on["time"] - 1.0 for off, on in pairs]
                    extra = sum(off["mb"] - on["mb"] for off, on in pairs)
                    changed = sum(off["fp"] != on["fp"] for off, on in pairs)
                    cpu = sum(off["cpu"] for off, _ in pairs) / max(sum(on["cpu"] for _, on in pairs), 1e-12)
                    top = max(gains)
                    per_shape: dict[tuple[int, float], list[float]] = {}  # one workload: its seeds' steps
                    for (off, _), g in zip(pairs, gains, strict=True):
                        per_shape.setdefault((off["ranks"], off["scale"]), []).append(g)
                    shape, mean = max(((k, float(np.mean(v))) for k, v in per_shape.items()), key=lambda kv: kv[1])
                    if mean > best_any:
                        best_any = mean
                        where = f"{sync} {sizes} {kind} R={shape[0]} x{shape[1]}"
                    best_step = max(best_step, top)
                    fewer += max(extra, 0)
                    out.append(
                        f"{name:<18} {sync:<9} {sizes:<5} {kind:<12} {len(pairs):>5} {changed:>7} "
                        f"{100 * np.mean(gains):>+8.2f}% {100 * top:>+8.2f}% {100 * min(gains):>+7.2f}% "
                        f"{extra:>+4d} {cpu:>10.2f}"
                    )
        verdicts[name] = {"best": best_any, "step": best_step, "where": where, "fewer": fewer}
    return verdicts


def report_verdicts(verdicts: dict[str, dict], small: dict[str, float], out: list[str]) -> None:
    """The rule: keep a sub-stage that gains ``GAIN`` on some workload of the benchmark (a
    shape over its seeds) or guarantees something (:data:`GUARANTEES`); the small steps'
    largest gain is printed beside it."""
    out.append(
        "\n## Verdicts (a workload: one (sync, sizes, workload, R, ring) over its seeds; small steps: the largest "
        "gain; +M: microbatches added when off, summed)\n"
    )
    for name, v in verdicts.items():
        why = GUARANTEES.get(name.removeprefix("-"), "")
        keep = "keep" if v["best"] >= GAIN or why else "remove"
        out.append(
            f"{name:<18} best {100 * v['best']:+.2f}% ({v['where']}; best step {100 * v['step']:+.2f}%), "
            f"small steps {100 * small.get(name, math.nan):+.2f}%, +M {v['fewer']}: {keep}{f' ({why})' if why else ''}"
        )


SMALL_COSTS = (
    CostModel(1.0, 0.001, reference_size=1),
    CostModel(24576.0, 1.0, 1e5, reference_size=1),
    CostModel(1.0, 0.0, 10.0, reference_size=1),
    CostModel(1.0, 0.05, 5.0, ring_step=2.0, ring_token=0.2, ring_token_inter=1.0, ranks_per_node=2, reference_size=1),
    CostModel(0.1, 0.01, 0.0, ring_step=0.5, ring_token=0.05, ranks_per_node=4, reference_size=1),
)


def small_steps(names: list[str], n: int, out: list[str]) -> dict[str, float]:
    """Random small steps (module docstring): per variant, changed and slower plans; returns
    each variant's largest gain."""
    rng = np.random.default_rng(7)
    stats = {
        name: [0, 0, 0, 0.0, 0.0, 0.0] for name in names if name != "full"
    }  # steps, changed, slower, min, max, sum
    for case in range(n):
        dp, cp = int(rng.choice([1, 2, 3, 4, 8, 16])), int(rng.choice([1, 1, 2, 4]))
        if dp * cp < 2:
            continue
        cap, count, pad = (
            int(rng.choice([40, 128, 512, 1024, 4096])),
            int(rng.integers(1, 200)),
            int(rng.choice([1, 2, 8])),
        )
        lengths = np.clip(rng.lognormal(np.log(cap) - 1.0, 1.2, count).astype(np.int64), 1, cap * dp * cp // 2)
        cost, sync = SMALL_COSTS[case % len(SMALL_COSTS)], ("lockstep", "replica")[case % 2]
        sizes = ("pow2", "any")[(case // 2) % 2]
        request = Request.of(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=cap, pad_multiple=pad, cost=cost,
                             sync=sync, on_oversize="drop")  # fmt: skip
        full = plan_dynamic_cp(request, group_sizes=sizes)
        on = predicted_step_time(full, cost, sync=sync)
        for name, st in stats.items():
            if not applies(name, sync, sizes):
                continue
            with variant(name):
                plan = plan_dynamic_cp(request, group_sizes=sizes)
            gain = predicted_step_time(plan, cost, sync=sync) / on - 1.0 if on > 0 else 0.0
            st[0] += 1
            st[1] += plan.fingerprint() != full.fingerprint()
            st[2] += gain > 1e-12
            st[3], st[4], st[5] = min(st[3], gain), max(st[4], gain), st[5] + gain
    out.append(f"\n## Small steps ({n} random steps; gain = off / on - 1)\n")
    out.append(f"{'variant':<18} {'steps':>5} {'changed':>7} {'slower':>6} {'mean gain':>9} {'gain range':>20}")
    for name, (steps, changed, slower, lo, hi, total) in stats.items():
        mean = 100 * total / max(steps, 1)
        out.append(
            f"{name:<18} {steps:>5} {changed:>7} {slower:>6} {mean:>+8.3f}% {100 * lo:>+8.3f}% .. {100 * hi:>+7.3f}%"
        )
    return {name: st[4] for name, st in stats.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8, 64 and 512 ranks")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--only", default=None, help="comma-separated sub-stages (default: all)")
    parser.add_argument("--small", type=int, default=600, help="random small steps (0: none)")
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(SWITCHES)
    names = ["full", "copy", *(f"-{s}" for s in chosen)]
    ranks = (8, 64, 512) if args.quick else RANKS
    rows = run(ranks, args.seeds, names)
    out = [
        "# Dynamic-CP planner ablation: predicted step time with one sub-stage off / the full planner",
        f"ranks {ranks}, seeds R..R+{args.seeds - 1}, ring x{SCALES}, workloads {WORKLOADS}; gain = off / on - 1 "
        "(positive: the sub-stage makes steps faster); +M: microbatches added when off; cpu: plan CPU off / on\n",
    ]
    verdicts = summarize(rows, names, out)
    small = small_steps(names, args.small, out) if args.small else {}
    report_verdicts(verdicts, small, out)
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
