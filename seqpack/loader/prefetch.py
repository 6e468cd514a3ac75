"""Prefetch: a daemon thread that runs a wrapper's step production ahead of ``next()``.

:class:`Prefetcher` runs the producer on a thread, at most ``depth`` steps ahead, and hands
prepared steps over in order. :class:`Background` owns what an iterator must release (the
thread, the process groups made for it).
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from seqpack.collective.cp_groups import CpGroups
from seqpack.collective.groups import abandonable, destroy_groups
from seqpack.errors import ConfigError, SeqpackError
from seqpack.loader.step import Ready
from seqpack.validation import check_number

__all__ = ["Background", "Prefetcher", "check_seconds", "check_timeout"]


class Prefetcher:
    """Runs ``produce`` on a daemon thread, at most ``depth`` prepared steps ahead of
    :meth:`take`, in order, and none more while the waiting steps hold ``max_bytes`` or more.

    The thread holds the iterator only while it prepares a step (a weak reference
    otherwise), so an iterator dropped without ``close()`` is still garbage collected.
    """

    def __init__(self, produce: Callable[[], Ready], depth: int, name: str, max_bytes: int, *, first: int = 0) -> None:
        self._produce = weakref.WeakMethod(produce)
        self._index = first  # the step the thread prepares next (names a failure outside produce)
        self._depth = depth
        self._max_bytes = max_bytes
        self._bytes = 0  # tensor bytes of the steps in _ready
        self._cond = threading.Condition()
        self._ready: deque[Ready] = deque()
        self._stopping = False
        self._now = False  # stop without filling the slots (interpreter exit)
        self._done = False
        # CUDA's current device is per thread: prepare on the caller's, not on GPU 0.
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._cuda_device = torch.cuda.current_device() if cuda else None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _run(self) -> None:
        try:
            if self._cuda_device is not None:
                torch.cuda.set_device(self._cuda_device)
            while True:
                with self._cond:
                    # Even after stop() the thread fills its `depth` slots before it ends: the
                    # other ranks' threads prepare the same steps, and one a rank skipped would
                    # leave them waiting in its collectives.
                    while self._full() and not self._stopping:
                        self._cond.wait()
                    if len(self._ready) >= self._depth or self._now:
                        return
                produce = self._produce()
                if produce is None:  # the iterator was garbage collected
                    return
                try:
                    # Collectives poll, so that the exit hook can stop a thread whose peer
                    # hangs or died before the interpreter shuts down (see abandonable).
                    with abandonable(lambda: self._now):
                        item = produce()
                except BaseException as exc:  # handed to next(), which raises it
                    item = Ready(self._index, error=exc)
                del produce
                self._index = item.index + 1
                with self._cond:
                    self._ready.append(item)
                    self._bytes += item.nbytes
                    self._cond.notify_all()
                if item.step is None:  # the end of data or a failure: no step follows
                    return
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _full(self) -> bool:
        return len(self._ready) >= self._depth or (bool(self._ready) and self._bytes >= self._max_bytes)

    def take(self) -> Ready:
        """The next prepared step, waiting for it if needed."""
        with self._cond:
            while not self._ready:
                if self._done and self._stopping:  # close() from another thread while next() waited
                    raise SeqpackError("next() on a closed PackingIterator")
                if self._done:
                    raise RuntimeError("seqpack's prefetch thread ended without handing over the step")
                self._cond.wait()
            item = self._ready.popleft()
            self._bytes -= item.nbytes
            self._cond.notify_all()
            return item

    def stop(self, timeout: float, *, now: bool = False) -> bool:
        """Ask the thread to end (``now``: after the step in progress, else once its slots
        are full) and wait up to ``timeout`` seconds; True when it ended."""
        with self._cond:
            self._stopping = True
            self._now = self._now or now
            self._cond.notify_all()
        if timeout > 0 and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        alive = self._thread.is_alive()
        if not alive:
            with self._cond:  # prepared steps nobody will take: free their tensors
                self._ready.clear()
                self._bytes = 0
        return not alive


_LIVE: weakref.WeakSet[Prefetcher] = weakref.WeakSet()
_EXIT_SECONDS = 5.0


@atexit.register
def _stop_at_exit() -> None:
    # A daemon thread still running torch code while the interpreter and its C++ statics are
    # torn down can abort the process: stop every producer first, for a bounded time.
    live = list(_LIVE)
    for prefetcher in live:
        prefetcher.stop(0.0, now=True)
    deadline = time.monotonic() + _EXIT_SECONDS
    for prefetcher in live:
        prefetcher.stop(max(0.0, deadline - time.monotonic()), now=True)


class Background:
    """What an iterator must release: its producer thread and the process groups it
    created (shared with a ``weakref.finalize``). ``alone``: no other rank takes part, so the
    thread may stop after the step in progress. ``cp_groups``: marked released with ``groups``.
    """

    def __init__(self, groups: list[Any], *, alone: bool, cp_groups: CpGroups) -> None:
        self.groups = groups
        self.alone = alone
        self.cp_groups = cp_groups
        self.prefetcher: Prefetcher | None = None

    def release(self, timeout: float) -> bool:
        stopped = self.prefetcher.stop(timeout, now=self.alone) if self.prefetcher is not None else True
        groups, self.groups = self.groups, []
        self.cp_groups.released = True  # a held Step's to_origin says so instead of torch's error
        destroy_groups(groups)
        return stopped


def check_seconds(name: str, seconds: Any) -> float:
    """``seconds`` as a float in ``[0, threading.TIMEOUT_MAX]`` (the longest wait Python's
    locks take; past it ``join`` raises OverflowError)."""
    value = check_number(name, seconds, minimum=0.0)
    if value > threading.TIMEOUT_MAX:
        raise ConfigError(f"{name}={seconds!r} is too large (at most {threading.TIMEOUT_MAX:g} s)")
    return value


def check_timeout(timeout: Any) -> datetime.timedelta | None:
    """``group_timeout`` (seconds or a ``timedelta``) as a ``timedelta``; ``None`` stays."""
    if timeout is None:
        return None
    delta = isinstance(timeout, datetime.timedelta)
    seconds = timeout.total_seconds() if delta else check_number("group_timeout", timeout)
    if not seconds > 0:
        raise ConfigError(f"group_timeout must be a positive number of seconds, got {timeout!r}")
    check_seconds("group_timeout", seconds)
    return datetime.timedelta(seconds=seconds)
