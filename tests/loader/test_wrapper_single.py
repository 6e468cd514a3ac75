"""wrap_data_iterator on one rank (Topology.single()): contents, stats, end of data, resume,
errors. The multi-rank behaviour is in tests/distributed/test_wrapper_dist.py."""

import io
import time

import numpy as np
import pytest
import torch
from wrapper_data import (
    ScatterScheduler,
    batch_arrays,
    check_full_batch,
    expected_sequences,
    items,
    make_item,
    wait_until,
)

from seqpack.cost import CostModel
from seqpack.loader import PackingConfig, Step, wrap_data_iterator
from seqpack.loader.resume import StateKey
from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.topology import Topology

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
@pytest.mark.slow
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
    for x, y in zip(a, b, strict=True):
        assert x.step == y.step and x.schedule_fingerprint == y.schedule_fingerprint
        assert x.stats == y.stats
        for p, q in zip(x.microbatches, y.microbatches, strict=True):
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


def test_the_wrapper_and_a_stateful_source_are_torch_stateful():
    """torch.distributed.checkpoint saves what its own Stateful protocol accepts; seqpack's
    protocol (declared without importing DCP) accepts the same objects."""
    from torch.distributed.checkpoint.stateful import Stateful as TorchStateful

    from seqpack.loader.resume import Stateful

    it = _wrap(StatefulItems(3))
    assert isinstance(it, TorchStateful) and isinstance(it, Stateful)
    assert isinstance(StatefulItems(3), Stateful)
    assert not isinstance(items(SEED, 0, 3), Stateful)  # a plain iterable is not


@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.slow
def test_resume_reproduces_the_next_steps_with_deferred_samples(stateful):
    def fresh():
        data = StatefulItems(30) if stateful else items(SEED, 0, 30)
        return _wrap(data, scheduler=ScatterScheduler(defer_longest=True))

    reference = _run(fresh())
    assert len(reference) == 5
    first = fresh()
    head = [next(first), next(first)]
    state = _save_load(first.state_dict())
    assert state[StateKey.STEPS] == 2 and state[StateKey.CONSUMED] == 12
    assert len(state[StateKey.DEFERRED_SAMPLES]) == 1  # not vacuous: a deferred sample travels
    assert (state[StateKey.ITERATOR] is not None) == stateful
    resumed = fresh()
    resumed.load_state_dict(state)
    if stateful:
        assert resumed._producer.source.position == 12
    middle = next(resumed)
    # Resume again from the resumed iterator: its own bookkeeping must be right too.
    state = _save_load(resumed.state_dict())
    assert state[StateKey.CONSUMED] == 18 and state[StateKey.STEPS] == 3
    again = fresh()
    again.load_state_dict(state)
    _same_steps(head + [middle] + _run(again), reference)
    assert sum(s.stats.deferred_sequences for s in reference) >= 4


def test_resume_rejects_another_topology_or_config():
    it = _wrap(items(SEED, 0, 12))
    next(it)
    state = it.state_dict()
    moved = dict(state, topology=dict(state["topology"], dp_size=2, dp_rank=1))
    with pytest.raises(
        ValueError, match=r"saved on topology dp=1/2 cp=0/1 tp=0/1 pp=0/1 but this iterator runs on dp=0/1"
    ):
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
    with pytest.raises(
        ValueError, match="resuming needs to skip 12 consumed samples but the data iterator ended after 7"
    ):
        next(short)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing_input_ids", r" has no 'input_ids' \(keys: \['loss_mask', 'tokens'\]\)"),
        ("unequal_lengths", r": 'labels' has \d+ tokens but 'input_ids' has \d+"),
        ("not_a_mapping", r" must be a mapping of 1-D tensors, got list"),
    ],
)
def test_bad_input_names_rank_step_and_sample(kind, message):
    it = _wrap(items(SEED, 0, 18, bad={"index": 4, "kind": kind}))
    where = r"sample 4 of this rank's data \(sequence \d+ of its pool this step\)"
    with pytest.raises(
        ValueError,
        match=r"bad input on DP rank 0 \(global rank 0, dp=0/1 cp=0/1 tp=0/1 pp=0/1\) at step 0: " + where + message,
    ):
        next(it)
    # In a later step the two numberings differ (the data counts from its start, the pool from the step's).
    later = _wrap(items(SEED, 0, 18, bad={"index": 8, "kind": kind}))
    next(later)
    where = r"sample 8 of this rank's data \(sequence \d of its pool this step\)"
    with pytest.raises(ValueError, match=r"at step 1: " + where + message):
        next(later)


def test_oversize_policies():
    bad = {"index": 8, "kind": "oversize", "length": 60}
    with pytest.raises(
        ValueError,
        match=r"step 1: sample \d+ has 60 tokens.* capacity 48 tokens"
        r".*\[global sample \d+ is sequence \d+ of DP rank 0's pool",
    ):
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
    with pytest.raises(
        ValueError, match=r"rank 0 \(dp=0/1 cp=0/1 tp=0/1 pp=0/1\) got data_iterator=None but must read data"
    ):
        _wrap(None)


def test_an_exception_inside_the_data_iterator_becomes_the_agreed_error():
    def broken():
        yield from items(SEED, 0, 3)
        raise RuntimeError("worker 3 died")

    with pytest.raises(ValueError, match=r"bad input on DP rank 0 .* at step 0: RuntimeError: worker 3 died"):
        next(_wrap(broken()))


def test_stats_cost_is_one_unit_for_every_scheduler():
    from seqpack.cost import default_cost_model
    from seqpack.schedulers.objective import microbatch_costs

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

    with pytest.raises(
        ValueError, match=r"cost must be a seqpack.CostModel or None, got ModelSpec \(ModelSpec.cost_model"
    ):
        _wrap(items(SEED, 0, 6), cost=model_preset("llama3-8b"))


def test_resume_rejects_another_on_oversize_scheduler_options_or_cost():
    it = _wrap(items(SEED, 0, 12), scheduler="balanced")
    next(it)
    state = it.state_dict()
    for change, name in (
        ({"on_oversize": "drop"}, "on_oversize"),
        ({"scheduler_options": {"order": "pipeline"}}, "scheduler"),
        ({"scheduler_options": {"locality": True}}, "scheduler"),  # the default is "auto": another plan
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
    from seqpack.loader import PackingConfig

    config = PackingConfig(samples_per_rank=6, max_tokens_per_rank=48, scheduler="empty", pad_multiple=4)
    a = list(wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config))
    b = list(_wrap(items(SEED, 0, 18)))
    assert [s.schedule_fingerprint for s in a] == [s.schedule_fingerprint for s in b]
    c = wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config, samples_per_rank=3)
    assert c.config.samples_per_rank == 3
    with pytest.raises(AttributeError):  # the settings live in the config alone, under one name
        c.samples_per_rank  # noqa: B018
    with pytest.raises(ValueError, match=r"unknown PackingConfig field\(s\) \['sample_per_rank'\]"):
        wrap_data_iterator(items(SEED, 0, 18), Topology.single(), config, sample_per_rank=3)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['foo'\]"):
        _wrap(items(SEED, 0, 18), foo=1)
    with pytest.raises(ValueError, match="needs max_tokens_per_rank"):
        wrap_data_iterator(items(SEED, 0, 18), Topology.single(), samples_per_rank=3)


# --- prefetch: a background thread prepares steps ahead --------------------------------------

import gc  # noqa: E402
import logging  # noqa: E402
import weakref  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _fresh_defer(k, count=30, stateful=False):
    data = StatefulItems(count) if stateful else items(SEED, 0, count)
    return _wrap(data, scheduler=ScatterScheduler(defer_longest=True), prefetch=k)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.slow
def test_prefetch_gives_the_same_steps_as_the_synchronous_wrapper(k):
    reference = _run(_fresh_defer(0))
    it = _fresh_defer(k)
    steps = _run(it)
    _same_steps(steps, reference)
    assert len(reference) == 5 and sum(s.stats.deferred_sequences for s in reference) >= 4
    assert all("blocked" in s.timings and "total" in s.timings for s in steps)
    assert it._bg.prefetcher is not None and not it._bg.prefetcher._thread.is_alive()  # ended with the data


@pytest.mark.slow
def test_the_thread_reads_ahead_but_state_dict_describes_the_steps_handed_over():
    source = StatefulItems(60)
    it = _wrap(source, scheduler=ScatterScheduler(defer_longest=True), prefetch=3)
    head = [next(it), next(it)]
    # Not vacuous: the thread really read three more steps of 6 samples from the source.
    assert wait_until(lambda: source.position == 30)
    state = _save_load(it.state_dict())
    assert state[StateKey.STEPS] == 2 and state[StateKey.CONSUMED] == 12
    assert state[StateKey.ITERATOR] == {"position": 12}  # a snapshot, not the live source
    assert len(state[StateKey.DEFERRED_SAMPLES]) == 1
    it.close()
    for k in (0, 2):  # resumed under another prefetch depth, it continues bit-identically
        resumed = _wrap(StatefulItems(60), scheduler=ScatterScheduler(defer_longest=True), prefetch=k)
        resumed.load_state_dict(state)
        reference = _run(_wrap(StatefulItems(60), scheduler=ScatterScheduler(defer_longest=True), prefetch=0))
        _same_steps(head + _run(resumed), reference)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k_reference=st.integers(0, 3),
    k_saved=st.integers(0, 3),
    k_resumed=st.integers(0, 3),
    count=st.integers(7, 40),
    resume_after=st.integers(0, 5),
    drop_last=st.booleans(),
    stateful=st.booleans(),
)
@pytest.mark.slow
def test_prefetch_never_changes_the_data_across_a_resume(
    k_reference, k_saved, k_resumed, count, resume_after, drop_last, stateful
):
    def fresh(k):
        data = StatefulItems(count) if stateful else items(SEED, 0, count)
        return _wrap(data, scheduler=ScatterScheduler(defer_longest=True), prefetch=k, drop_last=drop_last)

    whole = fresh(k_reference)
    reference = _run(whole)
    first = fresh(k_saved)
    head = []
    for _ in range(min(resume_after, len(reference))):
        head.append(next(first))
    state = _save_load(first.state_dict())
    first.close()
    resumed = fresh(k_resumed)
    resumed.load_state_dict(state)
    _same_steps(head + _run(resumed), reference)
    assert resumed.dropped_at_end == whole.dropped_at_end
    assert reference  # not vacuous: at least one step (count >= 7 > samples_per_rank)


def test_an_error_is_raised_by_the_next_of_its_step_after_the_steps_before_it():
    from seqpack.errors import ResumeError, SampleError, StepFailed

    it = _wrap(items(SEED, 0, 30, bad={"index": 14, "kind": "missing_input_ids"}), prefetch=3)
    first, second = next(it), next(it)  # prepared before the bad step 2, still handed over
    assert (first.step, second.step) == (0, 1)
    with pytest.raises(StepFailed) as failed:
        next(it)
    assert failed.value.step == 2 and isinstance(failed.value.__cause__, SampleError)
    with pytest.raises(StepFailed, match="failed at step 2 and cannot continue"):
        next(it)
    with pytest.raises(ResumeError, match="failed at step 2"):
        it.state_dict()
    assert not it._bg.prefetcher._thread.is_alive()


@pytest.mark.parametrize("k", [0, 2])
def test_an_unexpected_exception_in_the_producer_reaches_next_and_fails_the_iterator(monkeypatch, k):
    from seqpack.errors import StepFailed
    from seqpack.loader.producer import StepProducer

    original = StepProducer._agree_copies

    def flaky(self, msg, *args):
        if self.steps == 1:
            raise RuntimeError("connection reset by a peer")
        return original(self, msg, *args)

    monkeypatch.setattr(StepProducer, "_agree_copies", flaky)
    it = _wrap(items(SEED, 0, 30), prefetch=k)
    assert next(it).step == 0
    with pytest.raises(RuntimeError, match="connection reset by a peer"):
        next(it)
    with pytest.raises(StepFailed, match=r"failed at step 1 and cannot continue.*RuntimeError: connection reset"):
        next(it)


def test_close_stops_the_thread_and_the_iterator_but_keeps_its_state():
    from seqpack.errors import SeqpackError

    source = StatefulItems(60)
    with _wrap(source, prefetch=2) as it:
        next(it)
        thread = it._bg.prefetcher._thread
        assert wait_until(lambda: source.position == 18)  # steps 1 and 2 prepared
    assert not thread.is_alive()
    assert source.position == 18  # close() did not prepare more than the two slots
    with pytest.raises(SeqpackError, match="closed"):
        next(it)
    assert it.state_dict()[StateKey.CONSUMED] == 6
    it.close()  # idempotent
    it.close(timeout=0)


@pytest.mark.slow
def test_an_iterator_dropped_without_close_ends_its_thread():
    it = _wrap(items(SEED, 0, 60), prefetch=2)
    next(it)
    prefetcher = it._bg.prefetcher
    assert wait_until(lambda: len(prefetcher._ready) == 2)  # idle: it holds only a weak reference
    thread = prefetcher._thread
    ref = weakref.ref(it)
    del it
    gc.collect()
    assert ref() is None
    thread.join(10)
    assert not thread.is_alive()


def test_prefetch_and_device_options_are_checked():
    with pytest.raises(ValueError, match="prefetch must be an integer >= 0, got -1"):
        _wrap(items(SEED, 0, 6), prefetch=-1)
    with pytest.raises(ValueError, match=r"prefetch must be an integer >= 0, got 1.5 \(float\)"):
        _wrap(items(SEED, 0, 6), prefetch=1.5)
    with pytest.raises(ValueError, match="device must be a torch.device or a device string, got 'gpu0'"):
        _wrap(items(SEED, 0, 6), device="gpu0")
    with pytest.raises(ValueError, match="group_timeout must be a positive number of seconds, got 0"):
        _wrap(items(SEED, 0, 6), group_timeout=0)
    with pytest.raises(ValueError, match="pin_memory must be"):
        _wrap(items(SEED, 0, 6), pin_memory="yes")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
            _wrap(items(SEED, 0, 6), device="cuda")
    with pytest.raises(ValueError, match="timeout must be"):
        _wrap(items(SEED, 0, 6)).close(timeout=-1)
    from seqpack.loader import PackingConfig

    a = PackingConfig(samples_per_rank=6, max_tokens_per_rank=48, prefetch=0)
    assert a.fingerprint() == a.replace(prefetch=4).fingerprint()  # resume across prefetch depths


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_pin_memory_without_cuda_is_ignored_with_a_warning(caplog):
    from seqpack._logging import reset_warn_once

    reset_warn_once()
    with caplog.at_level(logging.WARNING, logger="seqpack.loader.iterator"):
        steps = _run(_wrap(items(SEED, 0, 12), pin_memory=True, device="cpu"))
    assert "pin_memory=True ignored: CUDA is not available" in caplog.text
    assert len(steps) == 2 and all("copy" not in s.timings for s in steps)


@pytest.mark.parametrize("k", [0, 2])
def test_a_device_copy_happens_on_the_producer_side(k):
    # The meta device stands in for an accelerator on a CPU-only machine: the copy path runs.
    steps = _run(_wrap(items(SEED, 0, 12), device="meta", prefetch=k))
    assert len(steps) == 2
    for step in steps:
        assert "copy" in step.timings
        for batch in step.microbatches:
            assert batch.input_ids.device.type == "meta" and batch.cu_seqlens.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("k", [0, 2])
def test_a_cuda_copy_is_ready_on_the_callers_stream(k):
    reference = _run(_wrap(items(SEED, 0, 18), prefetch=0))
    steps = _run(_wrap(items(SEED, 0, 18), device="cuda", pin_memory=True, prefetch=k))
    assert len(steps) == len(reference) == 3
    for step, ref in zip(steps, reference, strict=True):
        for batch, expected in zip(step.microbatches, ref.microbatches, strict=True):
            assert batch.input_ids.is_cuda and batch.cu_seqlens.is_cuda
            assert torch.equal(batch.input_ids.cpu(), expected.input_ids)
            assert torch.equal(batch.loss_mask.cpu(), expected.loss_mask)


_EXIT_WHILE_BUSY = """
import torch
from seqpack import Topology, wrap_data_iterator

def data():  # every sample costs native torch work on the producer thread
    while True:
        x = torch.randn(256, 256)
        for _ in range(10):
            x = torch.tanh(x @ x)
        yield {"input_ids": torch.arange(1, 50)}

it = wrap_data_iterator(data(), Topology.single(), samples_per_rank=4, max_tokens_per_rank=256, prefetch=2)
next(it)
print("exiting with the thread busy", flush=True)
"""


@pytest.mark.slow
@pytest.mark.processes
def test_interpreter_exit_while_the_thread_runs_torch_code_is_clean():
    # Without the wrapper's exit hook this aborts every time on torch 2.13 ("terminate called
    # without an active exception": the thread ran torch code while C++ statics were torn down).
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_BUSY], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and "exiting with the thread busy" in proc.stdout, proc.stderr[-2000:]


def test_counts_at_the_end_of_data_survive_a_resume():
    # Items 7 and 20 are zero-length (i % 13 == 7): with 21 items and 6 per step, item 20 is
    # read in the step that finds the end of data, which drop_last drops: both counts are set.
    it = _wrap(items(SEED, 0, 21))
    _run(it)
    assert it.empty_at_end == 1 and it.dropped_at_end > 0
    again = _wrap(items(SEED, 0, 21))
    again.load_state_dict(_save_load(it.state_dict()))
    assert (again.empty_at_end, again.dropped_at_end) == (it.empty_at_end, it.dropped_at_end)
    with pytest.raises(StopIteration):
        next(again)


# --- prefetch bounds, close, and Ctrl-C (issue: reliability round three) ---------------------


class Endless:
    """An endless loader counting what the wrapper pulled from it."""

    def __init__(self):
        self.pulled = 0

    def __iter__(self):
        index = 0
        while True:
            self.pulled += 1
            yield make_item(SEED, 0, index)
            index += 1


@pytest.mark.parametrize(
    "value, kind, message",
    [
        (10**9, "ConfigError", r"prefetch=1000000000 is too large \(at most 16\)"),
        (17, "ConfigError", "prefetch=17 is too large"),
        (1.5, "SeqpackTypeError", r"prefetch must be an integer >= 0, got 1.5 \(float\)"),
        (True, "SeqpackTypeError", "prefetch must be an integer >= 0, got True"),
        ("1", "SeqpackTypeError", "prefetch must be an integer >= 0, got '1'"),
    ],
)
def test_prefetch_is_bounded_and_typed(value, kind, message):
    from seqpack import errors

    with pytest.raises(getattr(errors, kind), match=message):
        _wrap(items(SEED, 0, 12), prefetch=value)


@pytest.mark.slow
def test_prefetch_stops_at_its_memory_budget():
    loader = Endless()
    it = _wrap(loader, prefetch=16, prefetch_bytes=1)  # every prepared step is over budget
    next(it)
    time.sleep(0.3)
    read = loader.pulled
    # The step handed over, plus one step waiting: never 16 steps ahead.
    assert 12 <= read <= 18, read
    time.sleep(0.3)
    assert loader.pulled == read  # the thread waits
    it.close()


@pytest.mark.slow
def test_close_stops_a_single_rank_thread_promptly():
    loader = Endless()
    it = _wrap(loader, prefetch=16)
    next(it)
    assert wait_until(lambda: loader.pulled > 50, timeout=20)  # not vacuous: it reads ahead
    tick = time.monotonic()
    it.close(timeout=5)
    assert time.monotonic() - tick < 5
    after = loader.pulled
    time.sleep(0.3)
    assert loader.pulled - after <= 0  # nothing read after close returned
    assert not it._bg.prefetcher._thread.is_alive()


class Interrupting:
    """Raises KeyboardInterrupt when item ``at`` is pulled (as Ctrl-C inside a loader)."""

    def __init__(self, at):
        self.at = at

    def __iter__(self):
        for index, item in enumerate(items(SEED, 0, 60)):
            if index == self.at:
                raise KeyboardInterrupt
            yield item


@pytest.mark.parametrize("k", [0, 1])
def test_ctrl_c_in_the_loader_fails_the_iterator_and_loses_nothing_silently(k):
    from seqpack.errors import ResumeError, StepFailed

    it = _wrap(Interrupting(15), prefetch=k)
    next(it), next(it)  # steps 0 and 1 read items 0..11
    saved = it.state_dict()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    with pytest.raises(StepFailed, match=r"failed at step 2 and cannot continue.*KeyboardInterrupt"):
        next(it)
    with pytest.raises(ResumeError, match="failed at step 2"):
        it.state_dict()
    resumed = _wrap(items(SEED, 0, 60), prefetch=k)
    resumed.load_state_dict(saved)
    assert next(resumed).step == 2  # the interrupted step's samples are read again from the state


class _PayloadRecorder(BalancedScheduler):
    """Test-only: balanced, recording the bytes per token every plan was given."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _plan(self, request):
        self.seen.append(request.bytes_per_token)
        return super()._plan(request)


@pytest.mark.parametrize("minibatches", [1, 2])
@pytest.mark.parametrize("loss_mask", [True, False])
@pytest.mark.slow
def test_the_scheduler_is_told_the_bytes_per_token_the_exchange_carries(minibatches, loss_mask):
    recorder = _PayloadRecorder()
    steps = _run(_wrap(items(SEED, 0, 12, loss_mask=loss_mask), scheduler=recorder, minibatches=minibatches))
    assert len(steps) == 2 and len(recorder.seen) == 2 * minibatches
    # What travels: int64 input_ids, and a float32 loss_mask where the samples carry one
    # (these samples carry no labels: the wrapper makes them after the exchange).
    assert recorder.seen == [12 if loss_mask else 8] * (2 * minibatches)


@pytest.mark.parametrize("with_mask", [False, True])
def test_next_token_labels_of_a_pre_packed_sample_stop_at_each_sequence(with_mask):
    # A pre-packed sample's next-token labels run across its documents: the first document's
    # last label is the second's first token. Split, no document learns the next one's start.
    sample = {
        "input_ids": torch.arange(1, 7),
        "labels": torch.tensor([2, 3, 4, 5, 6, -100]),
        "cu_seqlens": torch.tensor([0, 3, 6]),
    }
    if with_mask:
        sample["loss_mask"] = torch.ones(6)
    config = PackingConfig(samples_per_rank=1, max_tokens_per_rank=8, scheduler="empty")
    (step,) = list(wrap_data_iterator(iter([sample]), Topology.single(), config))
    (batch,) = step.microbatches
    real = batch.padding_mask.logical_not()
    assert batch.labels[real].tolist() == [2, 3, -100, 5, 6, -100]
    assert batch.loss_mask[real].tolist() == [1, 1, 0, 1, 1, 0] and step.num_loss_tokens == 4
