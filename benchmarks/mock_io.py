"""Length files and mock datasets: does reading a CSV (csv.Sniffer finds the dialect, pyarrow
parses) or writing a Parquet MockSFTDataset (``list`` or ``large_list`` offsets) get slower?

Times, best of ``--repeats`` with the contenders interleaved (so that load from other
processes on a shared machine hits both alike):

* ``lengths_from_file`` on CSVs of ``--lengths`` lengths (one column, two columns,
  semicolon-separated), this checkout against ``seqpack/mock_data/io.py`` of ``--baseline``
  (a git revision; its module is loaded beside this one);
* ``MockSFTDataset.write_parquet`` (``--samples`` lognormal samples) and reading it back with
  ``TokenDataset``: this checkout with int32 ``list`` offsets (used below 2**31 tokens per
  row group), this checkout forced to int64 ``large_list`` offsets, and the baseline's
  ``dataset.py``.

    python benchmarks/mock_io.py [--baseline 210b20e] [--lengths 2000000] [--samples 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from seqpack.mock_data import MockSFTDataset, io, lengths_from_file, lognormal_lengths
from seqpack.mock_data.text import TokenDataset


def load_baseline(revision: str, module: str, tmp: str):
    """``seqpack/mock_data/{module}.py`` of ``revision``, imported as its own module."""
    source = subprocess.run(
        ["git", "show", f"{revision}:seqpack/mock_data/{module}.py"], capture_output=True, text=True, check=True
    ).stdout
    path = os.path.join(tmp, f"baseline_{module}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"baseline_{module}", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def interleaved(contenders: dict, repeats: int) -> dict[str, float]:
    """Best time of each contender, running them in turn ``repeats`` times."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="210b20e", help="git revision to compare with")
    parser.add_argument("--lengths", type=int, default=2_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "seqpack"], capture_output=True, text=True).stdout
    print(
        f"seqpack {head}{' (modified)' if dirty else ''} vs {args.baseline}, "
        f"{platform.machine()}, {os.cpu_count()} cores, best of {args.repeats} interleaved runs"
    )
    lengths = lognormal_lengths(args.lengths, min_seq_len=1, max_seq_len=32768, mean_seq_len=2048, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        old_io = load_baseline(args.baseline, "io", tmp)
        old_dataset = load_baseline(args.baseline, "dataset", tmp)
        files = {
            "one column": ("length\n", "{}\n"),
            "two columns": ("id,length\n", "x,{}\n"),
            "semicolons": ("id;length\n", "x;{}\n"),
        }
        for name, (header, row) in files.items():
            path = os.path.join(tmp, name.replace(" ", "_") + ".csv")
            with open(path, "w") as f:
                f.write(header)
                f.writelines(row.format(v) for v in lengths.tolist())
            assert np.array_equal(lengths_from_file(path, column="length"), lengths)
            contenders = {"this": lambda path=path: lengths_from_file(path, column="length")}
            try:
                assert np.array_equal(old_io.lengths_from_file(path, column="length"), lengths)
                contenders["baseline"] = lambda path=path: old_io.lengths_from_file(path, column="length")
            except (ValueError, AssertionError):
                pass  # the baseline does not read this dialect
            if hasattr(io, "_sniff"):  # the fixed cost the dialect detection adds to a read
                contenders["sniff"] = lambda path=path: io._sniff(path, "utf-8")
            best = interleaved(contenders, args.repeats)
            base = f"{best['baseline'] * 1e3:7.1f} ms" if "baseline" in best else "  not read"
            print(
                f"lengths_from_file {name:<12} {args.lengths:>9,} rows: this {best['this'] * 1e3:7.1f} ms, "
                f"baseline {base}" + (f" (csv.Sniffer: {best['sniff'] * 1e6:.0f} us of it)" if "sniff" in best else "")
            )

        sample_lengths = lognormal_lengths(args.samples, min_seq_len=16, max_seq_len=16384, mean_seq_len=2048, seed=1)
        tokens = int(sample_lengths.sum())
        this = MockSFTDataset(sample_lengths, vocab_size=32000, seed=0)
        old = old_dataset.MockSFTDataset(sample_lengths, vocab_size=32000, seed=0)
        paths = {name: os.path.join(tmp, f"{name}.parquet") for name in ("list", "large_list", "baseline")}

        def write_large():
            io.LIST_MAX_VALUES = 0  # every row group is "past int32 offsets"
            try:
                this.write_parquet(paths["large_list"], rows_per_group=256)
            finally:
                io.LIST_MAX_VALUES = 2**31 - 1

        writes = interleaved(
            {
                "list": lambda: this.write_parquet(paths["list"], rows_per_group=256),
                "large_list": write_large,
                "baseline": lambda: old.write_parquet(paths["baseline"], rows_per_group=256),
            },
            args.repeats,
        )
        reads = interleaved({name: lambda p=p: TokenDataset(p) for name, p in paths.items()}, args.repeats)
        for name in paths:
            print(
                f"MockSFTDataset {name:<10} {args.samples:,} samples, {tokens:,} tokens: "
                f"write_parquet {writes[name] * 1e3:6.1f} ms, TokenDataset read {reads[name] * 1e3:6.1f} ms"
            )
        assert TokenDataset(paths["large_list"])[5]["input_ids"].tolist() == this[5]["input_ids"].tolist()


if __name__ == "__main__":
    main()
