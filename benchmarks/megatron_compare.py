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

from seqpack.cost import model_preset  # noqa: E402
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
