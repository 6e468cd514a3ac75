"""The grid schedulers at a large ``dp_size`` do Python work in the sequences, not the
replicas: no Python loop over ``dp_size`` and no Python object per replica or microbatch
(arrays of ``dp_size`` cells are the plan itself)."""

import gc
import sys

import numpy as np
import pytest

from seqpack.schedulers import get_scheduler


def python_calls(fn) -> int:
    """Python and C function calls made while ``fn()`` runs, with the garbage collector off: a
    loop over replicas makes at least one per replica."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    gc.collect()  # no finalizer of an earlier test's garbage runs (and counts) inside fn
    gc.disable()
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


@pytest.mark.parametrize("name", ["balanced", "dp_balanced", "empty"])
@pytest.mark.parametrize("with_origin", [False, True])
def test_python_work_does_not_grow_with_dp(name, with_origin):
    lengths = np.random.default_rng(0).integers(1, 4096, size=100)
    scheduler = get_scheduler(name)

    def plan(dp_size: int):
        origin = np.arange(lengths.shape[0]) * 7919 % dp_size if with_origin else None
        return scheduler.schedule(lengths, dp_size=dp_size, max_tokens_per_rank=4096, origin=origin)

    plan(4)  # kernels loaded
    small, large = python_calls(lambda: plan(1000)), python_calls(lambda: plan(10**6))
    assert large == small
    assert plan(10**6).num_groups >= 10**6  # the plan really spans every replica
