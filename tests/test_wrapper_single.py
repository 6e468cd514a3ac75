"""wrap_data_iterator on one rank (Topology.single()): contents, stats, end of data, resume,
errors. The multi-rank behaviour is in tests/distributed/test_wrapper_dist.py."""

import io

import numpy as np
import pytest
import torch

from seqpack.cost import CostModel
from seqpack.topology import Topology
from seqpack.wrapper import PackingIterator, Step, wrap_data_iterator
from wrapper_data import (
    ScatterScheduler,
    batch_arrays,
    check_full_batch,
    expected_sequences,
    items,
    make_item,
)

SEED = 3


def _wrap(data, **kwargs):
    kwargs.setdefault("samples_per_rank", 6)
    kwargs.setdefault("max_tokens_per_rank", 48)
    kwargs.setdefault("scheduler", "empty")
    kwargs.setdefault("pad_multiple", 4)
    return wrap_data_iterator(data, Topology.single(), **kwargs)


def _run(it):
    return list(it)


def _received(steps, pad_multiple=4):
    seen = []
    for step in steps:
        for batch in step.microbatches:
            seen += check_full_batch(batch_arrays(batch), SEED, pad_multiple)
    return seen


def test_every_sequence_arrives_once_packed_exactly_with_exact_stats():
    it = _wrap(items(SEED, 0, 18), flops_fn=lambda s, ss: 6.0 * s + 2.0 * ss)
    steps = _run(it)
    assert len(steps) == 3 and all(isinstance(s, Step) for s in steps)
    seen = _received(steps)
    expected = expected_sequences(SEED, 0, 18)
    assert sorted(who for who, _ in seen) == sorted(expected)
    for step in steps:
        lengths = [int(n) for b in step.microbatches for n in b.seq_lens().tolist() if b.sample_ids[0] >= 0]
        assert step.stats.seqlen_sum == sum(lengths) and isinstance(step.stats.seqlen_sum, int)
        assert step.stats.seqlen_sq_sum == sum(n * n for n in lengths)
        assert step.stats.padded_tokens == sum(b.num_tokens for b in step.microbatches)
        assert step.stats.flops == 6.0 * step.stats.seqlen_sum + 2.0 * step.stats.seqlen_sq_sum
        assert step.num_microbatches == len(step.microbatches) == step.stats.num_microbatches
        assert set(step.timings) >= {"read", "gather", "schedule", "exchange", "pack", "total"}
    # Not vacuous: pre-packed items were split, a zero-length one dropped and counted, padding seen.
    assert sum(s.stats.empty_samples for s in steps) == 1  # item 7
    assert any(sub > 0 for (_, _, sub) in expected)
    assert any(bool(b.padding_mask.any()) for s in steps for b in s.microbatches)
    assert max(s.num_microbatches for s in steps) > 1
    assert max(b.num_sequences for s in steps for b in s.microbatches) > 1
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("drop_last", [True, False])
def test_end_of_data(drop_last):
    it = _wrap(items(SEED, 0, 20), drop_last=drop_last)
    steps = _run(it)
    tail = expected_sequences(SEED, 0, 20).keys() - expected_sequences(SEED, 0, 18).keys()
    assert tail  # items 18 and 19 hold sequences
    if drop_last:
        assert len(steps) == 3
        assert it.dropped_at_end == len(tail)
    else:
        assert len(steps) == 4
        assert it.dropped_at_end == 0
        assert {who for who, _ in _received(steps[3:])} == tail
    with pytest.raises(StopIteration):  # stays finished
        next(it)


def test_cost_and_scheduler_instance_are_passed_through():
    cost = CostModel(linear=1.0, quadratic=0.01, constant=5.0)
    steps = _run(_wrap(items(SEED, 0, 12), cost=cost, scheduler=ScatterScheduler()))
    assert len(steps) == 2
    for step in steps:
        assert step.stats.replica_cost[0] > step.stats.padded_tokens  # cost model, not token counts


def _save_load(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # the state is plain data and tensors


def _same_steps(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.step == y.step and x.schedule_fingerprint == y.schedule_fingerprint
        assert x.stats == y.stats
        for p, q in zip(x.microbatches, y.microbatches):
            pa, qa = batch_arrays(p), batch_arrays(q)
            for name in pa:
                if isinstance(pa[name], np.ndarray):
                    assert np.array_equal(pa[name], qa[name]), name
                else:
                    assert pa[name] == qa[name], name


class StatefulItems:
    """An iterable with its own state_dict (the StatefulDataLoader protocol)."""

    def __init__(self, count):
        self.count, self.position, self.iterated = count, 0, 0

    def __iter__(self):
        self.iterated += 1
        while self.position < self.count:
            self.position += 1
            yield make_item(SEED, 0, self.position - 1)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


@pytest.mark.parametrize("stateful", [False, True])
def test_resume_reproduces_the_next_steps_with_deferred_samples(stateful):
    def fresh():
        data = StatefulItems(30) if stateful else items(SEED, 0, 30)
        return _wrap(data, scheduler=ScatterScheduler(defer_longest=True))

    reference = _run(fresh())
    assert len(reference) == 5
    first = fresh()
    head = [next(first), next(first)]
    state = _save_load(first.state_dict())
    assert state[PackingIterator.STATE_STEPS] == 2 and state[PackingIterator.STATE_CONSUMED] == 12
    assert len(state[PackingIterator.STATE_DEFERRED]) == 1  # not vacuous: a deferred sample travels
    assert (state[PackingIterator.STATE_ITERATOR] is not None) == stateful
    resumed = fresh()
    resumed.load_state_dict(state)
    if stateful:
        assert resumed._source.position == 12
    middle = next(resumed)
    # Resume again from the resumed iterator: its own bookkeeping must be right too.
    state = _save_load(resumed.state_dict())
    assert state[PackingIterator.STATE_CONSUMED] == 18 and state[PackingIterator.STATE_STEPS] == 3
    again = fresh()
    again.load_state_dict(state)
    _same_steps(head + [middle] + _run(again), reference)
    assert sum(s.stats.deferred_sequences for s in reference) >= 4


def test_resume_rejects_another_topology_or_config():
    it = _wrap(items(SEED, 0, 12))
    next(it)
    state = it.state_dict()
    moved = dict(state, topology=dict(state["topology"], dp_size=2, dp_rank=1))
    with pytest.raises(ValueError, match=r"saved on topology dp=1/2 cp=0/1 tp=0/1 pp=0/1 but this iterator runs on dp=0/1"):
        _wrap(items(SEED, 0, 12)).load_state_dict(moved)
    with pytest.raises(ValueError, match="samples_per_rank"):
        _wrap(items(SEED, 0, 12), samples_per_rank=5).load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing keys \['consumed'\]"):
        _wrap(items(SEED, 0, 12)).load_state_dict({k: v for k, v in state.items() if k != "consumed"})
    with pytest.raises(ValueError, match="needs a fresh iterator"):
        it.load_state_dict(state)


def test_resume_past_the_end_of_the_data_is_an_error():
    it = _wrap(items(SEED, 0, 18))
    next(it), next(it)
    state = it.state_dict()
    short = _wrap(items(SEED, 0, 7))
    short.load_state_dict(state)
    with pytest.raises(ValueError, match="resuming needs to skip 12 consumed samples but the data iterator ended after 7"):
        next(short)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing_input_ids", r"sample 4 of this rank's data has no 'input_ids' \(keys: \['loss_mask', 'tokens'\]\)"),
        ("unequal_lengths", r"sample 4 of this rank's data: 'labels' has \d+ tokens but 'input_ids' has \d+"),
        ("not_a_mapping", r"sample 4 of this rank's data must be a mapping of 1-D tensors, got list"),
    ],
)
def test_bad_input_names_rank_step_and_sample(kind, message):
    it = _wrap(items(SEED, 0, 18, bad={"index": 4, "kind": kind}))
    with pytest.raises(ValueError, match=r"bad input on DP rank 0 \(global rank 0, dp=0/1 cp=0/1 tp=0/1 pp=0/1\) at step 0: " + message):
        next(it)


def test_oversize_policies():
    bad = {"index": 8, "kind": "oversize", "length": 60}
    with pytest.raises(ValueError, match=r"step 1: sample \d+ has 60 tokens .* capacity 48 tokens.*\[global sample \d+ is sample \d+ of DP rank 0's pool"):
        _run(_wrap(items(SEED, 0, 18, bad=bad)))
    dropped = _run(_wrap(items(SEED, 0, 18, bad=bad), on_oversize="drop"))
    assert [s.stats.dropped_sequences for s in dropped] == [0, 1, 0]
    assert dropped[1].stats.dropped_tokens == 60
    cut = _run(_wrap(items(SEED, 0, 18, bad=bad), on_oversize="truncate"))
    assert [s.stats.truncated_sequences for s in cut] == [0, 1, 0]
    assert cut[1].stats.truncated_tokens == 12
    assert max(b.num_tokens for b in cut[1].microbatches) == 48


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"data_owner": "rank0"}, r"data_owner must be one of \('tp0', 'all'\), got 'rank0'"),
        ({"samples_per_rank": 0}, "samples_per_rank must be a positive integer, got 0"),
        ({"on_oversize": "skip"}, "on_oversize must be one of"),
        ({"pad_multiple": 0}, "pad_multiple must be a positive integer, got 0"),
        ({"max_tokens_per_rank": 2}, r"max_tokens_per_rank\(2\) \* cp\(1\) = 2 is smaller than pad_multiple=4"),
        ({"scheduler": "nope"}, "unknown scheduler 'nope'"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _wrap(items(SEED, 0, 6), **kwargs)


def test_missing_iterator_is_named():
    with pytest.raises(ValueError, match=r"rank 0 \(dp=0/1 cp=0/1 tp=0/1 pp=0/1\) got data_iterator=None but must read data"):
        _wrap(None)


def test_an_exception_inside_the_data_iterator_becomes_the_agreed_error():
    def broken():
        yield from items(SEED, 0, 3)
        raise RuntimeError("worker 3 died")

    with pytest.raises(ValueError, match=r"bad input on DP rank 0 .* at step 0: RuntimeError: worker 3 died"):
        next(_wrap(broken()))


def test_stats_cost_is_one_unit_for_every_scheduler():
    from seqpack.cost import default_cost_model
    from seqpack.stats import microbatch_costs

    given = CostModel(1.0, 0.5)
    assert _wrap(items(SEED, 0, 6), cost=given).stats_cost == given
    for name in ("empty", "dp_balanced", "balanced"):
        it = _wrap(items(SEED, 0, 6), scheduler=name)
        assert it.stats_cost == default_cost_model()
        step = next(it)
        expected = microbatch_costs(step.schedule, default_cost_model()).sum(axis=0)
        assert np.allclose(step.stats.replica_cost, expected)


def test_cost_of_the_wrong_type_is_a_clear_error_at_construction():
    from seqpack.cost import model_preset

    with pytest.raises(ValueError, match=r"cost must be a seqpack.CostModel or None, got ModelSpec \(ModelSpec.cost_model"):
        _wrap(items(SEED, 0, 6), cost=model_preset("llama3-8b"))


def test_resume_rejects_another_on_oversize_scheduler_options_or_cost():
    it = _wrap(items(SEED, 0, 12), scheduler="balanced")
    next(it)
    state = it.state_dict()
    for change, name in (
        ({"on_oversize": "drop"}, "on_oversize"),
        ({"scheduler_options": {"order": "pipeline"}}, "scheduler"),
        ({"cost": CostModel(1.0, 0.5)}, "cost"),
    ):
        with pytest.raises(ValueError, match=rf"another configuration: {name}: .*\(saved\) vs .*\(here\)"):
            _wrap(items(SEED, 0, 12), scheduler="balanced", **change).load_state_dict(state)
    _wrap(items(SEED, 0, 12), scheduler="balanced").load_state_dict(state)  # the same config loads


@pytest.mark.parametrize("key, value", [("consumed", -1), ("steps", -3), ("consumed", 1.5)])
def test_resume_rejects_negative_or_fractional_counts(key, value):
    it = _wrap(items(SEED, 0, 12))
    next(it)
    state = dict(it.state_dict(), **{key: value})
    with pytest.raises(ValueError, match=rf"state\['{key}'\]"):
        _wrap(items(SEED, 0, 12)).load_state_dict(state)


def test_a_failed_step_raises_step_failed_with_its_cause_and_the_iterator_stays_failed():
    from seqpack.errors import ResumeError, SampleError, StepFailed

    it = _wrap(items(SEED, 0, 18, bad={"index": 8, "kind": "missing_input_ids"}))
    first = next(it)
    assert first.step == 0
    with pytest.raises(StepFailed) as failed:
        next(it)
    assert failed.value.step == 1 and failed.value.rank == 0
    assert isinstance(failed.value.__cause__, SampleError)
    with pytest.raises(StepFailed, match="failed at step 1 and cannot continue"):
        next(it)
    with pytest.raises(ResumeError, match="failed at step 1"):
        it.state_dict()


def test_config_object_and_overrides():
    from seqpack.config import PackingConfig

    config = PackingConfig(samples_per_rank=6, max_tokens_per_rank=48, scheduler="empty", pad_multiple=4)
    a = list(wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config))
    b = list(_wrap(items(SEED, 0, 18)))
    assert [s.schedule_fingerprint for s in a] == [s.schedule_fingerprint for s in b]
    c = wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config, samples_per_rank=3)
    assert c.config.samples_per_rank == 3 and c.samples_per_rank == 3
    with pytest.raises(ValueError, match=r"unknown PackingConfig field\(s\) \['sample_per_rank'\]"):
        wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config, sample_per_rank=3)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['foo'\]"):
        _wrap(items(SEED, 0, 18), foo=1)
    with pytest.raises(ValueError, match="needs max_tokens_per_rank"):
        wrap_data_iterator(items(SEED, 0, 18), Topology.single(), samples_per_rank=3)
