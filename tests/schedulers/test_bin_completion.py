"""Bin completion, the exact search's second stage (issue 24, item 12): against brute force
on small instances, and on the verl-like batches the item search alone gave up on."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_tier import large
from sched_reference import min_bins_reference
from test_quality import verl_lengths

from seqpack.schedulers import _kernels, get_scheduler
from seqpack.schedulers._kernels.bin_search import complete_bins
from seqpack.schedulers.balanced import exact
from seqpack.schedulers.balanced.exact import FOUND, GAVE_UP, INFEASIBLE, pack_bins

pytestmark = pytest.mark.kernels

# verl-like batches (25 sequences of 50-90 tokens, 300 per microbatch) where 6 microbatches
# hold the sequences but the item search gave up within its budget and balanced took 7.
PACKABLE_IN_SIX = [349, 525, 658, 1144, 1444, 1665, 1690, 1735, 1751, 1790, 1880, 1952]
# ... and where 6 cannot hold them although the bin bound says 6: the item search gives up
# within its budget (it proves them with 50x); bin completion proves them with 5x.
NOT_IN_SIX = [514, 1180, 1897]


def _packs(sizes, bin_of, bins, capacity):
    sizes = np.asarray(sizes)
    return bin_of.min() >= 0 and bin_of.max() < bins and np.bincount(bin_of, sizes, bins).max() <= capacity


def _complete(sizes, bins, capacity, work=10_000_000):
    s = np.sort(np.asarray(sizes, dtype=np.int64))[::-1].copy()
    status, bin_of = complete_bins(s, bins, capacity, work)
    return status, s, bin_of


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=10), capacity=st.integers(60, 100))
@pytest.mark.slow
def test_complete_bins_against_brute_force(sizes, capacity):
    best = min_bins_reference(sizes, capacity)
    status, s, bin_of = _complete(sizes, best, capacity)
    assert status == FOUND
    assert _packs(s, bin_of, best, capacity)
    if best > 1:
        assert _complete(sizes, best - 1, capacity)[0] == INFEASIBLE


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(18, 34), min_size=2, max_size=11), capacity=st.integers(60, 100))
@pytest.mark.slow
def test_complete_bins_many_equal_sizes_against_brute_force(sizes, capacity):
    # Narrow sizes: many equal items (counted, not named) and sets that leave a size out
    # (the dominance rules: none left out may fit the room, or fit in place of a smaller one).
    best = min_bins_reference(sizes, capacity)
    status, s, bin_of = _complete(sizes, best, capacity)
    assert status == FOUND and _packs(s, bin_of, best, capacity)
    if best > 1:
        assert _complete(sizes, best - 1, capacity)[0] == INFEASIBLE


def test_complete_bins_gives_up_within_its_work():
    rng = np.random.default_rng(1)
    sizes = rng.integers(200, 400, 300)
    assert _complete(sizes, exact.bin_lower_bound(sizes, 1000), 1000, work=10)[0] == GAVE_UP


@large
@pytest.mark.parametrize("seed", PACKABLE_IN_SIX)
def test_verl_batches_the_item_search_gave_up_on_use_six(seed):
    lengths = verl_lengths(seed)
    assert exact.bin_lower_bound(np.array(lengths), 300) == 6
    status, bin_of = pack_bins(np.array(lengths), 6, 300)
    assert status == FOUND and _packs(lengths, bin_of, 6, 300)
    schedule = get_scheduler("balanced", min_microbatches=4).schedule(lengths, dp_size=1, max_tokens_per_rank=300)
    schedule.validate(lengths)
    assert schedule.num_microbatches == 6


@large
@pytest.mark.parametrize("seed", PACKABLE_IN_SIX[:3])
def test_the_item_search_alone_gives_up_on_them(seed, monkeypatch):
    # Not vacuous: without bin completion these batches are not packed within the budget.
    monkeypatch.setattr(exact, "FEW_PER_BIN", 0)
    assert pack_bins(np.array(verl_lengths(seed)), 6, 300)[0] == GAVE_UP


@large
@pytest.mark.parametrize("seed", NOT_IN_SIX)
def test_verl_batches_six_cannot_hold_are_proved_infeasible(seed):
    assert pack_bins(np.array(verl_lengths(seed)), 6, 300, max_work=20_000_000)[0] == INFEASIBLE


def test_zero_lengths_take_the_item_search(monkeypatch):
    # Bin completion takes positive sizes only; with a zero length the item search packs alone.
    called = []
    monkeypatch.setattr(_kernels, "complete_bins", lambda *a: called.append(a) or (GAVE_UP, None))
    sizes = np.array([0, *verl_lengths(PACKABLE_IN_SIX[0]), 0])
    status, bin_of = pack_bins(sizes, 6, 300)
    assert not called and status in (FOUND, GAVE_UP)
    if status == FOUND:
        assert _packs(sizes, bin_of, 6, 300)
    assert pack_bins(np.array([0, 0, 5]), 1, 5)[0] == FOUND
