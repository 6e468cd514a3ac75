"""``seqpack.pack_dataset`` beside TRL's ``pack_dataset(strategy="bfd")`` on the same
``datasets.Dataset``: wall time and peak extra memory (RSS), with and without labels, in one run.

The dataset: ``--rows`` rows of lognormal lengths (seqpack.mock_data, seed 0; mean 1000,
sigma 1.1, 16..8192, the SFT workload of ``benchmarks/packing.py``), ``input_ids`` int32;
with labels, a ``labels`` column in Hugging Face's alignment (a copy of ``input_ids``, -100 on
the first third of each row, the prompt), which seqpack reads with ``label_format="unshifted"``.
Both pack into rows of 8,192 tokens (TRL truncates longer rows; there are none).

Each measurement runs in a new Python process that builds the dataset, hands its freed
memory back to the system, and packs: its wall and CPU time (user + system, which a shared
machine's load inflates less), and the peak of its resident set (``VmHWM``, reset before
packing) above its resident set before packing.
seqpack writes the packed rows to a memory-mapped cache file (page cache, not the process's
resident set); TRL keeps them in memory.

    python benchmarks/pack_dataset.py [--rows 100000] [--repeats 1] [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import seqpack  # noqa: E402
from seqpack.mock_data import generate_lengths  # noqa: E402

MAX_TOKENS = 8192
LENGTHS = dict(min_seq_len=16, max_seq_len=8192, mean_seq_len=1000, sigma=1.1)


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return f"{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, one thread"


def dataset(lengths: np.ndarray, labels: bool) -> Any:
    """A ``datasets.Dataset`` of ``input_ids`` (int32) of ``lengths``, and HF-style ``labels``."""
    import datasets
    import pyarrow as pa

    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = (np.arange(int(offsets[-1]), dtype=np.int64) % 50_000 + 1).astype(np.int32)
    columns = {"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))}
    if labels:
        position = np.arange(ids.shape[0]) - np.repeat(offsets[:-1], lengths)
        hf = np.where(position < np.repeat(lengths // 3, lengths), -100, ids).astype(np.int32)
        columns["labels"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(hf))
    return datasets.Dataset(datasets.table.InMemoryTable(pa.table(columns)))


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(what: str, labels: bool, n: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process: build the dataset, then pack it."""
    import ctypes
    import gc

    import datasets
    import pyarrow as pa

    datasets.disable_progress_bars()
    data = dataset(generate_lengths("lognormal", n, seed=0, **LENGTHS), labels)
    if what == "seqpack pack_dataset":
        seqpack.pack_dataset([{"input_ids": [1, 2]}], 4)  # compile (or load) the packer outside the timing
        fn = lambda: seqpack.pack_dataset(data, MAX_TOKENS, label_format="unshifted")  # noqa: E731
    else:
        from trl import pack_dataset as trl_pack

        fn = lambda: trl_pack(data, MAX_TOKENS, strategy="bfd")  # noqa: E731
    gc.collect()
    pa.default_memory_pool().release_unused()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed memory back: the baseline is what is in use
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    start_rss = _kib("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return dict(seconds=seconds, cpu=cpu, extra_mib=(_kib("VmHWM") - start_rss) / 1024, packs=len(out))


def measure(what: str, labels: bool, n: int) -> dict[str, Any]:
    """:func:`child` in a new Python process."""
    command = [sys.executable, os.path.abspath(__file__), "--child", what, "--rows", str(n)]
    done = subprocess.run(command + (["--labels"] if labels else []), capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{what} (labels={labels}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the dataset")
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs (each in a new process)")
    parser.add_argument("--quick", action="store_true", help="2,000 rows (a smoke test)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--labels", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    n = 2_000 if args.quick else args.rows
    if args.child:
        print(json.dumps(child(args.child, args.labels, n)))
        return []
    import datasets

    whats = ["seqpack pack_dataset"]
    if importlib.util.find_spec("trl") is not None:
        whats.append("trl pack_dataset bfd")
    lengths = generate_lengths("lognormal", n, seed=0, **LENGTHS)
    print(f"# machine: {machine()}")
    print(f"# seqpack {seqpack.__version__}, datasets {datasets.__version__}; best of {args.repeats}")
    print(f"# data: {n:,} rows, {int(lengths.sum()):,} tokens (lognormal mean 1000), into rows of {MAX_TOKENS:,}")
    if len(whats) == 1:
        print("# trl is not installed: its rows are left out")
    print(f"{'what':<24} {'labels':<7} {'wall s':>8} {'CPU s':>8} {'extra MiB':>10} {'packed rows':>12}")
    rows: list[dict[str, Any]] = []
    for labels in (False, True):
        for what in whats:
            results = [measure(what, labels, n) for _ in range(args.repeats)]
            best = min(results, key=lambda r: r["seconds"])
            extra = max(r["extra_mib"] for r in results)
            rows.append(
                dict(what=what, labels=labels, extra_mib=extra, **{k: best[k] for k in ("seconds", "cpu", "packs")})
            )
            figures = f"{best['seconds']:>8.2f} {best['cpu']:>8.2f} {extra:>10.0f} {best['packs']:>12,}"
            print(f"{what:<24} {labels!s:<7} {figures}", flush=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
