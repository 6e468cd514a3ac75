"""The ``empty`` scheduler against its slow, obvious twin (sched_reference.empty_reference)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from sched_reference import empty_reference

from seqpack.schedulers import get_scheduler
from seqpack.thd import padded_lengths


@given(
    lengths=st.lists(st.integers(1, 64), max_size=60),
    data=st.data(),
    dp=st.integers(1, 9),
    cp=st.integers(1, 2),
    max_tokens_per_rank=st.integers(64, 160),
    pad_multiple=st.sampled_from([1, 4]),
)
def test_empty_matches_reference(lengths, data, dp, cp, max_tokens_per_rank, pad_multiple):
    origin = data.draw(st.lists(st.integers(0, dp - 1), min_size=len(lengths), max_size=len(lengths)))
    limits = {"dp_size": dp, "cp_size": cp, "max_tokens_per_rank": max_tokens_per_rank, "pad_multiple": pad_multiple}
    plan = get_scheduler("empty").schedule(lengths, origin=origin, **limits)
    padded = padded_lengths(np.array(lengths, dtype=np.int64), pad_multiple).tolist()
    expected = empty_reference(padded, origin, max_tokens_per_rank * cp, dp)
    assert [[ids.tolist() for ids in row] for row in plan.assignment] == expected
