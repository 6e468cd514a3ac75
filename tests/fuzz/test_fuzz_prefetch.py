"""Fuzz prefetch (issue 24): hostile values for ``prefetch``, ``prefetch_bytes`` and
``close(timeout=)``; calls out of order (``next`` after ``close``, ``close`` twice or from
another thread while ``next`` waits, ``state_dict`` while the thread reads ahead,
``load_state_dict`` late); the data iterator raising (``ValueError``, ``RuntimeError``,
``KeyboardInterrupt``, ``SystemExit``) at every kind of point, its ``state_dict`` raising; and
a real SIGINT while ``next()`` waits.

The contract (docs/errors.md, "Interrupts, prefetch and settings that differ between ranks"):
a bad value is one SeqpackError naming it; a failure fails the iterator at the step it
belongs to (named, never -1), later ``next()`` raise StepFailed and ``state_dict()``
ResumeError; a run resumed from a state saved before the failure delivers every sample
exactly once; Ctrl-C while ``next()`` only waits loses nothing. Single process, ~10 s."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import pytest
from hostile import HOSTILE, Target, check_answer
from wrapper_data import batch_arrays, check_full_batch, expected_sequences, items, wait_until

from seqpack.errors import ResumeError, SeqpackError, StepFailed
from seqpack.loader import wrap_data_iterator
from seqpack.topology import Topology

SEED = 11
COUNT = 18  # items: 3 steps of 6
SPR = 6


def _wrap(data, **kwargs):
    kwargs.setdefault("samples_per_rank", SPR)
    kwargs.setdefault("max_tokens_per_rank", 48)
    kwargs.setdefault("scheduler", "empty")
    kwargs.setdefault("pad_multiple", 4)
    return wrap_data_iterator(data, Topology.single(), **kwargs)


def _seen(steps) -> list[tuple]:
    return [
        who
        for step in steps
        for batch in step.microbatches
        for who, _ in check_full_batch(batch_arrays(batch), SEED, 4)
    ]


def _all() -> list[tuple]:
    return sorted(expected_sequences(SEED, 0, COUNT))


class Counted:
    """The data, counting what the wrapper has pulled; ``fail``: (index, exception type)
    raised when that item is pulled; ``slow``: seconds to sleep before each item from then on."""

    def __init__(self, count=COUNT, fail=None, slow=None):
        self.count, self.fail, self.slow, self.pulled = count, fail, slow, 0

    def __iter__(self):
        for index, item in enumerate(items(SEED, 0, self.count)):
            if self.slow is not None and index >= self.slow[0]:
                time.sleep(self.slow[1])
            if self.fail is not None and index == self.fail[0]:
                raise self.fail[1]("the loader broke")
            self.pulled += 1
            yield item
        if self.fail is not None and self.fail[0] >= self.count:  # raises at its end instead of stopping
            raise self.fail[1]("the loader broke at its end")


# --- hostile values -------------------------------------------------------------------------


def _closed_with(timeout):
    it = _wrap(items(SEED, 0, COUNT), prefetch=2)
    next(it)
    it.close(timeout)


TARGETS = [
    Target(
        "wrap_data_iterator",
        lambda **kw: _wrap(items(SEED, 0, COUNT), **kw).close(),
        lambda: {"prefetch": 1, "prefetch_bytes": 2**20},
        {"prefetch": "int", "prefetch_bytes": "int"},
    ),
    Target("PackingIterator.close", _closed_with, lambda: {"timeout": 1.0}, {"timeout": "number"}),
    Target(
        "wrap_data_iterator",
        lambda **kw: _wrap(items(SEED, 0, COUNT), **kw).close(),
        lambda: {"group_timeout": 60.0},
        {"group_timeout": "opt_number"},
    ),
]


@pytest.mark.parametrize("target, arg", [(t, a) for t in TARGETS for a in t.args], ids=lambda v: getattr(v, "name", v))
@pytest.mark.slow
def test_every_hostile_value_is_refused_by_name_or_taken_as_given(target, arg):
    answers = collections.Counter()
    for _, make in HOSTILE:
        kwargs = target.valid()
        kwargs[arg] = make()
        answers[check_answer(target, arg, kwargs[arg], kwargs)] += 1
    assert answers["ok"] and answers["refused"], answers  # not vacuous: both kinds of answer seen


@pytest.mark.parametrize("value", [17, 10**9, 2**63, 2**64])
def test_absurd_prefetch_is_refused_before_any_thread(value):
    with pytest.raises(SeqpackError, match="prefetch"):
        _wrap(Counted(), prefetch=value)
    with pytest.raises(SeqpackError, match="prefetch_bytes"):
        _wrap(Counted(), prefetch_bytes=value * 2**63)


# --- call order ----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 16])
@pytest.mark.slow
def test_next_after_close_close_twice_and_after_the_end(k):
    it = _wrap(Counted(), prefetch=k)
    first = next(it)
    it.close()
    it.close(0)  # twice: nothing
    with pytest.raises(SeqpackError, match="closed"):
        next(it)
    assert it.state_dict()["consumed"] == SPR and first.step == 0  # the step handed over, no more
    done = _wrap(Counted(), prefetch=k)
    assert _seen(list(done)) == _all()
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(done)
    done.close()
    with pytest.raises(SeqpackError, match="needs a fresh iterator"):
        done.load_state_dict(it.state_dict())


@pytest.mark.parametrize("k", [1, 3, 16])
@pytest.mark.slow
def test_state_dict_while_the_thread_reads_ahead_describes_the_steps_handed_over(k):
    source = Counted(count=60)
    it = _wrap(source, prefetch=k)
    handed = [next(it), next(it)]
    assert wait_until(lambda: source.pulled >= min(60, SPR * (2 + k)))  # the thread is ahead
    state = it.state_dict()
    assert state["consumed"] == 2 * SPR and state["steps"] == 2, (state["consumed"], source.pulled)
    it.close()
    resumed = _wrap(items(SEED, 0, 60), prefetch=k)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(_seen(handed + rest)) == sorted(expected_sequences(SEED, 0, 60))  # exactly once


@pytest.mark.slow
def test_close_from_another_thread_while_next_waits():
    source = Counted(count=60, slow=(SPR, 0.05))
    it = _wrap(source, prefetch=2)
    next(it)
    timer = threading.Timer(0.1, it.close)
    timer.start()
    answers = []
    for _ in range(4):
        try:
            answers.append(next(it).step)
        except SeqpackError as exc:  # closed: the documented answer
            answers.append(str(exc))
            break
    timer.join()
    assert answers[-1] == "next() on a closed PackingIterator", answers
    assert not it._bg.prefetcher._thread.is_alive()


def test_close_between_the_closed_check_and_the_wait():
    """The race of the test above, made deterministic: close() from another thread stops the
    prefetcher (and frees its steps) after next() passed its closed check. next() says the
    iterator is closed, not that the thread "ended without handing over the step"."""
    it = _wrap(Counted(count=60), prefetch=2)
    next(it)
    assert it._bg.prefetcher.stop(10.0)  # close()'s release, seen from the waiting next()
    with pytest.raises(SeqpackError, match=r"^next\(\) on a closed PackingIterator$"):
        next(it)


# --- the data iterator raising ---------------------------------------------------------------

FAILURES = [ValueError, RuntimeError, KeyboardInterrupt, SystemExit]
POINTS = [0, 3, SPR, 2 * SPR - 1, COUNT - 1, COUNT]  # first item, mid-step, step start, step end, last, at its end


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("at", POINTS)
@pytest.mark.parametrize("kind", FAILURES, ids=lambda kind: kind.__name__)
@pytest.mark.slow
def test_a_failing_loader_fails_its_step_and_a_resume_loses_nothing(k, at, kind):
    it = _wrap(Counted(fail=(at, kind)), prefetch=k)
    delivered, saved = [], it.state_dict()
    failing = min(at // SPR, COUNT // SPR)  # the step whose read meets the failure
    with pytest.raises(BaseException) as raised:  # noqa: B017 - which one is asserted below
        while True:
            delivered.append(next(it))
            saved = it.state_dict()
    if raised.type is StopIteration:  # only a failure at the very end, after the last full step, may end quietly
        pytest.fail(f"the failure at item {at} was swallowed")
    assert [s.step for s in delivered] == list(range(failing))
    if issubclass(kind, Exception):
        assert raised.type is StepFailed and f"at step {failing}" in str(raised.value), raised.value
        assert "the loader broke" in str(raised.value)
    else:
        assert raised.type is kind  # Ctrl-C and SystemExit stay what they are
    with pytest.raises(StepFailed, match=rf"failed at step {failing} and cannot continue") as again:
        next(it)
    assert "step -1" not in str(again.value) and "the loader broke" in str(again.value), again.value
    if kind is not ValueError:  # a ValueError's message stands alone (seqpack's sample errors are ValueErrors)
        assert kind.__name__ in str(again.value), again.value
    with pytest.raises(ResumeError):
        it.state_dict()
    it.close()
    resumed = _wrap(items(SEED, 0, COUNT), prefetch=k)
    resumed.load_state_dict(saved)
    assert sorted(_seen(delivered + list(resumed))) == _all()  # every sample exactly once


class StatefulCounted(Counted):
    def __init__(self, fail_state_at):
        super().__init__(count=COUNT)
        self.fail_state_at, self.position = fail_state_at, 0

    def __iter__(self):
        for item in super().__iter__():
            self.position += 1
            yield item

    def state_dict(self):
        if self.position >= self.fail_state_at:
            raise OSError("the loader's state cannot be read")
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


@pytest.mark.parametrize("k", [0, 1])
def test_a_loader_whose_state_dict_raises_fails_that_step(k):
    it = _wrap(StatefulCounted(fail_state_at=SPR + 1), prefetch=k)
    assert next(it).step == 0
    with pytest.raises(StepFailed, match="step 1: delivery failed on .*OSError: the loader's state") as failed:
        next(it)
    assert isinstance(failed.value.__cause__, OSError)
    with pytest.raises(StepFailed, match="failed at step 1 and cannot continue.*OSError"):
        next(it)
    it.close()


# --- a real SIGINT -------------------------------------------------------------------------


def _sigint_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler, reason="SIGINT is handled")
@pytest.mark.slow
def test_ctrl_c_while_next_waits_for_the_thread_loses_nothing():
    source = Counted(count=30, slow=(SPR, 0.1))  # step 1 takes 0.6 s to read
    it = _wrap(source, prefetch=1)
    steps = [next(it)]
    timer = _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        steps.append(next(it))  # waits for step 1: the interrupt lands in the wait, not in a step
    timer.join()
    steps += list(it)  # the step it waited for is still handed over
    assert [s.step for s in steps] == list(range(5))
    assert sorted(_seen(steps)) == sorted(expected_sequences(SEED, 0, 30))


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler, reason="SIGINT is handled")
@pytest.mark.slow
def test_ctrl_c_inside_a_synchronous_step_fails_it_and_a_resume_loses_nothing():
    source = Counted(count=30, slow=(SPR, 0.1))
    it = _wrap(source, prefetch=0)
    steps = [next(it)]
    saved = it.state_dict()
    timer = _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        next(it)  # lands in the loader's read, inside the step
    timer.join()
    with pytest.raises(StepFailed, match="failed at step 1 and cannot continue.*KeyboardInterrupt"):
        next(it)
    resumed = _wrap(items(SEED, 0, 30), prefetch=0)
    resumed.load_state_dict(saved)
    assert sorted(_seen(steps + list(resumed))) == sorted(expected_sequences(SEED, 0, 30))


@pytest.mark.parametrize("kind", [RuntimeError, KeyboardInterrupt])
def test_a_failure_outside_the_step_is_named_by_its_step(monkeypatch, kind):
    # produce() never raises by contract; if it does (a bug, an interrupt between its lines),
    # the thread names the step it was preparing (it said 'failed at step -1').
    from seqpack.loader.producer import StepProducer

    original = StepProducer.produce

    def produce(self):
        if self.steps == 1:
            raise kind("between the lines")
        return original(self)

    monkeypatch.setattr(StepProducer, "produce", produce)
    it = _wrap(Counted(), prefetch=1)
    assert next(it).step == 0
    with pytest.raises(kind):
        next(it)
    with pytest.raises(StepFailed, match=r"failed at step 1 and cannot continue .*step 1 failed on rank 0") as again:
        next(it)
    assert "-1" not in str(again.value)
