"""Switches that turn single stages of the balanced planner off, for the ablation
(``benchmarks/ablation.py``, docs/schedulers.md) and its tests.

Every stage is on in normal use; nothing in the library turns one off. Inside
``with stages.disabled("repair", ...)`` the planner skips the stages named, in this thread
or task only (a :class:`~contextvars.ContextVar`), so a benchmark can measure what each one
buys. :data:`STAGES` names them, each with what it is; the package docstring says what each
is worth.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from seqpack.errors import ConfigError

__all__ = ["STAGES", "disabled", "enabled"]

STAGES: dict[str, str] = {
    "round_targets": "per-round cost targets of the bins (step 2); off: every bin aims at the mean",
    "token_rules": "worst-fit and first-fit bins when the cost targets leave a sequence no room",
    "exact_search": "the bounded exact search when every bin rule fails at a microbatch count",
    "bin_completion": "bin completion inside the exact search (few sequences per bin)",
    "repair": "moves and swaps off the busiest replica (step 4)",
    "repair_bisection": "objective='both': bisecting how much slower the rounds may get",
    "replica_first": "sync='replica': the replica-first plan when the repaired grid is above its bound",
    "more_rounds": "trying more microbatches than the fewest that fit",
    "origin_order": "equally long sequences interleaved by the rank that holds them",
    "relabel": "replicas renamed to the rank holding most of their tokens",
    "per_replica": "locality: the per-replica layout",
    "home_swaps": "locality: the home swaps",
}

_OFF: ContextVar[frozenset[str]] = ContextVar("seqpack_balanced_stages_off", default=frozenset())


def enabled(stage: str) -> bool:
    """Whether ``stage`` (a key of :data:`STAGES`) runs."""
    return stage not in _OFF.get()


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Plan without the stages ``names`` inside the block (nested blocks add up).

    Raises:
        ConfigError: A name that is not a key of :data:`STAGES`.
    """
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise ConfigError(f"unknown balanced stage(s) {unknown}; valid: {', '.join(STAGES)}")
    token = _OFF.set(_OFF.get() | frozenset(names))
    try:
        yield
    finally:
        _OFF.reset(token)
