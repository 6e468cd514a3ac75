"""``seqpack doctor``: which compute paths this machine can run, and why not; with
``--warm``, compile the scheduler kernels into numba's disk cache ahead of a job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING

from seqpack.cli.exit import CommandError
from seqpack.errors import ConfigError
from seqpack.validation import check_int

if TYPE_CHECKING:
    from seqpack.cli.warm import Family

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="report torch / CUDA / GPU, Transformer Engine, mamba_ssm, causal_conv1d and numba; "
        "--warm compiles the scheduler kernels",
        description="Report the environment that decides seqpack's compute paths: torch, CUDA and the GPUs; "
        "Transformer Engine, mamba_ssm and causal_conv1d (installed version, whether each imports, the error "
        "if not); which backend backend='auto' picks for bf16 CUDA inputs; numba and its threading layer. "
        "See docs/gpu.md. With --warm: plan small steps that compile every scheduler kernel into numba's disk "
        "cache (NUMBA_CACHE_DIR if set), so that a job's first step does not wait for the compile; "
        "see docs/scale.md.",
    )
    p.add_argument("--json", action="store_true", help="print the report (or, with --warm, the timings) as JSON")
    p.add_argument(
        "--warm",
        action="store_true",
        help="compile every scheduler kernel into numba's disk cache and exit (about half a minute with an empty "
        "cache, a few seconds when it is warm); run it with the job's NUMBA_CACHE_DIR",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="with --warm: compile the kernel families in this many processes at once (default 1; the "
        "number of free cores compiles fastest; a process compiles a family: more jobs than families run one each)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    check_int("--jobs", args.jobs, minimum=1)
    if args.warm:
        return _warm(as_json=args.json, jobs=args.jobs)
    if args.jobs != 1:
        raise ConfigError(f"--jobs={args.jobs} is for --warm: the report runs in one process")
    from seqpack.compute.backends import environment_report, format_environment_report

    report = environment_report()
    print(json.dumps(report, indent=1) if args.json else format_environment_report(report))
    return 0


def _warm(*, as_json: bool, jobs: int) -> int:
    """Plan every kernel family's small step (:mod:`seqpack.cli.warm`), one line each, in
    ``jobs`` processes at once when ``jobs > 1``."""
    from seqpack.cli.warm import FAMILIES, plan_family
    from seqpack.schedulers._kernels import COLD_COMPILE_SECONDS

    _quiet()
    where = _check_cache()
    jobs = min(jobs, len(FAMILIES))  # a process per family: more would idle (and overflow the pool's semaphore)
    if not as_json:
        print(
            f"compiling seqpack's scheduler kernels with numba (about {COLD_COMPILE_SECONDS} s of CPU "
            f"with an empty cache, seconds when it is warm){f' in {jobs} processes' if jobs > 1 else ''}",
            flush=True,
        )
    timings: dict[str, tuple[float, float]] = {}
    start = time.perf_counter()
    if jobs == 1:
        for family in FAMILIES:
            if not as_json:
                print(_line(family), end="", flush=True)
            try:
                timings[family.name] = plan_family(family.name)
            except BaseException:  # a broken numba (a ConfigError naming it) or Ctrl-C: end the line first
                if not as_json:
                    print(" failed", flush=True)
                raise
            if not as_json:
                print(f" {timings[family.name][0]:.1f} s", flush=True)
    else:
        timings = _warm_in_processes(jobs, as_json=as_json)
    seconds = time.perf_counter() - start
    cpu_seconds = sum(cpu for _, cpu in timings.values())  # the families', in every process
    families = [
        {
            "family": family.name,
            "kernels": family.kernels,
            "seconds": timings[family.name][0],
            "cpu_seconds": timings[family.name][1],
        }
        for family in FAMILIES
    ]
    if as_json:
        summary = {"cache": where, "jobs": jobs, "seconds": seconds, "cpu_seconds": cpu_seconds, "families": families}
        print(json.dumps(summary, indent=1))
    else:
        print(f"done in {seconds:.1f} s ({cpu_seconds:.1f} s of CPU); cache: {where}")
    return 0


def _check_cache() -> str:
    """Where numba caches the kernels, in words; refuse, before compiling, a cache folder numba
    cannot create and write (it would cache elsewhere, or fail with "no locator available")."""
    from seqpack.schedulers._kernels import cache_dir, kernel_sources

    folders = sorted({cache_dir(source.parent) for source in kernel_sources()})
    configured = os.environ.get("NUMBA_CACHE_DIR")
    for folder in folders:
        try:  # numba's own test of a cache folder
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as err:
            which = f"NUMBA_CACHE_DIR={configured}" if configured else "numba's kernel cache"
            raise CommandError(
                f"{which}: cannot create or write {folder} ({err.strerror or err}): set NUMBA_CACHE_DIR to a "
                "directory this user can write, and run the job with the same NUMBA_CACHE_DIR"
            ) from None
    return f"{configured} (NUMBA_CACHE_DIR)" if configured else ", ".join(map(str, folders))


def _warm_in_processes(jobs: int, *, as_json: bool) -> dict[str, tuple[float, float]]:
    """Each family in a spawned process of a pool of ``jobs``, the costliest first
    (:attr:`~seqpack.cli.warm.Family.order`), a line as each one ends (numba writes a cache
    file under a temporary name and renames it, so processes compiling one helper at once
    leave a whole file)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from seqpack.cli.warm import FAMILIES, plan_family

    timings: dict[str, tuple[float, float]] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_quiet) as pool:
        families = sorted(FAMILIES, key=lambda family: family.order)
        futures = {pool.submit(plan_family, family.name): family for family in families}
        for future in as_completed(futures):
            family = futures[future]
            timings[family.name] = future.result()  # a family's error (a broken numba) propagates
            if not as_json:
                print(f"{_line(family)} {timings[family.name][0]:.1f} s", flush=True)
    return timings


def _line(family: Family) -> str:
    """The start of ``family``'s line: its name and kernels (its time follows)."""
    return f"  {family.name + ':':<28} {family.kernels} ..."


def _quiet() -> None:
    """No compile notice (:mod:`seqpack.schedulers._kernels`): ``--warm`` says what compiles."""
    logging.getLogger("seqpack.schedulers._kernels").setLevel(logging.ERROR)
