"""Invariants every scheduler keeps, on random instances (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.cost import CostModel
from seqpack.schedulers import available_schedulers, get_scheduler
from seqpack.stats import StepStats

SCHEDULERS = ["balanced", "dp_balanced", "empty"]

instances = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(1, 300), min_size=0, max_size=120),
        "dp": st.integers(1, 12),
        "cp": st.sampled_from([1, 2, 4]),
        "cap": st.integers(24, 256),
        "policy": st.sampled_from(["truncate", "drop"]),
        "quadratic": st.sampled_from([0.0, 1e-3, 0.1]),
        "options": st.sampled_from([{}, {"order": "pipeline"}, {"microbatch_multiple": 2}, {"locality": True}]),
    }
)


def _run(name, inst):
    pm = 2 * inst["cp"] if inst["cp"] > 1 else 1
    options = inst["options"] if name == "balanced" else {}
    if name == "dp_balanced" and "microbatch_multiple" in inst["options"]:
        options = {"microbatch_multiple": 2}
    return get_scheduler(name, **options).schedule(
        inst["lengths"],
        dp_size=inst["dp"],
        cp_size=inst["cp"],
        max_tokens_per_rank=inst["cap"],
        pad_multiple=pm,
        cost=CostModel(1.0, inst["quadratic"]),
        on_oversize=inst["policy"],
    ), pm


def test_all_schedulers_are_covered():
    assert sorted(SCHEDULERS) == available_schedulers()


@settings(max_examples=60)
@given(inst=instances, name=st.sampled_from(SCHEDULERS))
@pytest.mark.slow
def test_invariants(inst, name):
    s, pm = _run(name, inst)
    lengths = np.array(inst["lengths"], dtype=np.int64)
    s.validate(lengths, dp_size=inst["dp"], cp_size=inst["cp"], max_tokens_per_rank=inst["cap"], pad_multiple=pm)
    capacity = inst["cap"] * inst["cp"]
    # Capacity, same microbatch count on every replica, every id exactly once.
    assert s.num_microbatches == len(s.assignment)
    assert all(len(row) == inst["dp"] for row in s.assignment)
    if s.num_microbatches:
        assert s.group_tokens().max() <= capacity
    ids = np.concatenate([c for row in s.assignment for c in row] + [s.deferred, s.dropped]).astype(np.int64)
    assert np.array_equal(np.sort(ids), np.arange(len(lengths)))
    # Oversize policies count exactly what was cut.
    padded = -(-lengths // pm) * pm
    over = np.flatnonzero(padded > capacity)
    stats = StepStats.from_schedule(s, CostModel(1.0, inst["quadratic"]))
    if inst["policy"] == "drop":
        assert s.dropped.tolist() == over.tolist() and stats.dropped_sequences == over.size
        assert stats.dropped_tokens == int(lengths[over].sum())
        assert stats.num_sequences == len(lengths) - over.size
    else:
        fit = (capacity // pm) * pm
        assert s.truncated.tolist() == over.tolist() and stats.truncated_sequences == over.size
        assert stats.truncated_tokens == int((lengths[over] - fit).sum())
        assert stats.real_tokens == int(np.minimum(lengths, np.where(padded > capacity, fit, lengths)).sum())
    # Pure and deterministic: a fresh scheduler on the same input gives the same schedule.
    again, _ = _run(name, inst)
    assert again.fingerprint() == s.fingerprint()


@settings(max_examples=30)
@given(inst=instances)
@pytest.mark.slow
def test_balanced_uses_the_token_lower_bound_when_it_is_loose(inst):
    """Sequences of at most 1/8 of a microbatch that fill at most 3/4 of the token lower
    bound's microbatches always fit there: cost-first bins cannot run out of room."""
    capacity = inst["cap"] * 8
    lengths = [min(x, inst["cap"]) for x in inst["lengths"]]
    s = get_scheduler("balanced").schedule(
        lengths, dp_size=inst["dp"], max_tokens_per_rank=capacity, cost=CostModel(1.0, inst["quadratic"])
    )
    stats = StepStats.from_schedule(s)
    if stats.padded_tokens <= 0.75 * max(stats.min_microbatches, 1) * inst["dp"] * capacity:
        assert stats.num_microbatches == stats.min_microbatches


@pytest.mark.slow
def test_validate_on_thousands_of_random_instances():
    """A seeded sweep (no shrinking, cheap): 1000 instances per scheduler."""
    rng = np.random.default_rng(2024)
    checked = 0
    for _ in range(1000):
        n = int(rng.integers(0, 80))
        dp = int(rng.integers(1, 10))
        cp = int(rng.choice([1, 2]))
        pm = 2 * cp if cp > 1 else 1
        cap = int(rng.integers(16, 200))
        lengths = rng.integers(1, 3 * cap * cp, n)
        policy = str(rng.choice(["truncate", "drop"]))
        cost = CostModel(1.0, float(rng.choice([0.0, 0.01])))
        for name in SCHEDULERS:
            s = get_scheduler(name).schedule(
                lengths,
                dp_size=dp,
                cp_size=cp,
                max_tokens_per_rank=cap,
                pad_multiple=pm,
                cost=cost,
                on_oversize=policy,
            )
            s.validate(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=cap, pad_multiple=pm)
            checked += 1
    assert checked == 3000
