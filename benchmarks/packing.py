"""Offline packing: seqpack's single-rank packer beside ``balanced`` at ``dp_size=1`` and TRL's
``pack_dataset`` (best-fit decreasing), in one run.

Lengths (seqpack.mock_data, seed 0; the issue-31 workloads):

* ``lognormal``: SFT, lognormal mean 1000, sigma 1.1, 16..8192, into packs of 8,192 tokens
* ``pareto``: pre-training documents, Pareto alpha 1.2, 128..32768, into 32,768
* ``bimodal``: RL rollouts, 75% short (mean 1024) and 25% long (mean 16384), 64..32768, into 32,768

Measured, best of ``--repeats`` wall-clock runs each:

* ``pack_lengths``: :func:`seqpack.packing.pack_lengths` on the lengths (packs against the
  token bound ``ceil(sum / max_tokens)``), at every size;
* ``balanced dp=1``: ``get_scheduler("balanced").schedule(lengths, dp_size=1,
  max_tokens_per_rank=max_tokens)`` on the lognormal lengths, which takes the packer's packs
  where they reach the fewest microbatches, and the same with its own plan (as it planned
  before; one run above 100,000 lengths);
* ``trl pack_dataset``: ``trl.pack_dataset(dataset, max_tokens, strategy="bfd")`` on a
  ``datasets.Dataset`` of ``input_ids`` of those lengths, as TRL packs (map batches of 1,000
  rows) and over the whole dataset in one batch; beside it ``seqpack.pack_dataset`` on the
  same dataset (tokens moved too). Skipped above ``--trl-max`` rows (the token table would
  need gigabytes) and when TRL is not installed.

    python benchmarks/packing.py [--sizes 10000 1000000] [--repeats 5] [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import seqpack  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402
from seqpack.packing import pack_lengths, token_lower_bound  # noqa: E402
from seqpack.schedulers import get_scheduler  # noqa: E402
from seqpack.schedulers.balanced import scheduler as single_rank  # noqa: E402

WORKLOADS: dict[str, tuple[str, dict[str, Any], int]] = {
    "lognormal": ("lognormal", dict(min_seq_len=16, max_seq_len=8192, mean_seq_len=1000, sigma=1.1), 8192),
    "pareto": ("pareto", dict(min_seq_len=128, max_seq_len=32768, alpha=1.2), 32768),
    "bimodal": (
        "bimodal",
        dict(min_seq_len=64, max_seq_len=32768, short_mean=1024, long_mean=16384, long_fraction=0.25),
        32768,
    ),
}


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Best wall-clock seconds of ``repeats`` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cores, load {load:.1f}, Python {platform.python_version()}, one thread"


def trl_pack() -> Callable[..., Any] | None:
    try:
        from trl import pack_dataset
    except Exception:  # noqa: BLE001 - not installed, or broken: the rows say so
        return None
    return pack_dataset


def token_dataset(lengths: np.ndarray) -> Any:
    """A ``datasets.Dataset`` whose row ``i`` has ``lengths[i]`` token ids (int32)."""
    import datasets
    import pyarrow as pa

    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = (np.arange(int(offsets[-1]), dtype=np.int64) % 50_000 + 1).astype(np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return datasets.Dataset(datasets.table.InMemoryTable(pa.table({"input_ids": column})))


def balanced(lengths: np.ndarray, max_tokens: int, planned: bool) -> Any:
    """``balanced`` at ``dp_size=1``; ``planned``: its own plan, without the single-rank
    packer it takes where that reaches the fewest microbatches (as before it did)."""
    original = single_rank._single_rank
    if planned:
        single_rank._single_rank = lambda *args: None
    try:
        return get_scheduler("balanced").schedule(lengths, dp_size=1, max_tokens_per_rank=max_tokens)
    finally:
        single_rank._single_rank = original


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000], help="numbers of lengths")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    parser.add_argument("--trl-max", type=int, default=10_000, help="largest size TRL and pack_dataset run at")
    parser.add_argument("--quick", action="store_true", help="toy sizes, two repeats (a smoke test)")
    args = parser.parse_args(argv)
    sizes, repeats = ([200, 2_000], 2) if args.quick else (args.sizes, args.repeats)
    trl = trl_pack()
    rows: list[dict[str, Any]] = []

    def report(what: str, workload: str, n: int, seconds: float, packs: int | None, bound: int) -> None:
        rows.append(dict(what=what, workload=workload, n=n, seconds=seconds, packs=packs, bound=bound))
        extra = "" if packs is None else f"{packs:>10,} {packs - bound:>+6}"
        print(f"{what:<38} {workload:<10} {n:>10,} {1e3 * seconds:>11.2f} {bound:>10,} {extra}", flush=True)

    print(f"# machine: {machine()}")
    print(f"# seqpack {seqpack.__version__}, numpy {np.__version__}; best of {repeats}; times in ms")
    print(f"{'what':<38} {'lengths':<10} {'n':>10} {'ms':>11} {'bound':>10} {'packs':>10} {'over':>6}")
    pack_lengths(np.array([3, 5, 2]), 8)  # compile (or load) the kernels outside the timings
    balanced(np.arange(1, 300), 300, planned=True)
    for name, (dist, params, max_tokens) in WORKLOADS.items():
        for n in sizes:
            lengths = generate_lengths(dist, n, seed=0, **params)
            bound = token_lower_bound(lengths, max_tokens)
            seconds, packing = best_of(repeats, lambda lengths=lengths, m=max_tokens: pack_lengths(lengths, m))
            report("seqpack pack_lengths", name, n, seconds, packing.num_packs, bound)
            if name == "lognormal":
                for label, planned in (("balanced dp=1", False), ("balanced dp=1, its plan", True)):
                    times = 1 if planned and n > 100_000 else repeats
                    seconds, schedule = best_of(times, lambda x=lengths, m=max_tokens, p=planned: balanced(x, m, p))
                    report(f"{label} (best of {times})", name, n, seconds, schedule.num_microbatches, bound)
            if name == "lognormal" and n <= args.trl_max:
                dataset = token_dataset(lengths)
                if trl is None:
                    print("# trl is not installed: its rows are left out")
                else:
                    import datasets

                    datasets.disable_progress_bars()
                    for label, batch in (
                        ("trl pack_dataset bfd (map 1,000)", 1000),
                        ("trl pack_dataset bfd (1 batch)", n),
                    ):
                        seconds, out = best_of(
                            repeats,
                            lambda d=dataset, m=max_tokens, b=batch: trl(
                                d, m, strategy="bfd", map_kwargs={"batch_size": b}
                            ),
                        )
                        report(label, name, n, seconds, out.num_rows, bound)
                seconds, out = best_of(repeats, lambda d=dataset, m=max_tokens: seqpack.pack_dataset(d, m))
                report("seqpack pack_dataset (Dataset)", name, n, seconds, out.num_rows, bound)
    print()
    print("# ratios (same lengths, same run): time of the other / time of seqpack pack_lengths")
    ours = {(r["workload"], r["n"]): r["seconds"] for r in rows if r["what"] == "seqpack pack_lengths"}
    for r in rows:
        if r["what"] != "seqpack pack_lengths":
            ratio = r["seconds"] / ours[(r["workload"], r["n"])]
            print(f"{r['what']:<38} {r['workload']:<10} {r['n']:>10,} {ratio:>9.1f}x")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
