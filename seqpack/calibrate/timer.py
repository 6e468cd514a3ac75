"""MicrobatchTimer: measure each microbatch of a training step and report the times to the
step (``Step.record_times``) without a host sync on the hot path: CUDA events read once the
GPU has passed them (in practice during the next step), or ``time.perf_counter`` on CPU.
Usage: ``with timer.microbatch(step, m):`` around each microbatch's forward and backward,
``timer.flush()`` at the end (docs/cost_models.md, "Feeding times from the training loop").
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Protocol, TypeAlias

import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_int

__all__ = ["MicrobatchTimer"]


class _TimedStep(Protocol):
    num_microbatches: int

    def record_times(self, seconds_per_microbatch: list[float]) -> None: ...


# One timed microbatch: a (start, end) pair of CUDA events, or of perf_counter readings.
_Mark: TypeAlias = tuple[torch.cuda.Event, torch.cuda.Event] | tuple[float, float]


@dataclasses.dataclass
class _Pending:
    step: _TimedStep
    marks: list[_Mark | None]  # per microbatch; None until timed


class MicrobatchTimer:
    """Times microbatches and hands each finished step's times to ``step.record_times``.

    Args:
        device: ``"cuda"`` (CUDA events on the current stream), ``"cpu"``
            (``time.perf_counter``), or ``None``: CUDA when available.
        max_pending: Steps kept waiting for their CUDA events before the oldest is read
            with a blocking ``synchronize`` (the GPU is then that far behind anyway).
    """

    def __init__(self, device: str | torch.device | None = None, *, max_pending: int = 4) -> None:
        if device is None:
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            kind = torch.device(device).type
        if kind not in ("cuda", "cpu"):
            raise ConfigError(f"device must be 'cuda' or 'cpu', got {device!r}")
        if kind == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' but CUDA is not available; pass device='cpu'")
        self.device = kind
        self.max_pending = check_int("max_pending", max_pending, minimum=1)
        self._pending: list[_Pending] = []
        self.recorded = 0  # steps reported

    @contextlib.contextmanager
    def microbatch(self, step: _TimedStep, index: int) -> Iterator[None]:
        """Time microbatch ``index`` of ``step`` (the ``with`` body: forward and backward)."""
        if not callable(getattr(step, "record_times", None)):
            raise SeqpackTypeError(f"step must be a seqpack Step (with record_times), got {type(step).__name__}")
        index = check_int("index", index, minimum=0)
        if index >= step.num_microbatches:
            raise ConfigError(f"microbatch index {index} is out of range: the step has {step.num_microbatches}")
        entry = self._entry(step)
        self.poll()
        if self.device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            entry.marks[index] = (start, end)
        else:
            tick = time.perf_counter()
            yield
            entry.marks[index] = (tick, time.perf_counter())
        self.poll()

    def _entry(self, step: _TimedStep) -> _Pending:
        for entry in self._pending:
            if entry.step is step:
                return entry
        entry = _Pending(step, [None] * step.num_microbatches)
        self._pending.append(entry)
        return entry

    def poll(self) -> int:
        """Report every step whose microbatches are all timed and finished (non-blocking).

        Returns:
            Steps reported by this call.
        """
        done = 0
        while self._pending:
            entry = self._pending[0]
            if any(mark is None for mark in entry.marks):
                if len(self._pending) <= self.max_pending:
                    break
                # The oldest step never got all its microbatches timed: report what it has.
            elif not _finished(entry.marks[-1]):
                if len(self._pending) <= self.max_pending:
                    break
                _finished(entry.marks[-1], wait=True)  # the GPU is max_pending steps behind
            self._pending.pop(0)
            self._report(entry)
            done += 1
        return done

    def flush(self) -> int:
        """Report every pending step, waiting for the GPU (blocking: call it outside the
        hot path, e.g. before saving a checkpoint or at the end of training)."""
        done = 0
        while self._pending:
            entry = self._pending.pop(0)
            if self.device == "cuda":
                torch.cuda.synchronize()
            self._report(entry)
            done += 1
        return done

    def _report(self, entry: _Pending) -> None:
        # An untimed microbatch reports NaN: the calibrator skips it.
        seconds = [float("nan") if mark is None else _elapsed(mark) for mark in entry.marks]
        entry.step.record_times(seconds)
        self.recorded += 1


def _finished(mark: _Mark | None, *, wait: bool = False) -> bool:
    """Whether the GPU has passed the end of ``mark``; ``wait`` blocks until it has."""
    end = None if mark is None else mark[1]
    if not isinstance(end, torch.cuda.Event):
        return True
    if wait:
        end.synchronize()
    return bool(end.query())


def _elapsed(mark: _Mark) -> float:
    start, end = mark
    if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1e3
    assert isinstance(start, float) and isinstance(end, float)
    return end - start
