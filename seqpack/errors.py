"""The exceptions seqpack raises.

Every error caused by a user's input (an argument, a sample, a saved state, a CLI flag) is a
:class:`SeqpackError`, which is a ``ValueError``, so ``except ValueError`` keeps working;
wrong types are :class:`SeqpackTypeError`, which is also a ``TypeError``. Anything else that
escapes seqpack is a bug.

In the distributed wrapper a failure on one rank becomes :class:`StepFailed` on *every*
rank (the same message everywhere, agreed in one collective); on the rank that failed, the
original exception is its ``__cause__``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "ResumeError",
    "SampleError",
    "ScheduleError",
    "SeqpackError",
    "SeqpackTypeError",
    "StepFailed",
    "WireError",
]


class SeqpackError(ValueError):
    """Base class: a user's mistake or bad data, reported with the bad value named."""


class SeqpackTypeError(SeqpackError, TypeError):
    """An argument or sample field of the wrong type."""


class ConfigError(SeqpackError):
    """An argument or option out of range, or options that contradict each other."""


class SampleError(SeqpackError):
    """A sample that breaks the sample contract (keys, shapes, dtypes, values)."""


class ScheduleError(SeqpackError):
    """Lengths that cannot be scheduled as asked (an oversize sequence, too few microbatches)."""


class ResumeError(SeqpackError):
    """A saved state that does not fit the iterator it is loaded into."""


class WireError(SeqpackError):
    """A broadcast message that is corrupt or from another seqpack version."""


class StepFailed(SeqpackError):
    """A step of the wrapper failed on some rank; raised identically on every rank.

    Attributes:
        step: Index of the step that failed (0-based), or ``None`` at construction.
        rank: Global rank where the failure happened, or ``None`` when not known
            (a disagreement between ranks has no single culprit).
        reason: The failing rank's message, without the step prefix.
    """

    def __init__(self, message: str, *, step: int | None = None, rank: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.rank = rank
        self.reason = message

    def __reduce__(self) -> tuple[Any, tuple[str, int | None, int | None]]:
        """Keep ``step`` and ``rank`` through pickling (``all_gather_object``, spawn)."""
        return (_rebuild_step_failed, (self.reason, self.step, self.rank))


def _rebuild_step_failed(message: str, step: int | None, rank: int | None) -> StepFailed:
    return StepFailed(message, step=step, rank=rank)


_BY_NAME: dict[str, type[SeqpackError]] = {
    cls.__name__: cls
    for cls in (ConfigError, ResumeError, SampleError, ScheduleError, SeqpackError, SeqpackTypeError, WireError)
}


def typed_message(exc: BaseException) -> str:
    """``exc`` as one line that keeps its seqpack type (``"SeqpackTypeError: ..."``), for an
    agreement that carries only text; :func:`from_typed_message` rebuilds it on every rank."""
    name = type(exc).__name__ if type(exc).__name__ in _BY_NAME else "ConfigError"
    return f"{name}: {exc}"


def from_typed_message(message: str) -> SeqpackError:
    """The exception a :func:`typed_message` describes (a :class:`ConfigError` for other text)."""
    name, sep, text = message.partition(": ")
    cls = _BY_NAME.get(name) if sep else None
    return cls(text) if cls is not None else ConfigError(message)
