"""Schedulers: which sequence goes to which DP replica and microbatch.

``get_scheduler(name, **options)`` returns a :class:`Scheduler`; ``register_scheduler``
adds one under a new name. Modules:

- ``schedule``: :class:`Schedule` (one step's plan: rounds x CP groups x ids; static CP is
  the case whose groups are the replicas' CP blocks) and :class:`ScheduleLimits`;
  ``schedule_checks``: its invariants, one check each; ``group_sizes``: the sizes a
  dynamic-CP group may have.
- ``request``: what :meth:`Scheduler.schedule` checks before planning (lengths, origins,
  sizes, the oversize policy); ``base``: the :class:`Scheduler` and :class:`GridScheduler`
  (static-CP planners) base classes.
- ``step_time``: what a plan's microbatches cost and :func:`predicted_step_time`;
  ``objective``: the reductions of a plan's costs under each sync and their lower bounds.
- ``balanced`` (package): the default FLOPs-aware planner; ``dp_balanced``, ``empty``.
- ``dynamic_cp`` (package): plans whose CP groups change per microbatch round; its
  ``scheduler`` module registers them as ``"dynamic_cp"`` (a :class:`DynamicCpScheduler`).
- ``sample_groups``: RL groups kept on one replica; ``minibatches``: one step of several
  optimizer steps; ``join``: plans run one after the other.
- ``_kernels``: the numba kernels behind them (private; compiled once, cached on disk).
"""

from __future__ import annotations

import inspect

from seqpack.errors import ConfigError
from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.schedulers.base import GridScheduler, Scheduler
from seqpack.schedulers.dp_balanced import DpBalancedScheduler
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.empty import EmptyScheduler
from seqpack.schedulers.request import ON_OVERSIZE, apply_oversize, as_lengths
from seqpack.schedulers.schedule import Schedule, ScheduleLimits
from seqpack.schedulers.static_limits import static_shapes_by_cost
from seqpack.schedulers.step_time import predicted_step_time

_REGISTRY: dict[str, type[Scheduler]] = {}


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    """Class decorator: make ``cls`` available to :func:`get_scheduler` under ``cls.name``."""
    if not cls.name:
        raise ConfigError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def available_schedulers(*, dynamic_cp: bool = False) -> list[str]:
    """Names :func:`get_scheduler` accepts whose plans are static CP; with ``dynamic_cp=True``
    also those planning dynamic CP (``"dynamic_cp"``)."""
    return sorted(name for name, cls in _REGISTRY.items() if dynamic_cp or not issubclass(cls, DynamicCpScheduler))


def get_scheduler(name: str | Scheduler = "balanced", **options: object) -> Scheduler:
    """The scheduler registered as ``name``, built with ``options``.

    Args:
        name: ``"balanced"`` (default), ``"dp_balanced"``, ``"empty"``, ``"dynamic_cp"`` (CP
            groups per microbatch round) or another registered name; a Scheduler instance is
            returned as is.
        **options: Keyword arguments of the scheduler's class (e.g. ``order="pipeline"``).

    Raises:
        ValueError: Unknown name, or options given with an instance.
    """
    if isinstance(name, Scheduler):
        if options:
            raise ConfigError("options cannot be given with a Scheduler instance")
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        names = ", ".join(available_schedulers(dynamic_cp=True))
        raise ConfigError(f"unknown scheduler {name!r}; available: {names}")
    cls = _REGISTRY[name]
    try:
        inspect.signature(cls).bind(**options)
    except TypeError:
        valid = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        unknown = sorted(set(options) - set(valid))
        raise ConfigError(f"unknown option(s) {unknown} of scheduler {name!r}; valid: {', '.join(valid)}") from None
    return cls(**options)


register_scheduler(BalancedScheduler)
register_scheduler(DpBalancedScheduler)
register_scheduler(EmptyScheduler)
register_scheduler(DynamicCpScheduler)

__all__ = [
    "ON_OVERSIZE",
    "GridScheduler",
    "Schedule",
    "ScheduleLimits",
    "Scheduler",
    "BalancedScheduler",
    "DpBalancedScheduler",
    "DynamicCpScheduler",
    "EmptyScheduler",
    "apply_oversize",
    "as_lengths",
    "available_schedulers",
    "get_scheduler",
    "plan_dynamic_cp",
    "predicted_step_time",
    "register_scheduler",
    "static_shapes_by_cost",
]
