"""What keeping GRPO groups together costs in balance: ``balanced`` alone against
``schedule_groups`` (each prompt's responses on one replica) and with ``together`` (and in
one microbatch when they fit), on GRPO-shaped steps.

    PYTHONPATH=. python benchmarks/rl_groups.py [--seeds 10] [--prompts 64] [--responses 8]

A step is ``prompts x responses`` sequences: a prompt (lognormal, mean 512, 32..4096 tokens,
shared by its responses) followed by one response (lognormal, mean 1024, 16..8192 tokens).
Costs are the default cost model (Llama-3-8B training FLOPs). Per configuration it prints
the mean and worst over seeds of:

* ``busiest/LB``: busiest replica's cost over ``max(total / dp, costliest sequence)``, the
  bound of any schedule (StepStats.bound_ratio; for groups the bound is the same, so the
  figure includes what the groups cost);
* ``busiest/LB_g``: the same over the grouped bound ``max(total / dp, costliest group)``,
  which no grouped schedule can beat;
* ``rounds``: ``sum_m max_d / sum_m mean_d`` (StepStats.round_imbalance, FSDP's wait);
* ``M``: microbatches per replica, and the token lower bound ``ceil(tokens / (dp * cap))``;
* ``ms``: planning time (median), on this machine.

``--stages`` instead measures what each stage of ``schedule_groups``'s placement buys
(issue 40's rule, ``benchmarks/ablation.py``: a stage stays if it improves some workload's
predicted step time by >= 0.5%, guarantees capacity or fewer microbatches, or, for
locality, keeps tokens home), each taken out by patching ``seqpack.schedulers.sample_groups``
from here (:data:`STAGES`; the library has no switch), on :data:`MIXES` at dp 4..64, both
syncs, with and without ``together``, free and forced microbatch counts, with and without
per-sample costs unrelated to length (``sample_cost``, which decorrelates cost and tokens).
Stage ``choose`` is the choice between a stage and its cheap alternative (refined or LPT
alone; re-planned or padded with empty microbatches) by predicted step time: taken out,
every plan is refined and re-planned, as before the choice existed:

    PYTHONPATH=. python benchmarks/rl_groups.py --stages [--seeds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from seqpack.cost import default_cost_model  # noqa: E402
from seqpack.errors import ScheduleError  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.schedulers import get_scheduler, predicted_step_time, sample_groups  # noqa: E402
from seqpack.schedulers.request import Request  # noqa: E402
from seqpack.schedulers.sample_groups import schedule_groups  # noqa: E402
from seqpack.stats import StepStats  # noqa: E402


def grpo_step(prompts: int, responses: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, group ids) of one GRPO step."""
    prompt = lognormal_lengths(prompts, min_seq_len=32, max_seq_len=4096, mean_seq_len=512, seed=seed)
    response = lognormal_lengths(
        prompts * responses, min_seq_len=16, max_seq_len=8192, mean_seq_len=1024, seed=seed + 10_000
    )
    return np.repeat(prompt, responses) + response, np.repeat(np.arange(prompts), responses)


PLANS = ("balanced", "groups", "groups+together")
GAIN = 0.005  # the rule of benchmarks/ablation.py: a stage must improve some workload by 0.5%


def plan(name: str, scheduler, lengths: np.ndarray, groups: np.ndarray, dp: int, cap: int):
    """The schedule of one configuration of :data:`PLANS`."""
    if name == "balanced":
        return scheduler.schedule(lengths, dp_size=dp, max_tokens_per_rank=cap)
    grouped = np.ones(lengths.shape[0], dtype=bool)
    together = name == "groups+together"
    return schedule_groups(
        scheduler, Request.of(lengths, dp_size=dp, max_tokens_per_rank=cap), groups, grouped, together=together
    )


def mixed_step(groups: int, largest: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, group ids) of ``groups`` groups of 1..``largest`` sequences (uniform), each
    sequence a prompt shared by its group plus a response, as in :func:`grpo_step`."""
    sizes = np.random.default_rng(seed).integers(1, largest + 1, size=groups)
    prompt = lognormal_lengths(groups, min_seq_len=32, max_seq_len=4096, mean_seq_len=512, seed=seed)
    response = lognormal_lengths(
        int(sizes.sum()), min_seq_len=16, max_seq_len=8192, mean_seq_len=1024, seed=seed + 10_000
    )
    return np.repeat(prompt, sizes) + response, np.repeat(np.arange(groups), sizes)


MIXES = {
    "grpo 64x8": lambda seed: grpo_step(64, 8, seed),
    "grpo 128x4": lambda seed: grpo_step(128, 4, seed),
    "grpo 32x16": lambda seed: grpo_step(32, 16, seed),
    "grpo 256x8": lambda seed: grpo_step(256, 8, seed),
    "dpo 256x2": lambda seed: grpo_step(256, 2, seed),
    "mixed 96x1..16": lambda seed: mixed_step(96, 16, seed),
    "mixed 64x1..64": lambda seed: mixed_step(64, 64, seed),
}
_IMPROVE, _ASSIGN = sample_groups._improve, sample_groups._assign


def _moves_only(*args):
    """``sample_groups._improve`` with the lighter replica's units hidden: no swap is seen."""
    replica, lo, swaps_only = args[0][0], args[2], args[4]
    theirs = replica == lo
    replica[theirs] = -1
    try:
        return not swaps_only and _IMPROVE(*args[:4], False)
    finally:
        replica[theirs] = lo


def _never(*_) -> bool:
    """``sample_groups._cheaper`` that never finds the alternative cheaper (nor tries it)."""
    return False


# stage -> (what is left without it, the sample_groups names patched to take it out).
STAGES = {
    "refine": ("LPT alone, no refinement", {"_improve": lambda *a: False}),
    "swaps": ("refinement by moves alone", {"_improve": _moves_only}),
    "moves": ("refinement by swaps alone", {"_improve": lambda *a: _IMPROVE(*a[:4], True)}),
    "budget": (
        "a forced count's token budget ignored by LPT and the refinement",
        {"_assign": lambda c, t, dp, budget, equal: _ASSIGN(c, t, dp, None, equal)},
    ),
    "replan": (
        "balanced's lighter replicas padded with empty microbatches, not planned again at the common count",
        {"BalancedScheduler": type("NotBalanced", (), {})},
    ),
    "relabel": ("replicas not renamed to the ranks holding their tokens", {"relabel_replicas": lambda r, *_: r}),
    "choose": ("always refined and re-planned, not the cheaper of each and its alternative", {"_cheaper": _never}),
}
# setting -> (microbatches forced above the token bound, None: free; per-sample cost / mean sequence cost).
SETTINGS = {"free count": (None, 0.0), "free count, sample_cost": (None, 3.0), "forced at the token bound": (0, 0.0)}
SETTINGS["forced bound+1, sample_cost"] = (1, 3.0)


@contextlib.contextmanager
def without(stage: str | None):
    """``sample_groups`` with ``stage`` taken out (None: as shipped)."""
    patches = STAGES[stage][1] if stage else {}
    saved = {name: getattr(sample_groups, name) for name in patches}
    for name, value in patches.items():
        setattr(sample_groups, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(sample_groups, name, value)


def stage_step(mix: str, seed: int, dp: int, sync: str, together: bool, setting: str, cap: int) -> dict:
    """Per variant (None: full, else the stage taken out): (predicted step time, share of
    tokens planned on their own rank, microbatches, plan CPU seconds), None if refused."""
    cost = default_cost_model()
    lengths, groups = MIXES[mix](seed)
    extra, weight = SETTINGS[setting]
    rng = np.random.default_rng(seed + 7)
    sample_cost = rng.exponential(weight * float(cost.cost(lengths).mean()), lengths.shape[0]) if weight else None
    request = Request.of(lengths, dp_size=dp, max_tokens_per_rank=cap, sync=sync, sample_cost=sample_cost)
    options = {} if extra is None else {"num_microbatches": -(-int(lengths.sum()) // (dp * cap)) + extra}
    scheduler = get_scheduler("balanced", **options)
    out = {}
    for stage in (None, *STAGES):
        tick = time.process_time()
        with without(stage):
            try:
                plan = schedule_groups(scheduler, request, groups, np.ones(lengths.shape[0], bool), together=together)
            except ScheduleError:
                out[stage] = None
                continue
        seconds = time.process_time() - tick
        home = float(lengths[plan.replica_of() == request.origin].sum() / lengths.sum())
        out[stage] = (predicted_step_time(plan, cost, sync=sync), home, plan.num_microbatches, seconds)
    return out


def stages_report(seeds: int, cap: int) -> None:
    """Prints, per setting, stage, sync and ``together``, what taking the stage out costs."""
    print(f"# gain: predicted step time without the stage / with it - 1, mean over {seeds} seeds per (mix, dp)")
    print("# cells: (mix, dp) pairs; refused: steps planned only with it / only without it")
    stage_step(next(iter(MIXES)), 0, 4, "lockstep", False, next(iter(SETTINGS)), cap)  # compiles the kernels
    for setting in SETTINGS:
        print(f"\n## {setting}")
        print(
            f"{'stage':<8} {'sync':<8} {'tog':<3} {'>=0.5%':>6} {'<=-0.5%':>7} {'best mean gain':>32} "
            f"{'worst step':>10} {'lowest mean':>30} {'refused':>8} {'home %':>11} {'dM':>5} {'cpu':>5}"
        )
        for sync, together in itertools.product(("lockstep", "replica"), (False, True)):
            cells: dict = {}
            for mix, dp, seed in itertools.product(MIXES, (4, 8, 16, 32, 64), range(seeds)):
                cells.setdefault((mix, dp), []).append(stage_step(mix, seed, dp, sync, together, setting, cap))
            for stage in STAGES:
                _stage_row(stage, sync, together, cells)
            sys.stdout.flush()


def _stage_row(stage: str, sync: str, together: bool, cells: dict) -> None:
    gains, refused, home, extra_m, cpu = [], [0, 0], [[], []], [], [0.0, 0.0]
    for key, steps in cells.items():
        both = [s for s in steps if s[None] is not None and s[stage] is not None]
        refused[0] += sum(s[None] is not None and s[stage] is None for s in steps)
        refused[1] += sum(s[None] is None and s[stage] is not None for s in steps)
        if not both:
            continue
        g = np.array([s[stage][0] / s[None][0] - 1 for s in both])
        gains.append((float(g.mean()), float(g.max()), float(g.min()), key))
        for s in both:
            home[0].append(s[None][1])
            home[1].append(s[stage][1])
            extra_m.append(s[stage][2] - s[None][2])
            cpu[0] += s[None][3]
            cpu[1] += s[stage][3]
    best, low = max(gains), min(gains)
    where = lambda g: f"{100 * g[0]:+.2f}% ({g[3][0]}, dp {g[3][1]})"  # noqa: E731
    print(
        f"{stage:<8} {sync:<8} {'T' if together else '-':<3} {sum(g[0] >= GAIN for g in gains):>6} "
        f"{sum(g[0] <= -GAIN for g in gains):>7} {where(best):>32} {100 * max(g[1] for g in gains):>+9.2f}% "
        f"{where(low):>30} {refused[0]:>3} / {refused[1]:<2} {100 * np.mean(home[0]):>4.1f}/"
        f"{100 * np.mean(home[1]):<4.1f} {np.mean(extra_m):>+5.2f} {cpu[1] / cpu[0]:>5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16384, help="max_tokens_per_rank")
    parser.add_argument("--stages", action="store_true", help="what each stage of the placement buys")
    args = parser.parse_args()
    if args.stages:
        stages_report(args.seeds, args.max_tokens)
        return
    cost = default_cost_model()
    scheduler = get_scheduler("balanced")
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}; {args.prompts} prompts x {args.responses} responses, "
        f"max_tokens_per_rank={args.max_tokens}, {args.seeds} seeds"
    )
    print(f"{'dp':>3} {'plan':<18} {'busiest/LB':>16} {'busiest/LB_g':>16} {'rounds':>16} {'M (bound)':>14} {'ms':>7}")
    for dp in (4, 8, 16):
        rows: dict[str, list[tuple[float, float, float, int, int, float]]] = {}
        for seed in range(args.seeds):
            lengths, groups = grpo_step(args.prompts, args.responses, seed)
            costs = cost.cost(lengths)
            group_bound = max(costs.sum() / dp, np.bincount(groups, weights=costs).max())
            for name in PLANS:
                tick = time.perf_counter()
                schedule = plan(name, scheduler, lengths, groups, dp, args.max_tokens)
                seconds = time.perf_counter() - tick
                schedule.validate(lengths)
                st = StepStats.from_schedule(schedule, cost)
                busiest = float(np.max(st.replica_cost))
                rows.setdefault(name, []).append(
                    (
                        st.bound_ratio,
                        busiest / group_bound,
                        st.round_imbalance,
                        st.num_microbatches,
                        st.min_microbatches,
                        seconds,
                    )
                )
        for name, got in rows.items():
            a = np.array(got)
            print(
                f"{dp:>3} {name:<18} {a[:, 0].mean():>7.4f} ({a[:, 0].max():.4f}) {a[:, 1].mean():>7.4f} "
                f"({a[:, 1].max():.4f}) {a[:, 2].mean():>7.4f} ({a[:, 2].max():.4f}) "
                f"{a[:, 3].mean():>6.2f} ({a[:, 4].mean():.2f}) {1e3 * statistics.median(a[:, 5]):>7.1f}"
            )


if __name__ == "__main__":
    main()
