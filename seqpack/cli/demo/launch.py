"""Start the demo's ranks: check what can be checked first, then spawn (or join torchrun)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import sys
from typing import Any

from seqpack.cli.demo.data import load_dataset
from seqpack.cli.demo.predict import format_prediction, predict
from seqpack.cli.demo.settings import DemoSettings
from seqpack.cli.demo.train import worker
from seqpack.cli.exit import CommandError, ExitCode, one_line
from seqpack.cli.files import check_output_file
from seqpack.cli.tables import format_demo_summary
from seqpack.errors import SeqpackError

__all__ = ["MALLOC_ENV", "launch", "preflight"]

# glibc returns freed memory to the OS past these thresholds and faults it back in on the
# next step, which makes timings depend on allocation history instead of on work
# (docs/compute.md). Ranks the demo spawns keep their heap (set them yourself under
# torchrun: they are read when a process starts).
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CommandError(
                f"--port {port} is already in use ({exc.strerror}); pass --port 0 to pick a free one"
            ) from None


def preflight(settings: DemoSettings) -> None:
    """Refuse, before any process starts, what would fail in every rank or only after
    training: an unwritable ``--json-out``, a bad or too small ``--data`` file, a busy ``--port``.

    Raises:
        CommandError, SampleError: Naming the flag and the value.
    """
    if settings.json_out:
        check_output_file("--json-out", settings.json_out)
    if settings.data not in ("mock", "stdlib"):
        load_dataset(settings)  # read once here too: a malformed file is one line, not a rank's traceback
    if settings.port and "RANK" not in os.environ:
        _check_port(settings.port)


def _spawned(local_rank: int, settings: DemoSettings, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=local_rank,
        world_size=settings.world_size,
        timeout=datetime.timedelta(seconds=settings.timeout_s),
    )
    try:
        _run_rank(settings)
    except SeqpackError as err:  # bad data only a rank could see: one line, and exit 2 for the launcher
        print(f"seqpack demo: rank {local_rank}: error: {one_line(err)}", file=sys.stderr, flush=True)
        sys.exit(ExitCode.USAGE)
    # Done: its groups are destroyed and its output written. Leave without tearing the
    # interpreter and torch's C++ statics down: that teardown can abort a finished rank
    # ("terminate called without an active exception", exit -6; about one --cp 2 run in 50).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ExitCode.OK)


def _run_rank(settings: DemoSettings) -> None:
    """This rank's whole demo, then a clean teardown (``torch.distributed`` initialised)."""
    import torch.distributed as dist

    try:
        results = worker(settings)
        dist.barrier()  # nobody tears gloo down while a peer still finishes its last collective
        if results is not None:
            _finish(results, settings)
    finally:
        dist.destroy_process_group()


def _finish(results: list[dict[str, Any]], settings: DemoSettings) -> None:
    prediction = predict(settings) if settings.predict_dp else []
    if not settings.quiet:
        print(format_demo_summary(results, settings), flush=True)
        if prediction:
            print(format_prediction(prediction, settings), flush=True)
    if settings.json_out:
        with open(settings.json_out, "w") as f:
            report = {"settings": dataclasses.asdict(settings), "results": results, "gpu_prediction": prediction}
            json.dump(report, f, indent=2)


def launch(settings: DemoSettings) -> int:
    """Run the demo: under torchrun (``RANK`` set) as this rank, else spawn all ranks.

    Returns:
        The exit status: 0, 1 when a rank crashed or was killed, 2 when a rank refused its
        data (the rank printed the one-line reason).

    Raises:
        SeqpackError: A mistake :func:`preflight` finds, before any process starts.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    preflight(settings)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=settings.timeout_s))
        _run_rank(settings)
        return ExitCode.OK
    port = settings.port or _free_port()
    if not settings.quiet:
        print(
            f"seqpack demo: {settings.world_size} CPU processes (dp={settings.dp} x cp={settings.cp}, gloo on "
            f"127.0.0.1:{port}), data={settings.data}, modes={', '.join(settings.modes)}",
            flush=True,
        )
    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)
    try:
        mp.start_processes(_spawned, args=(settings, port), nprocs=settings.world_size, join=True, start_method="spawn")
    except mp.ProcessRaisedException as exc:
        print(f"seqpack demo failed: a rank raised an error:\n{exc}", file=sys.stderr)
        return ExitCode.FAILED
    except mp.ProcessExitedException as exc:
        if exc.exit_code == ExitCode.USAGE:
            return ExitCode.USAGE
        print(
            f"seqpack demo failed: rank {exc.error_index} died (exit code {exc.exit_code}); the others were stopped",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    return ExitCode.OK
