"""A scheduler that crosses a process boundary (pickled, as a planning process or a fork server
receives it) plans exactly as the original."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from seqpack.schedulers import get_scheduler

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("dp_size", [1, 4])
def test_a_pickled_scheduler_plans_the_same(dp_size):
    lengths = np.random.default_rng(0).integers(1, 900, 500)
    scheduler = get_scheduler("balanced")
    copy = pickle.loads(pickle.dumps(scheduler))
    kw = dict(dp_size=dp_size, max_tokens_per_rank=1024)
    a, b = scheduler.schedule(lengths, **kw), copy.schedule(lengths, **kw)
    assert a.num_microbatches == b.num_microbatches
    assert a.fingerprint() == b.fingerprint()
    assert repr(copy) == repr(scheduler)
