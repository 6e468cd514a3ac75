"""The ``"dynamic_cp"`` scheduler: ``get_scheduler("dynamic_cp")`` plans what
``plan_dynamic_cp`` plans, and ``PackingConfig(dynamic_cp=True)`` is the one way a config
asks for it (its options are ``scheduler_options``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dynamic_cp_reference import plan_dcp

from seqpack.cost import DEFAULT_MODEL, CostModel, model_preset
from seqpack.errors import ConfigError
from seqpack.loader import PackingConfig
from seqpack.options import GroupSizes
from seqpack.schedulers import DynamicCpScheduler, Schedule, available_schedulers, get_scheduler
from seqpack.topology import Topology

COMPUTE = CostModel(1.0, 1e-3, 1e-5)
COST = CostModel(1.0, 1e-3, 1e-5, ring_step=0.5, ring_token=2e-3, ranks_per_node=4, reference_size=1)
LENGTHS = np.array([230, 40, 7, 33, 61, 5, 18, 64, 2, 50])


def test_it_plans_what_plan_dynamic_cp_plans():
    assert "dynamic_cp" in available_schedulers(dynamic_cp=True) and "dynamic_cp" not in available_schedulers()
    args = {"dp_size": 2, "cp_size": 2, "max_tokens_per_rank": 64, "pad_multiple": 2}
    for sizes, sync in [("pow2", "lockstep"), ("any", "replica")]:
        scheduler = get_scheduler("dynamic_cp", group_sizes=sizes)
        origin = np.repeat([1, 0], 5)
        plan = scheduler.schedule(LENGTHS, origin=origin, sync=sync, cost=COST, **args)  # type: ignore[arg-type]
        assert isinstance(plan, Schedule) and plan.origin.tolist() == origin.tolist()
        plan.validate()
        same = plan_dcp(LENGTHS, cost=COST, sync=sync, group_sizes=sizes, **args)  # type: ignore[arg-type]
        assert plan.fingerprint() == same.fingerprint() and plan.group_sizes == sizes
    # Any cost plans (a ring-free one makes every CP group look free: the caller's choice).
    free = get_scheduler("dynamic_cp").schedule(LENGTHS, cost=COMPUTE, **args)
    assert free.fingerprint() == plan_dcp(LENGTHS, cost=COMPUTE, **args).fingerprint()


def test_without_a_cost_it_plans_with_the_default_models_flops_and_ring():
    prior = CostModel.from_model(model_preset(DEFAULT_MODEL))
    scheduler = DynamicCpScheduler()
    assert scheduler.resolve_cost(None) == prior and scheduler.resolve_cost(COST) is COST  # stats in its units
    args = {"dp_size": 4, "max_tokens_per_rank": 64}
    plan = scheduler.schedule(LENGTHS, **args)
    assert plan.fingerprint() == plan_dcp(LENGTHS, cost=prior, **args).fingerprint()
    assert repr(scheduler) == "DynamicCpScheduler(group_sizes='pow2')"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"group_sizes": "odd"}, "group_sizes must be one of"),
        ({"group_sizes": "static"}, "takes group_sizes='pow2' or 'any'"),
        ({"group_cost": COST}, r"unknown option\(s\) \['group_cost'\] of scheduler 'dynamic_cp'"),
        ({"order": "pipeline"}, r"unknown option\(s\) \['order'\] of scheduler 'dynamic_cp'"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        get_scheduler("dynamic_cp", **options)


def config(**kw):
    kw.setdefault("samples_per_rank", 5)
    kw.setdefault("max_tokens_per_rank", 64)
    return PackingConfig(**kw)


def test_a_config_asks_for_it_one_way():
    flag = config(dynamic_cp=True, cost=COST, scheduler_options={"group_sizes": "any"})
    built = flag.build_scheduler()
    assert isinstance(built, DynamicCpScheduler) and built.group_sizes is GroupSizes.ANY
    assert "DynamicCpScheduler(group_sizes='any')" == flag.summary()["scheduler"]
    instance = config(dynamic_cp=True, cost=COST, scheduler=DynamicCpScheduler(group_sizes="any"))
    assert instance.summary() == flag.summary() and instance.fingerprint() == flag.fingerprint()
    assert flag.replace(prefetch=0).fingerprint() == flag.fingerprint()  # replace() re-checks, agrees
    assert config().dynamic_cp is False
    for other in ("dynamic_cp", DynamicCpScheduler()):
        with pytest.raises(ConfigError, match="pass dynamic_cp=True instead"):
            config(scheduler=other, cost=COST)


def test_a_subclass_instance_plans_the_steps():
    from seqpack.loader import wrap_data_iterator

    class Counting(DynamicCpScheduler):
        calls = 0

        def plan(self, request):  # type: ignore[no-untyped-def, override]
            Counting.calls += 1
            return super().plan(request)

    rng = np.random.default_rng(0)
    data = [{"input_ids": torch.from_numpy(rng.integers(0, 50, int(n)))} for n in rng.integers(1, 60, 10)]
    options = {"samples_per_rank": 5, "max_tokens_per_rank": 64, "cost": COST, "prefetch": 0, "dynamic_cp": True}
    flag = list(wrap_data_iterator(iter(data), Topology.single(), **options))
    named = list(wrap_data_iterator(iter(data), Topology.single(), scheduler=Counting(), **options))
    assert Counting.calls == 2 and len(flag) == len(named) == 2
    for a, b in zip(flag, named, strict=True):
        assert a.schedule.fingerprint() == b.schedule.fingerprint()
        assert [x.sample_ids.tolist() for x in a.microbatches] == [x.sample_ids.tolist() for x in b.microbatches]
