"""Persistent gloo worker pools for multi-process tests on CPU.

Spawning processes and importing torch costs seconds, so a pool of ``world_size`` workers
is started once (per world size, per test session) and runs many test functions. Each
worker joins one gloo process group; ``pool.run(fn, *args)`` calls ``fn(*args)`` on every
rank (``torch.distributed`` already initialised) and returns the per-rank results, or
raises :class:`RankFailure` carrying every failing rank's traceback.

``fn`` must be importable by the workers: a module-level function of a module on
``sys.path`` (test modules are; the children get the parent's ``sys.path``). A rank that does
not finish within ``timeout`` seconds (a hang in a collective, say) fails the call; the
pool is then torn down and the next call starts a fresh one.
"""

from __future__ import annotations

import importlib
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

_STOP = "__stop__"

# Objects a task may cache for its own calls (meshes, topologies); cleared after every task,
# because the process groups they hold are destroyed then (_destroy_groups_since).
TASK_CACHE: dict[Any, Any] = {}


class RankFailure(RuntimeError):
    """One or more ranks raised (or hung). ``errors`` maps rank to (type name, message, traceback)."""

    def __init__(self, errors: dict[int, tuple[str, str, str]]):
        self.errors = errors
        text = "\n".join(f"--- rank {r}: {name}: {msg}\n{tb}" for r, (name, msg, tb) in sorted(errors.items()))
        super().__init__(f"{len(errors)} rank(s) failed:\n{text}")


def _resolve(module: str, qualname: str) -> Callable[..., Any]:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker(rank: int, world_size: int, store_path: str, tasks, results, threads: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.setdefault("SEQPACK_TEST_WORKER", "1")
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    # Every task ends with a gc.collect() (_destroy_groups_since). Over the objects torch and
    # seqpack made at import that costs about 90 ms a rank, 0.2 s a task on 2 cores: move
    # them to the permanent generation, so the collect scans only what tasks made.
    import gc

    gc.freeze()
    try:
        while True:
            task = tasks.get()
            if task == _STOP:
                break
            call_id, module, qualname, args, kwargs = task
            before = _groups()
            try:
                fn = _resolve(module, qualname)
                answer = (call_id, rank, True, fn(*args, **kwargs))
            except BaseException as exc:  # report everything, keep serving
                answer = (call_id, rank, False, (type(exc).__name__, str(exc), traceback.format_exc()))
            _destroy_groups_since(before)
            results.put(answer)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _groups() -> set[Any]:
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


def _destroy_groups_since(before: set[Any]) -> None:
    """Destroy the process groups a task made. Every gloo group keeps a TCP loop thread and two
    run-loop threads that wake up while idle: left alive, the groups of a few hundred tests
    cost the workers most of a core. The barrier first: no rank drops a group a peer is still
    using."""
    import gc

    import torch.distributed as dist

    TASK_CACHE.clear()
    gc.collect()  # a task's wrappers and their groups are garbage now
    dist.barrier()
    for pg in _groups() - before:
        dist.destroy_process_group(pg)


def context() -> Any:
    """The multiprocessing context that starts test processes: a fork server that imported
    torch and seqpack once, so that a process starts in a fraction of a second instead of
    importing them again (seconds of CPU each). A process gets the parent's ``sys.path`` as a
    spawned one does, and the fork server's modules and environment (as they were when the
    first call started it; its PYTHONPATH holds the test folders)."""
    ctx = mp.get_context("forkserver")
    # `import seqpack` alone imports nothing (its face is lazy): preload what the tasks run,
    # and the default planner's kernels and FSDP2 (forkserver_preload).
    ctx.set_forkserver_preload(
        ["torch", "torch.distributed", "seqpack.loader", "seqpack.compute", "harness", "forkserver_preload"]
    )
    _start_fork_server()
    return ctx


def _start_fork_server() -> None:
    """Start the fork server (once) with the test folders on its PYTHONPATH: it is a new
    interpreter that sees this process's environment but not its ``sys.path`` (Python 3.11's
    ``multiprocessing.forkserver.main`` ignores the ``sys_path`` it is handed), and it skips
    a preload module it cannot import without a word."""
    from multiprocessing import forkserver

    here = os.path.dirname(os.path.abspath(__file__))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here)] + ([before] if before else []))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


class WorkerPool:
    """``world_size`` gloo workers that run test functions on every rank."""

    def __init__(self, world_size: int, *, timeout: float = 120.0, threads: int = 1):
        self.world_size = world_size
        self.timeout = timeout
        self._ctx = context()
        self._dir = tempfile.TemporaryDirectory(prefix="seqpack-gloo-")
        store_path = os.path.join(self._dir.name, "store")
        self._tasks = [self._ctx.Queue() for _ in range(world_size)]
        self._results = self._ctx.Queue()
        self._procs = [
            self._ctx.Process(
                target=_worker,
                args=(rank, world_size, store_path, self._tasks[rank], self._results, threads),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for proc in self._procs:
            proc.start()
        self._next_id = 0
        self.broken = False

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return results in rank order."""
        if self.broken:
            raise RuntimeError("worker pool is broken (an earlier call hung or a worker died)")
        self._next_id += 1
        call_id = self._next_id
        for q in self._tasks:
            q.put((call_id, fn.__module__, fn.__qualname__, args, kwargs))
        values: dict[int, Any] = {}
        errors: dict[int, tuple[str, str, str]] = {}
        limit = self.timeout if timeout is None else timeout
        while len(values) + len(errors) < self.world_size:
            try:
                got_id, rank, ok, payload = self._results.get(timeout=limit)
            except queue.Empty:
                missing = sorted(set(range(self.world_size)) - set(values) - set(errors))
                for rank in missing:
                    alive = self._procs[rank].is_alive()
                    errors[rank] = ("Timeout", f"no answer within {limit}s (process alive: {alive})", "")
                self.close(force=True)
                raise RankFailure(errors) from None
            if got_id != call_id:
                continue  # a late answer to an earlier, timed-out call
            if ok:
                values[rank] = payload
            else:
                errors[rank] = payload
        if errors:
            raise RankFailure(errors)
        return [values[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        if not force and not self.broken:
            for q in self._tasks:
                q.put(_STOP)
            for proc in self._procs:
                proc.join(timeout=10)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self.broken = True
        self._dir.cleanup()


class PoolRegistry:
    """One live pool per world size, replaced when broken."""

    def __init__(self) -> None:
        self._pools: dict[int, WorkerPool] = {}

    def get(self, world_size: int) -> WorkerPool:
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            pool = WorkerPool(world_size)
            self._pools[world_size] = pool
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            if not pool.broken:
                pool.close()
        self._pools.clear()


# -- Scripts on N ranks, as torchrun starts them ----------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _script_rank(script: str, argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """One rank: the environment torchrun gives a worker, the output to files, then the
    script as ``__main__`` with its arguments (as ``python script argv`` runs it)."""
    import runpy
    import sys

    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.environ.update(env)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


def run_script(script: str, argv: list[str], *, nproc: int, timeout: float = 300.0) -> str:
    """Run ``script`` on ``nproc`` ranks the way ``torchrun --standalone --nproc-per-node
    nproc`` does: each rank its own process, with RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, running the script as ``__main__``.

    The processes are forked from the fork server (:func:`context`), which imported torch and
    seqpack once, instead of each importing them again (torchrun's agent and every rank cost
    about 3 s of CPU each before the script's first line). Returns the ranks' stdout in rank
    order; raises AssertionError with each failing rank's output if a rank exits non-zero or
    the run outlives ``timeout``."""
    import time

    ctx = context()
    port = str(_free_port())
    with tempfile.TemporaryDirectory(prefix="seqpack-script-") as folder:
        outputs = [(os.path.join(folder, f"{r}.out"), os.path.join(folder, f"{r}.err")) for r in range(nproc)]
        procs = []
        for rank, (out, err) in enumerate(outputs):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
            }
            proc = ctx.Process(target=_script_rank, args=(os.path.abspath(script), argv, env, out, err))
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        texts = [(_read(out), _read(err)) for out, err in outputs]
    failed = [rank for rank, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        killed = " (killed after the timeout)"
        report = "\n".join(
            f"--- rank {rank}: exit code {procs[rank].exitcode}{killed if rank in hung else ''}\n"
            f"{texts[rank][0][-2000:]}\n{texts[rank][1][-4000:]}"
            for rank in failed
        )
        raise AssertionError(f"{script} failed on {len(failed)} of {nproc} ranks:\n{report}")
    return "".join(out for out, _ in texts)


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()
