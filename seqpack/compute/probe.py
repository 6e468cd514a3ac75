"""Import a module in a child Python and report what happened, whatever it does: the probes
behind ``seqpack doctor`` (:func:`seqpack.compute.backends.environment_report`). A package
that raises, calls ``sys.exit``, aborts, segfaults or hangs on import (a broken native build)
is reported instead of taking the caller down. Standard library only."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["PROBE_TIMEOUT", "probe_import", "probe_imports"]

PROBE_TIMEOUT = 180.0  # seconds one isolated import may take (TE's first import compiles nothing, but loads a lot)
_PROBE_MARK = "@@seqpack-probe@@"
_PROBE = r"""
import importlib, json, sys
module, attrs, mark = sys.argv[1], sys.argv[2].split(",") if sys.argv[2] else [], sys.argv[3]
out = {"imports": False, "error": None, "version": None, "attrs": {}}
try:
    imported = importlib.import_module(module)
    out["imports"] = True
    out["version"] = getattr(sys.modules[module.split(".")[0]], "__version__", None)
    out["attrs"] = {a: hasattr(imported, a) for a in attrs}
except BaseException as exc:  # SystemExit and KeyboardInterrupt from a broken package too
    text = (str(exc).strip().splitlines() or [""])[0]
    out["error"] = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
# The child answers its parent on stdout (a protocol line, not a message to a user).
sys.stdout.write(mark + json.dumps(out, default=str) + "\n")
sys.stdout.flush()
"""


def probe_import(module: str, attrs: tuple[str, ...] = (), timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """Import ``module`` in a child Python and report what happened, whatever it does.

    Returns:
        ``{"imports": bool, "error": str | None, "version": str | None, "attrs": {name: bool}}``;
        ``error`` says how the child died when it did (the signal, or the exit status and the
        last line it wrote).
    """
    command = [sys.executable, "-c", _PROBE, module, ",".join(attrs), _PROBE_MARK]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"imports": False, "error": f"importing {module} did not finish within {timeout:g} s", "version": None,
                "attrs": {}}  # fmt: skip
    for line in reversed(done.stdout.splitlines()):
        at = line.find(_PROBE_MARK)  # the package may have written to stdout without a newline
        if at >= 0:
            return dict(json.loads(line[at + len(_PROBE_MARK) :]))
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else "?"
        how = f"killed the process (signal {-done.returncode}, {name})"
    else:
        how = f"ended the process with exit status {done.returncode}"
    last = (done.stderr.strip().splitlines() or [""])[-1][:200]
    return {"imports": False, "error": f"importing {module} {how}" + (f": {last}" if last else ""), "version": None,
            "attrs": {}}  # fmt: skip


def probe_imports(
    wanted: Sequence[tuple[str, tuple[str, ...]]], timeout: float = PROBE_TIMEOUT
) -> dict[str, dict[str, Any]]:
    """:func:`probe_import` of each ``(module, attrs)`` of ``wanted``, all at once (one
    child each): a package that hangs costs one ``timeout``, not one per package."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(wanted))) as pool:
        futures = {module: pool.submit(probe_import, module, attrs, timeout) for module, attrs in wanted}
    return {module: future.result() for module, future in futures.items()}
