"""A dependency-free progress bar for long CLI runs (stderr, one redrawn line)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


class Progress:
    """``with Progress(total, "simulate") as bar: bar.update(1, imbalance=1.002)``.

    Draws on a terminal; elsewhere (CI logs, pipes) prints a plain line every
    ``log_every`` seconds so long runs still show they are alive. ``enabled=False`` silences it.
    """

    def __init__(
        self,
        total: int,
        desc: str = "",
        *,
        stream: IO[str] | None = None,
        enabled: bool | None = None,
        width: int = 28,
        log_every: float = 10.0,
    ) -> None:
        self.total = max(int(total), 0)
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = True if enabled is None else bool(enabled)
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.log_every = log_every
        self.count = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._postfix = ""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.count += n
        if postfix:
            self._postfix = "  " + " ".join(f"{k}={_fmt(v)}" for k, v in postfix.items())
        now = time.perf_counter()
        interval = 0.1 if self.tty else self.log_every
        if self.count >= self.total or now - self._last_draw >= interval:
            self._draw(now)

    def _draw(self, now: float) -> None:
        if not self.enabled:
            return
        self._last_draw = now
        elapsed = now - self.start
        frac = self.count / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else 0.0
        line = f"{self.desc} [{bar}] {self.count}/{self.total} {elapsed:5.1f}s eta {eta:4.1f}s{self._postfix}"
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.total:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
