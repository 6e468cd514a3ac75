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
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from seqpack.cost import default_cost_model  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.schedulers import get_scheduler  # noqa: E402
from seqpack.schedulers.request import Request
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


def plan(name: str, scheduler, lengths: np.ndarray, groups: np.ndarray, dp: int, cap: int):
    """The schedule of one configuration of :data:`PLANS`."""
    if name == "balanced":
        return scheduler.schedule(lengths, dp_size=dp, max_tokens_per_rank=cap)
    grouped = np.ones(lengths.shape[0], dtype=bool)
    together = name == "groups+together"
    return schedule_groups(
        scheduler, Request.of(lengths, dp_size=dp, max_tokens_per_rank=cap), groups, grouped, together=together
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16384, help="max_tokens_per_rank")
    args = parser.parse_args()
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
