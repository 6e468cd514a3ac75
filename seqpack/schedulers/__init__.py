"""Schedulers: which sequence goes to which DP replica, microbatch and CP group.

``get_scheduler(name, **options)`` returns a :class:`Scheduler` (``registry``; this package
registers the built-in ones). A plan is a :class:`Schedule` (``schedule``; its invariants in
``schedule_checks``) made from one checked :class:`Request` (``request``). Planners:
``balanced`` (the default), ``dp_balanced``, ``empty`` (static CP, on ``base``'s
:class:`GridScheduler`) and ``dynamic_cp`` (CP groups per microbatch round). Around them:
``step_time`` and ``objective`` (what a plan costs under each sync), ``shape_limits`` and
``bucket_ladder`` (static shapes), ``sample_groups``, ``minibatches`` and ``join`` (RL), and
``_kernels`` (the numba kernels, private).
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
from seqpack.schedulers.request import Request, apply_oversize, as_lengths
from seqpack.schedulers.schedule import Schedule, ScheduleLimits
from seqpack.schedulers.step_time import predicted_step_time

register_scheduler(BalancedScheduler)
register_scheduler(DpBalancedScheduler)
register_scheduler(EmptyScheduler)
register_scheduler(DynamicCpScheduler)

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
