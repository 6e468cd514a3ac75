"""seqpack against verl 0.9.1's own dynamic batching, on verl's path: the trainer's
``_balance_batch`` deals a global batch to ``dp`` ranks (verl's Karmarkar-Karp on
``24576*s + s**2``, equal counts), then every rank calls ``rearrange_micro_batches`` with the
count agreed over DP. Run in verl's venv (verl pins transformers < 5.11)::

    /work/venvs/verl/bin/python benchmarks/verl_compare.py [--seeds 10]

Per configuration and dp it prints, mean (worst) over seeds:

* ``M``: micro-batches per rank (the agreed count) and the token lower bound
  ``ceil(tokens / (dp * max_token_len))``;
* ``over``: micro-batches holding more than ``max_token_len`` real tokens (all ranks);
* ``rounds``: ``sum_m max_d w(d, m) / sum_m mean_d w(d, m)`` with ``w`` verl's workload of
  micro-batch ``m`` on rank ``d`` (what lockstep ranks wait for);
* ``busiest/LB``: the busiest rank's workload over ``max(total / dp, largest sequence)``;
* ``ms``: planning time per step (all ranks, one process), on this machine.

Rows: ``verl``: verl 0.9.1's ``rearrange_micro_batches``; ``drop-in``: seqpack's
``seqpack.interop.verl.rearrange_micro_batches`` on the same per-rank batches; ``seqpack``: the
``balanced`` scheduler planning the whole global batch over dp (what ``wrap_data_iterator``
does; samples are not dealt first). The DP agreement runs in one process: every rank's count
at least the current agreed one (``min_num_micro_batch``), repeated until all ranks return the
same count: the count verl's all-reduce MAX and its all-reduce MIN of "fits" reach.

Batches: ``docs`` is docs/rl.md's GRPO step (64 prompts x 8 responses, prompt lognormal mean
512 in 32..4096 shared by its responses, response lognormal mean 1024 in 16..8192,
max_token_len 16384); ``verl-like`` is a verl PPO/GRPO step at its defaults (32 prompts x 8,
prompt lognormal mean 256 in 16..1024, response mean 1536 in 16..4096,
``ppo_max_token_len_per_gpu`` 16384); ``tight`` is ``verl-like`` with max_token_len 6144 (a
micro-batch holds a few sequences, where the cap binds).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from seqpack.interop import verl as drop_in  # noqa: E402
from seqpack.mock_data import lognormal_lengths  # noqa: E402
from seqpack.schedulers import get_scheduler  # noqa: E402

try:
    from tensordict import TensorDict
    from verl.utils import seqlen_balancing as verl_balancing
except ImportError:  # pragma: no cover - the script needs verl's venv
    sys.exit("verl is not installed: run this in verl's venv (see the module docstring)")

CONFIGS = {
    "docs": dict(prompts=64, responses=8, prompt=(512, 32, 4096), response=(1024, 16, 8192), cap=16384),
    "verl-like": dict(prompts=32, responses=8, prompt=(256, 16, 1024), response=(1536, 16, 4096), cap=16384),
    "tight": dict(prompts=32, responses=8, prompt=(256, 16, 1024), response=(1536, 16, 4096), cap=6144),
}


def step_lengths(config: dict[str, Any], seed: int) -> np.ndarray:
    """One global batch: each prompt's length shared by its responses (as benchmarks/rl_groups.py)."""
    mean, lo, hi = config["prompt"]
    prompts = lognormal_lengths(config["prompts"], min_seq_len=lo, max_seq_len=hi, mean_seq_len=mean, seed=seed)
    mean, lo, hi = config["response"]
    n = config["prompts"] * config["responses"]
    responses = lognormal_lengths(n, min_seq_len=lo, max_seq_len=hi, mean_seq_len=mean, seed=seed + 10_000)
    return np.repeat(prompts, config["responses"]) + responses


def workload(lengths: np.ndarray) -> np.ndarray:
    return 24576 * lengths.astype(np.float64) + lengths.astype(np.float64) ** 2


def deal(lengths: np.ndarray, dp: int) -> list[np.ndarray]:
    """verl's ``_balance_batch``: equal counts per rank, Karmarkar-Karp on the workload."""
    work = (24576 * lengths + lengths**2).tolist()
    return [np.array(p) for p in verl_balancing.get_seqlen_balanced_partitions(work, k_partitions=dp, equal_size=True)]


def rank_batch(lengths: np.ndarray, tensordict: bool) -> Any:
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]).to(torch.int64)
    data = {"input_ids": torch.zeros_like(mask), "attention_mask": mask}
    return TensorDict(data, batch_size=[len(lengths)]) if tensordict else data


def agreed(call: Callable[[int, int | None], list[list[int]]], ranks: int) -> list[list[list[int]]]:
    """Every rank's index lists at the count the DP agreement reaches."""
    least: int | None = None
    while True:
        plans = [call(d, least) for d in range(ranks)]
        counts = {len(p) for p in plans}
        if len(counts) == 1 and (least is None or counts == {least}):
            return plans
        least = max(len(p) for p in plans)


def per_rank(impl: str, lengths: np.ndarray, dp: int, cap: int) -> list[list[np.ndarray]]:
    """Micro-batches (lengths of their sequences) of every rank."""
    shares = [lengths[ix] for ix in deal(lengths, dp)]
    rearrange = verl_balancing.rearrange_micro_batches if impl == "verl" else drop_in.rearrange_micro_batches
    batches = [rank_batch(s, impl == "verl") for s in shares]

    def call(d: int, least: int | None) -> list[list[int]]:
        return rearrange(batches[d], cap, min_num_micro_batch=least)[1]

    plans = agreed(call, dp)
    return [[shares[d][ix] for ix in plans[d]] for d in range(dp)]


def whole(lengths: np.ndarray, dp: int, cap: int) -> list[list[np.ndarray]]:
    """The ``balanced`` scheduler over the whole batch, as wrap_data_iterator plans a step."""
    plan = get_scheduler("balanced").schedule(lengths, dp_size=dp, max_tokens_per_rank=cap, cost=drop_in.VERL_WORKLOAD)
    return [[lengths[plan.assignment[m][d]] for m in range(plan.num_microbatches)] for d in range(dp)]


def measure(rows: list[list[np.ndarray]], lengths: np.ndarray, dp: int, cap: int) -> dict[str, float]:
    work = np.array([[workload(mb).sum() for mb in rank] for rank in rows])  # [dp, M]
    bound = max(workload(lengths).sum() / dp, workload(lengths).max())
    return {
        "M": work.shape[1],
        "over": sum(int(mb.sum() > cap) for rank in rows for mb in rank),
        "rounds": float(work.max(axis=0).sum() / work.mean(axis=0).sum()),
        "busiest": float(work.sum(axis=1).max() / bound),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--dp", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    import verl

    print(f"# verl {verl.__version__}, seqpack from {os.path.dirname(drop_in.__file__)}")
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    print(f"# seeds {args.seeds}; mean (worst) over seeds")
    print("| batch | dp | plan | M | M bound | over cap | rounds | busiest/LB | ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, config in CONFIGS.items():
        cap = config["cap"]
        for dp in args.dp:
            for plan in ("verl", "drop-in", "seqpack"):
                results, times, bounds = [], [], []
                for seed in range(args.seeds):
                    lengths = step_lengths(config, seed)
                    start = time.perf_counter()
                    rows = whole(lengths, dp, cap) if plan == "seqpack" else per_rank(plan, lengths, dp, cap)
                    times.append(time.perf_counter() - start)
                    results.append(measure(rows, lengths, dp, cap))
                    bounds.append(-(-int(lengths.sum()) // (dp * cap)))

                def cell(key: str, fmt: str, results: list[dict[str, float]] = results) -> str:
                    values = [r[key] for r in results]
                    return f"{statistics.mean(values):{fmt}} ({max(values):{fmt}})"

                print(
                    f"| {name} | {dp} | {plan} | {cell('M', '.1f')} | {statistics.mean(bounds):.1f} | "
                    f"{sum(r['over'] for r in results)} | {cell('rounds', '.4f')} | {cell('busiest', '.4f')} | "
                    f"{1000 * statistics.median(times):.0f} |"
                )


if __name__ == "__main__":
    main()
