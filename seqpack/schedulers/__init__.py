"""Schedulers: which sequence goes to which DP replica and microbatch.

``get_scheduler(name, **options)`` returns a :class:`Scheduler`; ``register_scheduler``
adds one under a new name (both live in ``registry``; this package registers the built-in
ones). Modules:

- ``schedule``: :class:`Schedule` (one step's plan: rounds x CP groups x ids; static CP is
  the case whose groups are the replicas' CP blocks) and :class:`ScheduleLimits`;
  ``schedule_checks``: its invariants, one check each; ``group_sizes``: the sizes a
  dynamic-CP group may have.
- ``request``: the :class:`Request` every planner takes (built and checked once by
  :meth:`Scheduler.schedule`) and the oversize policy; ``base``: the :class:`Scheduler` and
  :class:`GridScheduler` (static-CP planners) base classes.
- ``step_time``: what a plan's microbatches cost and :func:`predicted_step_time`;
  ``objective``: the reductions of a plan's costs under each sync and their lower bounds.
- ``balanced`` (package): the default FLOPs-aware planner; ``dp_balanced``, ``empty``.
- ``dynamic_cp`` (package): plans whose CP groups change per microbatch round; its
  ``scheduler`` module registers them as ``"dynamic_cp"`` (a :class:`DynamicCpScheduler`).
- ``shape_limits``: what static shapes ask of a plan (the sequence limit, the buckets);
  ``bucket_ladder``: :func:`static_shapes_by_cost` (buckets chosen by predicted step time).
- ``sample_groups``: RL groups kept on one replica; ``minibatches``: one step of several
  optimizer steps; ``join``: plans run one after the other.
- ``_kernels``: the numba kernels behind them (private; compiled once, cached on disk).
"""

from __future__ import annotations

from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.schedulers.base import GridScheduler, Scheduler
from seqpack.schedulers.bucket_ladder import static_shapes_by_cost
from seqpack.schedulers.dp_balanced import DpBalancedScheduler
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.empty import EmptyScheduler
from seqpack.schedulers.registry import available_schedulers, get_scheduler, register_scheduler
from seqpack.schedulers.request import ON_OVERSIZE, Request, apply_oversize, as_lengths
from seqpack.schedulers.schedule import Schedule, ScheduleLimits
from seqpack.schedulers.step_time import predicted_step_time

register_scheduler(BalancedScheduler)
register_scheduler(DpBalancedScheduler)
register_scheduler(EmptyScheduler)
register_scheduler(DynamicCpScheduler)

__all__ = [
    "ON_OVERSIZE",
    "GridScheduler",
    "Request",
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
