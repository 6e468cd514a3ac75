"""Schedulers: which sequence goes to which DP replica, microbatch and CP group
(docs/schedulers.md). :func:`get_scheduler` returns a :class:`Scheduler` (this package registers
the built-in ones), whose plan is a :class:`Schedule` made from one checked :class:`Request`."""

from __future__ import annotations

from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.schedulers.base import GridScheduler, Scheduler
from seqpack.schedulers.bucket_ladder import static_shapes_by_cost
from seqpack.schedulers.dp_balanced import DpBalancedScheduler
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler
from seqpack.schedulers.empty import EmptyScheduler
from seqpack.schedulers.registry import available_schedulers, get_scheduler, register_scheduler
from seqpack.schedulers.request import Request, apply_oversize, as_lengths
from seqpack.schedulers.schedule import Schedule, ScheduleLimits
from seqpack.schedulers.step_time import predicted_step_time

for _scheduler in (BalancedScheduler, DpBalancedScheduler, EmptyScheduler, DynamicCpScheduler):
    register_scheduler(_scheduler)

__all__ = [
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
