"""``seqpack doctor``: which compute paths this machine can run, and why not; with
``--warm``, compile the scheduler kernels into numba's disk cache ahead of a job."""

from __future__ import annotations

import argparse
import json
import time

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
        help="compile every scheduler kernel into numba's disk cache and exit (about a minute with an empty "
        "cache, a few seconds when it is warm); run it with the job's NUMBA_CACHE_DIR",
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.warm:
        return _warm(as_json=args.json)
    from seqpack.compute.backends import environment_report, format_environment_report

    report = environment_report()
    print(json.dumps(report, indent=1) if args.json else format_environment_report(report))
    return 0


def _warm(*, as_json: bool) -> int:
    """Plan every kernel family's small step (:mod:`seqpack.cli.warm`), one line each."""
    from seqpack.cli.warm import FAMILIES
    from seqpack.schedulers._kernels import compile_note

    compile_note.silence()  # the lines below say what compiles
    where = compile_note.cache_location()
    if not as_json:
        print(
            f"compiling seqpack's scheduler kernels with numba (about {compile_note.COLD_COMPILE_SECONDS} s of CPU "
            "with an empty cache, seconds when it is warm)",
            flush=True,
        )
    families = []
    start, start_cpu = time.perf_counter(), time.process_time()
    for family in FAMILIES:
        if not as_json:
            print(f"  {family.name + ':':<28} {family.kernels} ...", end="", flush=True)
        took, took_cpu = time.perf_counter(), time.process_time()
        try:
            family.plan()
        except BaseException:  # a broken numba (a ConfigError naming it) or Ctrl-C: end the line first
            if not as_json:
                print(" failed", flush=True)
            raise
        took, took_cpu = time.perf_counter() - took, time.process_time() - took_cpu
        families.append({"family": family.name, "kernels": family.kernels, "seconds": took, "cpu_seconds": took_cpu})
        if not as_json:
            print(f" {took:.1f} s", flush=True)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    if as_json:
        summary = {"cache": where, "seconds": seconds, "cpu_seconds": cpu_seconds, "families": families}
        print(json.dumps(summary, indent=1))
    else:
        print(f"done in {seconds:.1f} s ({cpu_seconds:.1f} s of CPU); cache: {where}")
    return 0
