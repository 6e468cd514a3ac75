"""Fuzz plans under static shapes (seqpack.schedulers.shape_limits): random lengths, dp, cp,
pad multiples, token buckets, max_sequences, tail policies, oversize policies and syncs,
through every static-CP scheduler, schedule_groups and schedule_minibatches. Every plan holds
at most ``max_real_sequences`` sequences and the largest bucket's padded tokens in every
microbatch and places every id exactly once (assigned, deferred or dropped), checked by a slow
obvious checker over ``plan.assignment``; its predicted step time and StepStats' bucket
padding equal a slow recomputation; hostile ``static_shapes`` values are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hostile import Target, spoil_one
from hypothesis import event, given, settings
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.errors import ScheduleError
from seqpack.schedulers import get_scheduler, predicted_step_time, static_shapes_by_cost
from seqpack.schedulers.minibatches import schedule_minibatches
from seqpack.schedulers.request import Request
from seqpack.schedulers.sample_groups import schedule_groups
from seqpack.stats import StepStats
from seqpack.thd import StaticShapes

COST = CostModel(linear=1.0, quadratic=0.003, constant=2.0)

TARGETS = [
    Target(
        "Scheduler.schedule(static_shapes=)",
        lambda **kw: get_scheduler("balanced").schedule([3, 4, 5], dp_size=2, max_tokens_per_rank=16, **kw),
        lambda: {"static_shapes": StaticShapes(token_buckets=(8, 16), max_sequences=3)},
        {"static_shapes": "any"},
    ),
    Target(
        "predicted_step_time(static_shapes=)",
        lambda **kw: predicted_step_time(
            get_scheduler("balanced").schedule([3, 4, 5], dp_size=2, max_tokens_per_rank=16), COST, **kw
        ),
        lambda: {"static_shapes": StaticShapes(token_buckets="capacity", max_sequences=4)},
        {"static_shapes": "any"},
    ),
    Target(
        "static_shapes_by_cost",
        static_shapes_by_cost,
        lambda: {"steps": [[3, 4, 5]], "buckets": 2, "max_sequences": 3, "max_tokens_per_rank": 16, "dp_size": 2},
        {"buckets": "int", "max_sequences": "int", "max_tokens_per_rank": "int", "dp_size": "int", "steps": "any"},
    ),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hostile_arguments_are_refused_by_name(target, data):
    spoil_one(target, data)


@st.composite
def requests(draw):
    dp = draw(st.integers(1, 5))
    cp = draw(st.sampled_from([1, 2]))
    pad = draw(st.sampled_from([1, 2, 4]))
    per_rank = draw(st.integers(4, 40))
    capacity = per_rank * cp
    n = draw(st.integers(0, 60))
    lengths = draw(st.lists(st.integers(1, capacity + 8), min_size=n, max_size=n))
    tail = draw(st.sampled_from(["append_dummy_seq", "extend_last"]))
    slots = draw(st.integers(2, 6))
    if draw(st.booleans()):
        buckets = "capacity"
    else:
        steps = draw(st.lists(st.integers(1, max(1, capacity // pad)), min_size=1, max_size=4, unique=True))
        buckets = tuple(sorted(s * pad for s in steps))
    shapes = StaticShapes(token_buckets=buckets, max_sequences=slots, tail_padding=tail)
    return dict(
        lengths=np.asarray(lengths, dtype=np.int64),
        dp=dp,
        cp=cp,
        pad=pad,
        per_rank=per_rank,
        shapes=shapes,
        scheduler=draw(st.sampled_from(["balanced", "dp_balanced", "empty"])),
        sync=draw(st.sampled_from([None, "lockstep", "replica"])),
        on_oversize=draw(st.sampled_from(["truncate", "drop"])),
        how=draw(st.sampled_from(["schedule", "groups", "together", "minibatches"])),
        seed=draw(st.integers(0, 2**16)),
    )


def slow_check(plan, shapes: StaticShapes, n: int) -> None:
    """The limits and the exactly-once rule, one microbatch at a time."""
    largest = shapes.buckets(plan.capacity)[-1]
    seen = []
    for row in plan.assignment:
        assert len(row) == plan.dp_size
        for ids in row:
            assert len(ids) <= shapes.max_real_sequences
            tokens = sum(-(-int(plan.lengths[i]) // plan.pad_multiple) * plan.pad_multiple for i in ids)
            assert tokens <= largest
            seen += [int(i) for i in ids]
    seen += [int(i) for i in plan.deferred] + [int(i) for i in plan.dropped]
    assert sorted(seen) == list(range(n))


def slow_time(plan, shapes: StaticShapes, sync: str) -> tuple[float, int]:
    """(predicted step time, bucket padding tokens) from the assignment."""
    buckets = shapes.buckets(plan.capacity)
    times = np.zeros((plan.num_microbatches, plan.dp_size))
    extra_tokens = 0
    for m, row in enumerate(plan.assignment):
        for d, ids in enumerate(row):
            padded = [-(-int(plan.lengths[i]) // plan.pad_multiple) * plan.pad_multiple for i in ids]
            tokens = sum(padded) if len(ids) else plan.pad_multiple
            extra = next(b for b in buckets if b >= tokens) - tokens
            extra_tokens += extra
            compute = sum(COST.linear * p + COST.quadratic * p * p for p in padded)
            times[m, d] = COST.constant + compute + COST.linear * extra
    if not times.size:
        return 0.0, 0
    return float(times.max(axis=1).sum() if sync == "lockstep" else times.sum(axis=0).max()), extra_tokens


@settings(max_examples=100, deadline=None)
@given(request=requests())
def test_every_plan_keeps_the_limits_and_places_every_id_once(request):
    r = request
    lengths, shapes, n = r["lengths"], r["shapes"], r["lengths"].shape[0]
    scheduler = get_scheduler(r["scheduler"])
    common = dict(
        dp_size=r["dp"], cp_size=r["cp"], max_tokens_per_rank=r["per_rank"], pad_multiple=r["pad"], cost=COST,
        on_oversize=r["on_oversize"], static_shapes=shapes,
    )  # fmt: skip
    if r["sync"] is not None:
        common["sync"] = r["sync"]
    try:
        if r["how"] == "schedule":
            plan = scheduler.schedule(lengths, **common)
        elif r["how"] in ("groups", "together"):
            groups = np.random.default_rng(r["seed"]).integers(0, max(1, n // 3 + 1), size=n)
            plan = schedule_groups(
                scheduler, Request.of(lengths, **common), groups, np.ones(n, bool), together=r["how"] == "together"
            )
        else:
            if n < r["dp"] * 2:
                return
            plan, _ = schedule_minibatches(scheduler, Request.of(lengths, **common), minibatches=2)
    except ScheduleError as exc:
        # Only a step too small for the pad multiple, or a bucket ladder whose largest size
        # the pad multiple leaves no room in, may be refused.
        event("refused")
        assert "pad_multiple" in str(exc) or "capacity" in str(exc), exc
        return
    event(r["how"])
    plan.validate(lengths, static_shapes=shapes)
    slow_check(plan, shapes, n)
    for sync in ("lockstep", "replica"):
        want, extra = slow_time(plan, shapes, sync)
        assert predicted_step_time(plan, COST, sync=sync, static_shapes=shapes) == pytest.approx(want, rel=1e-9)
        stats = StepStats.from_schedule(plan, COST, sync=sync, static_shapes=shapes)
        assert stats.bucket_tokens == extra
