"""CostCalibrator with a group cost's prior: the dynamic-CP cost (compute and CP ring) fitted to measured
times; replica_sums against a slow reference; the ledger with dynamic CP plans."""

from __future__ import annotations

import numpy as np
import pytest
from dynamic_cp_reference import plan_dcp
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.calibrate import MISSING, CostCalibrator, TimingLedger, encode_seconds
from seqpack.cost import CostModel, spans_nodes
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.schedulers.step_time import group_times, replica_sums
from seqpack.thd import group_padded_lengths

TRUTH = CostModel(
    2e-6, 3e-11, 1e-3, ring_step=4e-4, ring_token=5e-7, ring_token_inter=2e-6, ranks_per_node=8, reference_size=1
)
PRIOR = CostModel(1.0, 1e-4, 0.0, ring_step=10.0, ring_token=0.1, ranks_per_node=8, reference_size=1)  # FLOP-ish units


def rows(sizes, s, ss, spans):
    """``(size, S, SS, spans)`` rows: what :meth:`CostCalibrator.observe_sums` takes of groups."""
    return np.stack([np.asarray(sizes), np.asarray(s), np.asarray(ss), np.asarray(spans, dtype=np.int64)], axis=-1)


def gtime(model, sizes, s, ss, spans):
    """The cost of microbatches on groups of ``sizes`` (:meth:`CostModel.predict_group_sums`)."""
    sums = np.stack([np.asarray(sizes), np.asarray(s), np.asarray(ss), np.asarray(spans, dtype=np.int64)], axis=-1)
    return model.predict_group_sums(sums, 1)


def _microbatches(rng: np.random.Generator, n: int, sizes=(1, 2, 4, 8, 16)):
    size = rng.choice(sizes, n)
    lengths = [rng.integers(64, 4096 * c, rng.integers(1, 6)) for c in size]
    s = np.array([int(x.sum()) for x in lengths])
    ss = np.array([int((x * x).sum()) for x in lengths])
    start = np.array([int(rng.integers(0, 64 // c)) * c for c in size])
    spans = spans_nodes(start, size, 8)
    return size, s, ss, spans


def test_recovers_a_known_group_cost_from_its_times():
    rng = np.random.default_rng(0)
    size, s, ss, spans = _microbatches(rng, 200)
    seconds = gtime(TRUTH, size, s, ss, spans)
    cal = CostCalibrator(PRIOR, min_points=32, warmup_steps=0)
    assert cal.model is PRIOR and not cal.fitted
    assert cal.observe_sums(rows(size, s, ss, spans), seconds, step=3) == 200
    assert cal.fitted and cal.in_seconds and cal.last_step == 3
    np.testing.assert_allclose(cal.model.group_coefficients(1), TRUTH.group_coefficients(1), rtol=1e-6)


def test_noisy_times_predict_within_a_few_percent():
    rng = np.random.default_rng(1)
    size, s, ss, spans = _microbatches(rng, 400)
    noise = 1.0 + 0.02 * rng.standard_normal(size.shape[0])
    noise[::37] = 3.0  # outliers (a GC pause): the robust fit rejects them
    cal = CostCalibrator(PRIOR, warmup_steps=0)
    cal.observe_sums(rows(size, s, ss, spans), gtime(TRUTH, size, s, ss, spans) * noise)
    test = _microbatches(np.random.default_rng(2), 200)
    predicted, truth = gtime(cal.model, *test), gtime(TRUTH, *test)
    assert np.max(np.abs(predicted / truth - 1)) < 0.05
    # The ring term itself is fitted: a wide group's extra cost over the compute split.
    ring = gtime(cal.model, *(np.array([16]), np.array([1 << 16]), np.array([1 << 32]), np.array([True])))
    assert ring[0] == pytest.approx(gtime(TRUTH, np.array([16]), np.array([1 << 16]), np.array([1 << 32]),
                                               np.array([True]))[0], rel=0.05)  # fmt: skip


def test_unobserved_terms_keep_the_prior_rescaled():
    """Only lone ranks and groups within a node timed: the inter-node ring coefficient is the
    prior's times the scale that maps the prior onto the timings (not 0, not FLOP units)."""
    rng = np.random.default_rng(3)
    size, s, ss, _ = _microbatches(rng, 100, sizes=(1, 2, 4))
    spans = np.zeros_like(size, dtype=bool)
    cal = CostCalibrator(PRIOR, min_points=8, warmup_steps=0, robust=False)
    cal.observe_sums(rows(size, s, ss, spans), gtime(TRUTH, size, s, ss, spans))
    model = cal.model
    np.testing.assert_allclose(model.group_coefficients(1)[:5], TRUTH.group_coefficients(1)[:5], rtol=1e-6)
    p = gtime(PRIOR, size, s, ss, spans)
    y = gtime(TRUTH, size, s, ss, spans)
    alpha = np.sum(p * y / y**2) / np.sum(p * p / y**2)
    assert model.ring_token_inter == pytest.approx(alpha * PRIOR.ring_token_inter, rel=1e-9)


def test_state_round_trip_copy_and_determinism():
    rng = np.random.default_rng(4)
    cal = CostCalibrator(PRIOR, min_points=8, window=50)
    for step in range(4):
        size, s, ss, spans = _microbatches(rng, 20)
        cal.observe_sums(rows(size, s, ss, spans), gtime(TRUTH, size, s, ss, spans), step=step)
    assert cal.num_points == 50 and cal.observed == 60  # step 0 is the warm-up
    other = CostCalibrator(PRIOR, min_points=8, window=50)
    other.load_state_dict(cal.state_dict())
    assert other.model.group_coefficients(1).tobytes() == cal.model.group_coefficients(1).tobytes()
    assert cal.copy().model.group_coefficients(1).tobytes() == cal.model.group_coefficients(1).tobytes()
    assert "CostCalibrator(prior=" in repr(cal) and cal.fits_groups


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: CostCalibrator("flops"), SeqpackTypeError, "CostModel"),
        (lambda: CostCalibrator(PRIOR, min_points=9, window=8), ConfigError, "larger than window"),
        (lambda: CostCalibrator(PRIOR).observe([[2], [3]], [1.0], group_sizes=[1, 1]), ConfigError, "2 microbatches"),
        (lambda: CostCalibrator(PRIOR).observe_sums([[0, 2, 4, 0]], [1.0]), ConfigError, "size 0"),
        (lambda: CostCalibrator(PRIOR).load_state_dict({"version": 1}), ResumeError, "version 1 is not 2"),
    ],
)
def test_bad_inputs(call, error, text):
    with pytest.raises(error, match=text):
        call()


def test_invalid_times_are_skipped_and_counted():
    cal = CostCalibrator(PRIOR, warmup_steps=0)
    assert cal.observe([[8]] * 3, [float("nan"), -1.0, 0.5], group_sizes=[1, 1, 1]) == 1
    assert cal.skipped == 2


def _replica_sums_reference(plan, cost):
    """Per round and replica, the (size, S, SS, spans) of the slowest group among its ranks."""
    times = group_times(plan, cost)
    out = np.zeros((plan.num_microbatches, plan.dp_size, 4), dtype=np.int64)
    for m in range(plan.num_microbatches):
        for d in range(plan.dp_size):
            best = None
            for g in plan.round_groups(m):
                lo, hi = int(plan.group_start[g]), int(plan.group_start[g] + plan.group_size[g])
                if hi <= d * plan.cp_size or lo >= (d + 1) * plan.cp_size:
                    continue
                ids = plan.group_ids(g)
                c = int(plan.group_size[g])
                if ids.size == 0:
                    row, t = (1, plan.pad_multiple, plan.pad_multiple**2, 0), cost.constant
                    t = float(gtime(cost, np.array([1]), np.array([row[1]]), np.array([row[2]]), np.array([False]))[0])
                else:
                    padded = group_padded_lengths(plan.lengths[ids], c, plan.pad_multiple).astype(int).tolist()
                    spans = bool(spans_nodes(lo, c, cost.ranks_per_node))
                    row, t = (c, sum(padded), sum(p * p for p in padded), int(spans)), float(times[g])
                if best is None or t > best[1]:
                    best = (row, t)
            assert best is not None
            out[m, d] = best[0]
    return out


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), max_size=30),
    dp=st.integers(1, 4),
    cp=st.sampled_from([1, 2, 4]),
    pad=st.sampled_from([1, 8]),
)
@pytest.mark.slow
def test_replica_sums_match_reference(lengths, dp, cp, pad):
    cost = CostModel(1.0, 0.01, 2.0, ring_step=3.0, ring_token=0.1, ranks_per_node=2, reference_size=1)
    plan = plan_dcp(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=64, pad_multiple=pad, cost=cost,
                    on_oversize="drop")  # fmt: skip
    np.testing.assert_array_equal(replica_sums(plan, cost), _replica_sums_reference(plan, cost))


def test_ledger_observes_dynamic_plans_and_resumes():
    lengths = [200, 30, 20, 50, 10, 60, 40, 5]
    plan = plan_dcp(lengths, dp_size=2, cp_size=2, max_tokens_per_rank=64, cost=TRUTH)
    cal = CostCalibrator(PRIOR, min_points=3, warmup_steps=0)
    ledger = TimingLedger(cal, dp_size=2, dp_rank=0, window=2)
    ledger.add_schedule(0, plan, TRUTH)
    sums = replica_sums(plan, PRIOR)
    seconds = TRUTH.predict_group_sums(sums, 1)  # [M, dp]
    saved = TimingLedger(CostCalibrator(PRIOR, min_points=3, warmup_steps=0), dp_size=2, dp_rank=0)
    saved.load_state_dict(ledger.state_dict())
    assert saved.pending() == [0]
    done = ledger.incoming(1, np.stack([encode_seconds(seconds[:, d]) for d in range(2)]))
    assert [m.step for m in done] == [0]
    assert done[0].measured == pytest.approx(seconds.max(axis=1).sum())
    assert done[0].predicted == pytest.approx(done[0].measured)
    assert cal.num_points == seconds.size
    with pytest.raises(ConfigError, match="calibrator times seqpack Schedules, got a object"):
        ledger.add_schedule(1, object(), None)


def _per_rank_reference(plan, cost, seconds_of_rank):
    """Slow reference of the per-rank ledger: per round, every group once (index order), with
    its sums and its slowest rank's time."""
    rows, times = [], []
    for r in range(plan.num_microbatches):
        for g in range(plan.num_groups):
            if int(plan.group_round[g]) != r:
                continue
            ids = plan.group_ids(g)
            c = int(plan.group_size[g]) if ids.size else 1
            padded = group_padded_lengths(plan.lengths[ids], c, plan.pad_multiple).astype(np.int64)
            if not ids.size:
                padded = np.array([plan.pad_multiple])
            spans = int(spans_nodes(int(plan.group_start[g]), c, cost.ranks_per_node)) if ids.size else 0
            rows.append([c, int(padded.sum()), int((padded * padded).sum()), spans])
            start = int(plan.group_start[g])
            times.append(max(seconds_of_rank[r][k] for k in range(start, start + int(plan.group_size[g]))))
    return rows, times


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), dp=st.sampled_from([1, 2, 3]), cp=st.sampled_from([1, 2, 4]))
@pytest.mark.slow
def test_per_rank_ledger_observes_every_group_once_with_its_slowest_rank(seed, dp, cp):
    """Issue 22: each CP rank's times travel in their own column (ABSENT elsewhere; the
    copies' MAX fills them in), so the calibrator sees every group of every round once, with
    the slowest of its ranks' times, instead of each replica's slowest rank only."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 200, rng.integers(1, 12)).tolist()
    plan = plan_dcp(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=64, cost=TRUTH, on_oversize="drop")
    seconds = rng.uniform(0.01, 1.0, (plan.num_microbatches, dp * cp))  # [rounds, plane rank]
    ledgers = []
    for rank in range(dp * cp):
        cal = CostCalibrator(PRIOR, min_points=3, warmup_steps=0)
        ledger = TimingLedger(cal, dp_size=dp, dp_rank=rank // cp, copies=cp, copy_rank=rank % cp)
        ledger.add_schedule(0, plan, TRUTH)
        ledger.record(0, seconds[:, rank], plan.num_microbatches)
        ledgers.append(ledger)
    # The DP gather (per CP rank) then the copies' MAX (per replica): every rank's column filled.
    table = np.max([np.stack([ledgers[d * cp + c].outgoing() for d in range(dp)]) for c in range(cp)], axis=0)
    assert not np.any(table == MISSING) and not np.any(table < 0)
    rows, times = _per_rank_reference(plan, TRUTH, seconds.tolist())
    for ledger in ledgers:
        done = ledger.incoming(1, table)
        assert [m.step for m in done] == [0]
        points = ledger.calibrator.state_dict()["points"]
        assert [p[:4] for p in points] == rows and [p[4] for p in points] == times
        replica = seconds.reshape(plan.num_microbatches, dp, cp).max(axis=2)
        assert done[0].measured == pytest.approx(replica.max(axis=1).sum())
        assert done[0].seconds.shape == (plan.num_microbatches, dp)


def test_per_rank_ledger_resumes_its_slots():
    plan = plan_dcp([200, 30, 20, 50, 10, 60, 40, 5], dp_size=2, cp_size=2, max_tokens_per_rank=64, cost=TRUTH)

    def ledger(rank=0):
        cal = CostCalibrator(PRIOR, min_points=3, warmup_steps=0)
        return TimingLedger(cal, dp_size=2, dp_rank=rank // 2, copies=2, copy_rank=rank % 2)

    new = ledger()
    new.add_schedule(0, plan, TRUTH)
    state = new.state_dict()
    assert "groups" in state["pending"][0]
    again = ledger()
    again.load_state_dict(state)
    assert again.state_dict() == state and again.width() == plan.num_microbatches * 2
    # A pending step laid out per replica is not a per-rank ledger's (one format).
    old = TimingLedger(CostCalibrator(PRIOR, min_points=3, warmup_steps=0), dp_size=2, dp_rank=0)
    old.add_schedule(0, plan, TRUTH)
    with pytest.raises(ResumeError, match="laid out per replica"):
        ledger().load_state_dict(old.state_dict())
