"""Mini-batches under dynamic CP: each mini-batch planned alone, the plans joined one after
the other (``seqpack.schedulers.dynamic_cp.minibatches``), against per-part plans and slow
recounts; and through the wrapper on one rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dynamic_cp_reference import plan_dcp
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.errors import ConfigError
from seqpack.schedulers import DynamicCpScheduler
from seqpack.schedulers.minibatches import minibatch_loss_tokens, minibatch_of, schedule_minibatches
from seqpack.schedulers.request import Request
from seqpack.topology import Topology

COST = CostModel(1.0, 1e-3, 1e-5, ring_step=0.5, ring_token=2e-3, ranks_per_node=4, reference_size=1)
LIMITS = {"cp_size": 2, "max_tokens_per_rank": 64, "pad_multiple": 2}


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(2, 7), min_size=2, max_size=2),
    k=st.integers(1, 2),
    seed=st.integers(0, 2**16),
    policy=st.sampled_from(["truncate", "drop"]),
)
@pytest.mark.slow
def test_each_minibatch_is_its_own_plan(counts, k, seed, policy):
    rng = np.random.default_rng(seed)
    n = sum(counts)
    lengths = rng.integers(1, 80, n)
    lengths[rng.integers(0, n)] = int(rng.integers(100, 300))  # a sequence needing a group (or cut)
    origin = np.repeat(np.arange(2), counts)
    scheduler = DynamicCpScheduler()
    opts = {"dp_size": 2, "on_oversize": policy, "cost": COST, **LIMITS}
    plan, starts = schedule_minibatches(scheduler, Request.of(lengths, origin=origin, **opts), minibatches=k)
    plan.validate(lengths, dp_size=2, **LIMITS)
    assert plan.origin.tolist() == origin.tolist() and starts[0] == 0 and starts[-1] == plan.num_microbatches
    which = minibatch_of(origin, k)
    loss = rng.integers(0, 50, n)
    slow = [0] * k
    for j in range(k):
        mine = np.flatnonzero(which == j)
        alone = plan_dcp(lengths[mine], **{o: v for o, v in opts.items() if o != "dp_size"}, dp_size=2)
        in_rounds = [g for g in range(plan.num_groups) if starts[j] <= plan.group_round[g] < starts[j + 1]]
        assert starts[j + 1] - starts[j] == alone.num_microbatches
        assert plan.group_size[in_rounds].tolist() == alone.group_size.tolist()
        assert plan.group_start[in_rounds].tolist() == alone.group_start.tolist()
        ids = np.concatenate([plan.group_ids(g) for g in in_rounds]) if in_rounds else np.zeros(0, np.int64)
        assert ids.tolist() == mine[alone.assigned].tolist()  # exactly mini-batch j's samples, in pack order
        assert plan.dropped[np.isin(plan.dropped, mine)].tolist() == sorted(mine[alone.dropped].tolist())
        for g in in_rounds:
            slow[j] += int(loss[plan.group_ids(g)].sum())
    assert minibatch_loss_tokens(plan, starts, loss) == slow


def test_a_minibatch_without_samples_is_named():
    with pytest.raises(ConfigError, match="mini-batch 1 of 2 holds no sample"):
        schedule_minibatches(DynamicCpScheduler(), Request.of([5, 6], dp_size=2, **LIMITS), minibatches=2)


def test_minibatches_through_the_wrapper_on_one_rank():
    from seqpack.loader import wrap_data_iterator

    rng = np.random.default_rng(2)
    lengths = [150, *rng.integers(3, 60, 11).tolist()]  # 150 > one rank's 64: cut under truncate
    data = [{"input_ids": torch.arange(n) % 50 + 1} for n in lengths]
    options = {"samples_per_rank": 12, "max_tokens_per_rank": 64, "cost": COST, "prefetch": 0}
    (step,) = wrap_data_iterator(iter(data), Topology.single(), dynamic_cp=True, minibatches=3,
                                 on_oversize="truncate", **options)  # fmt: skip
    bounds = step.minibatch_bounds
    assert len(bounds) == 4 and bounds[-1] == step.num_microbatches == step.schedule.num_microbatches
    for j, part in enumerate(step.minibatches):
        ids = sorted(int(g) for mb in part for g in mb.sample_ids.tolist() if g >= 0)
        assert ids == list(range(4 * j, 4 * j + 4))  # the j-th contiguous third of what was read
        assert step.minibatch_loss_tokens[j] == sum(min(lengths[i], 64) - 1 for i in ids)
    back = step.to_origin([mb.input_ids for mb in step.microbatches])
    assert [t.tolist() for t in back] == [d["input_ids"][:64].tolist() for d in data]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 2), cp=st.sampled_from([1, 2]))
@pytest.mark.slow
def test_groups_stay_on_one_replica_block(seed, k, cp):
    rng = np.random.default_rng(seed)
    dp, n = 2, 16
    lengths = rng.integers(1, 60, n)
    lengths[0] = 100 * cp  # ungrouped and long: spread over a dynamic group when cp = 2
    grouped = rng.random(n) < 0.6
    grouped[0] = False
    group_ids = rng.integers(0, 4, n)
    origin = np.repeat(np.arange(dp), n // dp)
    limits = {"dp_size": dp, "cp_size": cp, "max_tokens_per_rank": 64, "pad_multiple": 2}
    scheduler = DynamicCpScheduler()
    plan, starts = schedule_minibatches(
        scheduler, Request.of(lengths, origin=origin, **limits), minibatches=k, group_ids=group_ids, grouped=grouped
    )
    plan.validate(lengths, **limits)
    replica_of = {}
    for g in range(plan.num_groups):
        for i in plan.group_ids(g).tolist():
            if grouped[i]:
                assert plan.group_size[g] == cp and plan.group_start[g] % cp == 0  # the replica's own block
                d = int(plan.group_start[g]) // cp
                mb = int(np.searchsorted(starts, plan.group_round[g], side="right")) - 1
                assert replica_of.setdefault((mb, int(group_ids[i])), d) == d  # one replica per group
    assert sorted(plan.assigned.tolist()) == list(range(n))


def test_a_grouped_sequence_must_fit_its_replica():
    from seqpack.errors import ScheduleError
    from seqpack.schedulers.sample_groups import schedule_groups

    args = {"dp_size": 2, "cp_size": 2, "max_tokens_per_rank": 64, "pad_multiple": 2}
    with pytest.raises(ScheduleError, match="sample 1 carries a group_id and has 200 tokens, more than its"):
        schedule_groups(DynamicCpScheduler(), Request.of(np.array([5, 200]), **args), np.zeros(2), np.ones(2))
    with pytest.raises(ConfigError, match="needs cp_size=3 a power of 2 or group_sizes='any'"):
        schedule_groups(
            DynamicCpScheduler(),
            Request.of(np.array([5, 6]), **args | {"cp_size": 3}),
            np.zeros(2),
            np.ones(2),
        )
    plan = schedule_groups(
        DynamicCpScheduler("any"), Request.of(np.array([5, 6]), **args | {"cp_size": 3}), np.zeros(2), np.ones(2)
    )
    assert set(plan.group_size.tolist()) == {3}


def test_groups_through_the_wrapper_on_one_rank():
    from seqpack.loader import wrap_data_iterator

    lengths = [30, 12, 50, 7, 21, 40]
    data = [
        {"input_ids": torch.arange(n) % 50 + 1, **({"group_id": i // 2} if i else {})} for i, n in enumerate(lengths)
    ]
    options = {"samples_per_rank": 6, "max_tokens_per_rank": 64, "cost": COST, "prefetch": 0}
    (step,) = wrap_data_iterator(iter(data), Topology.single(), dynamic_cp=True, **options)
    ran = sorted(int(g) for mb in step.microbatches for g in mb.sample_ids.tolist() if g >= 0)
    assert ran == list(range(6)) and step.schedule.num_microbatches >= 2  # the grouped part, then the rest
    back = step.to_origin([mb.input_ids for mb in step.microbatches])
    assert [t.tolist() for t in back] == [d["input_ids"].tolist() for d in data]
