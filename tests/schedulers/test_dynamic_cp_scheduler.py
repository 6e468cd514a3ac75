"""The ``"dynamic_cp"`` scheduler: ``get_scheduler("dynamic_cp")`` plans what
``plan_dynamic_cp`` plans, and ``PackingConfig(scheduler="dynamic_cp")`` is
``PackingConfig(dynamic_cp=True)`` (same fingerprint, same steps) or refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqpack.cost import CostModel, GroupCost
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import PackingConfig
from seqpack.options import GroupSizes
from seqpack.schedulers import DynamicCpScheduler, Schedule, available_schedulers, get_scheduler
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.topology import Topology

COMPUTE = CostModel(1.0, 1e-3, 1e-5)
COST = GroupCost(COMPUTE, ring_step=0.5, ring_token=2e-3, ranks_per_node=4)
LENGTHS = np.array([230, 40, 7, 33, 61, 5, 18, 64, 2, 50])


def test_it_plans_what_plan_dynamic_cp_plans():
    assert "dynamic_cp" in available_schedulers(dynamic_cp=True) and "dynamic_cp" not in available_schedulers()
    args = {"dp_size": 2, "cp_size": 2, "max_tokens_per_rank": 64, "pad_multiple": 2}
    for sizes, sync in [(None, "lockstep"), ("any", "replica")]:
        scheduler = get_scheduler("dynamic_cp", group_sizes=sizes, group_cost=COST)
        origin = np.repeat([1, 0], 5)
        plan = scheduler.schedule(LENGTHS, origin=origin, sync=sync, **args)  # type: ignore[arg-type]
        assert isinstance(plan, Schedule) and plan.origin.tolist() == origin.tolist()
        plan.validate()
        same = plan_dynamic_cp(
            LENGTHS,
            cost=COST,
            sync=sync or "lockstep",
            group_sizes=sizes or "pow2",
            **args,  # type: ignore[arg-type]
        )
        assert plan.fingerprint() == same.fingerprint() and plan.group_sizes == (sizes or "pow2")
    # A cost given to schedule() wins over the scheduler's (a calibrated one, in the loader).
    free = get_scheduler("dynamic_cp", group_cost=COST).schedule(LENGTHS, cost=COMPUTE, **args)
    assert free.fingerprint() == plan_dynamic_cp(LENGTHS, cost=COMPUTE, **args).fingerprint()
    assert get_scheduler("dynamic_cp", group_cost=COST).resolve_cost(None) == COST  # stats in the group cost


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"group_sizes": "odd"}, ConfigError, "group_sizes must be one of"),
        ({"group_cost": COMPUTE}, SeqpackTypeError, "group_cost of scheduler 'dynamic_cp' must be a .*GroupCost"),
        ({"order": "pipeline"}, ConfigError, r"unknown option\(s\) \['order'\] of scheduler 'dynamic_cp'"),
    ],
)
def test_bad_options_are_named(options, error, message):
    with pytest.raises(error, match=message):
        get_scheduler("dynamic_cp", **options)


def test_it_needs_a_cost():
    with pytest.raises(ConfigError, match="scheduler 'dynamic_cp' needs a group cost"):
        DynamicCpScheduler().schedule(LENGTHS, dp_size=2, max_tokens_per_rank=64)


def config(**kw):
    kw.setdefault("samples_per_rank", 5)
    kw.setdefault("max_tokens_per_rank", 64)
    return PackingConfig(**kw)


def test_the_scheduler_turns_dynamic_cp_on_like_the_flag():
    flag = config(dynamic_cp=True, group_cost=COST, cp_group_sizes="any")
    spellings = [
        config(scheduler="dynamic_cp", group_cost=COST, cp_group_sizes="any"),
        config(scheduler="dynamic_cp", scheduler_options={"group_sizes": "any", "group_cost": COST}),
        config(scheduler=DynamicCpScheduler(group_sizes="any"), group_cost=COST, dynamic_cp=True),
    ]
    for c in spellings:
        assert c.dynamic_cp is True and c.cp_group_sizes is GroupSizes.ANY and c.group_cost == COST
        assert c.summary() == flag.summary() and c.fingerprint() == flag.fingerprint()
        built = c.build_scheduler()
        assert isinstance(built, DynamicCpScheduler) and repr(built) == repr(flag.build_scheduler())
        assert c.replace(prefetch=0).fingerprint() == flag.fingerprint()  # replace() re-checks, agrees
    assert "DynamicCpScheduler(group_sizes='any'" in flag.summary()["scheduler"]
    assert config().dynamic_cp is False and config(dynamic_cp=None).dynamic_cp is False


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"scheduler": "dynamic_cp", "dynamic_cp": False}, "plans with dynamic CP but dynamic_cp=False"),
        ({"scheduler": "dynamic_cp", "cost": CostModel(1.0, 0.0)}, "needs group_cost in the units of that cost"),
        (
            {
                "scheduler": "dynamic_cp",
                "scheduler_options": {"group_sizes": "any"},
                "cp_group_sizes": "pow2",
                "group_cost": COST,
                "dynamic_cp": True,
            },
            None,  # pow2 is the default: the scheduler's choice fills it
        ),  # fmt: skip
        (
            {"scheduler": DynamicCpScheduler(group_cost=GroupCost(COMPUTE, ring_step=1.0)), "group_cost": COST},
            "scheduler 'dynamic_cp' has group_cost=.* but the config's is",
        ),
        ({"dynamic_cp": True, "group_cost": COST, "scheduler": "dp_balanced"}, "or pass scheduler='dynamic_cp'"),
    ],
)
def test_contradictions_are_refused(kw, message):
    if message is None:
        assert config(**kw).cp_group_sizes is GroupSizes.ANY
        return
    with pytest.raises(ConfigError, match=message):
        config(**kw)


def test_a_subclass_instance_plans_the_steps():
    from seqpack.loader import wrap_data_iterator

    class Counting(DynamicCpScheduler):
        calls = 0

        def schedule(self, lengths, **kw):  # type: ignore[no-untyped-def, override]
            Counting.calls += 1
            return super().schedule(lengths, **kw)

    rng = np.random.default_rng(0)
    data = [{"input_ids": torch.from_numpy(rng.integers(0, 50, int(n)))} for n in rng.integers(1, 60, 10)]
    options = {"samples_per_rank": 5, "max_tokens_per_rank": 64, "group_cost": COST, "prefetch": 0}
    flag = list(wrap_data_iterator(iter(data), Topology.single(), dynamic_cp=True, **options))
    named = list(wrap_data_iterator(iter(data), Topology.single(), scheduler=Counting(), **options))
    assert Counting.calls == 2 and len(flag) == len(named) == 2
    for a, b in zip(flag, named, strict=True):
        assert a.schedule.fingerprint() == b.schedule.fingerprint()
        assert [x.sample_ids.tolist() for x in a.microbatches] == [x.sample_ids.tolist() for x in b.microbatches]
