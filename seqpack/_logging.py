"""Logging helpers: the library logs through ``logging.getLogger(__name__)`` and never prints.

:func:`warn_once` reports a condition (a missing fast path, a fallback) the first time it
happens in a process, not at every call.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["warn_once"]

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()


def warn_once(logger: logging.Logger, key: str, message: str, *args: object) -> bool:
    """Log ``message % args`` at warning level once per ``(logger, key)``.

    Returns:
        True when this call logged, False when the key was already reported.
    """
    with _lock:
        if (logger.name, key) in _seen:
            return False
        _seen.add((logger.name, key))
    logger.warning(message, *args)
    return True


def reset_warn_once() -> None:
    """Forget what :func:`warn_once` reported (for tests)."""
    with _lock:
        _seen.clear()
