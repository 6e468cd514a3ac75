"""Progress bars for long commands, drawn by tqdm on stderr.

On a terminal :class:`Progress` is a tqdm bar. Elsewhere (a CI log, a pipe) a bar redrawn
with ``\\r`` would be one endless line, so it writes a plain line (tqdm's own formatting)
every ``log_every`` seconds and at the end: long runs still show they are alive.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tqdm import tqdm

__all__ = ["Progress"]


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Progress:
    """``with Progress(total, "simulate") as bar: bar.update(1, imbalance=1.002)``.

    Args:
        total: Units of work.
        desc: Label in front of the bar.
        stream: Where to draw (default stderr).
        enabled: ``False`` draws nothing.
        log_every: Seconds between plain lines when ``stream`` is not a terminal.
    """

    def __init__(
        self,
        total: int,
        desc: str = "",
        *,
        stream: IO[str] | None = None,
        enabled: bool = True,
        log_every: float = 10.0,
    ) -> None:
        self.total = max(int(total), 0)
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every = log_every
        self.count = 0
        self._format = "{desc} [{bar:28}] {n_fmt}/{total_fmt} {elapsed} eta {remaining}{postfix}"
        self._postfix = ""
        self._start = time.perf_counter()
        self._last_line = self._start
        self._bar: tqdm | None = None
        if self.enabled and self.tty:
            self._bar = tqdm(
                total=self.total, desc=desc, file=self.stream, bar_format=self._format, mininterval=0.1, leave=True
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """``n`` more units done; ``postfix`` values are shown after the bar (``key=value``).
        With ``n=0`` they say what the next unit is doing, drawn at once on a terminal."""
        self.count += n
        if postfix:
            self._postfix = " ".join(f"{k}={_fmt(v)}" for k, v in postfix.items())
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(self._postfix, refresh=n == 0)
            self._bar.update(n)
            return
        now = time.perf_counter()
        if self.enabled and (self.count >= self.total or now - self._last_line >= self.log_every):
            self._last_line = now
            line = tqdm.format_meter(
                self.count, self.total, now - self._start, prefix=self.desc, bar_format=self._format,
                postfix=self._postfix or None, ascii=True,
            )  # fmt: skip
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
