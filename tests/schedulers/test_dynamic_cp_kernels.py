"""The dynamic-CP numba kernels against their slow twins (dynamic_cp_reference.py)."""

import numpy as np
import pytest
from dynamic_cp_reference import (
    choose_sizes_reference,
    layout_in_nodes_reference,
    layout_reference,
    lpt_ranks_reference,
    lpt_reference,
    place_blocks_reference,
    rounds_within,
    shelf_reference,
    widen_reference,
)
from hypothesis import given
from hypothesis import strategies as st

from seqpack.schedulers._kernels import cp_planner as _kernels
from seqpack.schedulers.dynamic_cp import allowed_group_sizes

pytestmark = pytest.mark.kernels

COEF = st.sampled_from(
    [
        np.array([1.0, 0.01, 0.0, 0.0, 0.0, 0.0]),
        np.array([2.0, 0.01, 1e-4, 0.3, 0.002, 0.02]),
        np.array([0.0, 0.0, 1e-3, 0.0, 0.01, 0.01]),
    ]
)


@given(
    lengths=st.lists(st.integers(1, 300), max_size=30),
    ranks=st.integers(1, 16),
    mode=st.sampled_from(["pow2", "any"]),
    capacity=st.integers(16, 64),
    pad=st.sampled_from([1, 2, 8]),
    coef=COEF,
    height=st.floats(0.0, 50.0),
)
@pytest.mark.slow
def test_choose_sizes_matches_reference(lengths, ranks, mode, capacity, pad, coef, height):
    sizes = allowed_group_sizes(ranks, mode)
    size_of, time_of = _kernels.choose_sizes(np.array(lengths, dtype=np.int64), sizes, coef, 4, capacity, pad, height)
    ref_size, ref_time = choose_sizes_reference(lengths, sizes.tolist(), coef, 4, capacity, pad, height)
    assert size_of.tolist() == ref_size
    assert time_of.tolist() == ref_time


@given(widths=st.lists(st.integers(1, 8), max_size=40), ranks=st.integers(8, 20))
def test_shelf_matches_reference(widths, ranks):
    round_of, used, rounds = _kernels.shelf(np.array(widths, dtype=np.int64), ranks)
    ref_round, ref_used = shelf_reference(widths, ranks)
    assert round_of.tolist() == ref_round
    assert used.tolist() == ref_used and rounds == len(ref_used)
    assert all(u <= ranks for u in ref_used)


@given(
    lengths=st.lists(st.integers(20, 400), min_size=1, max_size=12),
    ranks=st.sampled_from([8, 12, 16]),
    mode=st.sampled_from(["pow2", "any"]),
    coef=COEF,
)
@pytest.mark.slow
def test_widen_matches_reference(lengths, ranks, mode, coef):
    sizes = allowed_group_sizes(ranks, mode)
    capacity, pad = 64, 2
    lengths = sorted(lengths, reverse=True)
    size_of, time_of = _kernels.choose_sizes(np.array(lengths, dtype=np.int64), sizes, coef, 4, capacity, pad, np.inf)
    size_of = np.maximum(size_of, 2)  # make every sequence a group, as the planner widens only groups
    round_of, used, _ = _kernels.shelf(size_of, ranks)
    ref = widen_reference(round_of.tolist(), size_of.tolist(), time_of.tolist(), lengths, used.tolist(),
                          sizes.tolist(), coef, 4, capacity, pad, ranks)  # fmt: skip
    _kernels.widen(round_of, size_of, time_of, np.array(lengths, dtype=np.int64), used, sizes, coef, 4, capacity,
                   pad, ranks)  # fmt: skip
    assert (size_of.tolist(), time_of.tolist(), used.tolist()) == ref
    assert used.max(initial=0) <= ranks


@given(
    lengths=st.lists(st.integers(1, 120), max_size=40),
    bins=st.lists(st.tuples(st.sampled_from([1, 1, 2, 4]), st.floats(0.0, 5.0), st.integers(0, 60)), max_size=12),
    coef=COEF,
    pad=st.sampled_from([1, 4]),
)
@pytest.mark.slow
def test_lpt_matches_reference(lengths, bins, coef, pad):
    lengths = sorted(lengths, reverse=True)
    size = np.array([b[0] for b in bins], dtype=np.int64)
    floor = np.array([b[1] for b in bins], dtype=np.float64)
    tokens = np.array([b[2] for b in bins], dtype=np.int64)
    room = size * 128 - tokens
    load = np.zeros(len(bins)) + 0.5 * (size > 1)
    s, ss = tokens.astype(np.float64), tokens.astype(np.float64) ** 2
    ref = lpt_reference(lengths, size.tolist(), room.tolist(), load.tolist(), floor.tolist(), tokens.tolist(),
                        s.tolist(), ss.tolist(), coef, 2, pad)  # fmt: skip
    ok, bin_of = _kernels.lpt(np.array(lengths, dtype=np.int64), size, room, load, floor, tokens, s, ss, coef, 2, pad)
    assert ok == ref[0]
    assert bin_of.tolist() == ref[1]
    if ok:
        assert (room.tolist(), load.tolist(), tokens.tolist(), s.tolist(), ss.tolist()) == tuple(ref[2])
        assert room.min(initial=0) >= 0


def test_lpt_saw_parking_and_failure():
    """Not vacuous: a bin too full for a long sequence takes a later short one, and a
    sequence no bin holds is reported."""
    size, room = np.array([1, 1]), np.array([100, 30])
    load, floor = np.zeros(2), np.array([0.0, 9.0])
    tokens, s, ss = np.zeros(2, dtype=np.int64), np.zeros(2), np.zeros(2)
    coef = np.array([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    ok, bin_of = _kernels.lpt(np.array([90, 20]), size, room, load, floor, tokens, s, ss, coef, 8, 1)
    assert ok and bin_of.tolist() == [0, 1]  # bin 1 (most below its floor) was parked for 90, took 20
    ok, _ = _kernels.lpt(np.array([95]), size, room, load, floor, tokens, s, ss, coef, 8, 1)
    assert not ok


@given(
    groups=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1, 1, 1, 2, 3, 5, 8, 12])), max_size=30),
    rpn=st.sampled_from([4, 8]),
)
@pytest.mark.slow
def test_layouts_match_reference(groups, rpn):
    ranks = 24
    rnd, size = rounds_within(groups, ranks)
    rnd_a, size_a = np.array(rnd, dtype=np.int64), np.array(size, dtype=np.int64)
    order = np.lexsort((np.arange(len(size)), -size_a, rnd_a))
    assert _kernels.layout(order, rnd_a, size_a).tolist() == layout_reference(rnd, size)
    start = _kernels.layout_in_nodes(order, rnd_a, size_a, rpn, ranks)
    assert start.tolist() == layout_in_nodes_reference(rnd, size, rpn, ranks)
    for m in set(rnd):  # blocks of a round never overlap
        taken = np.zeros(ranks, dtype=int)
        for b in np.flatnonzero(rnd_a == m):
            taken[start[b] : start[b] + size_a[b]] += 1
        assert taken.max() <= 1


def test_layout_in_nodes_keeps_small_groups_in_a_node():
    rnd = np.zeros(6, dtype=np.int64)
    size = np.array([3, 3, 3, 3, 2, 2])  # 16 ranks, 2 nodes of 8: plainly 3+3 then 3 spans 6..8
    order = np.lexsort((np.arange(6), -size, rnd))
    plain = _kernels.layout(order, rnd, size)
    nodes = _kernels.layout_in_nodes(order, rnd, size, 8, 16)
    spans = lambda start: [(s // 8) != ((s + c - 1) // 8) for s, c in zip(start, size, strict=True)]  # noqa: E731
    assert any(spans(plain)) and not any(spans(nodes))


@given(
    widths=st.lists(st.sampled_from([1, 2, 4, 8, 16]), max_size=20),
    times=st.lists(st.floats(0.1, 5.0), min_size=20, max_size=20),
    ranks=st.sampled_from([16, 24, 32]),
)
@pytest.mark.slow
def test_place_blocks_matches_reference(widths, times, ranks):
    widths = sorted(widths, reverse=True)
    times = times[: len(widths)]
    start, rounds, load, depth = _kernels.place_blocks(np.array(widths, dtype=np.int64), np.array(times), ranks)
    ref = place_blocks_reference(widths, times, ranks)
    assert (start.tolist(), rounds.tolist(), load.tolist(), depth.tolist()) == ref
    for lo, c in zip(start.tolist(), widths, strict=True):
        assert lo % c == 0 and lo + c <= ranks


@given(
    lengths=st.lists(st.integers(1, 120), max_size=50),
    load=st.lists(st.floats(0.0, 3.0), min_size=6, max_size=6),
    depth=st.integers(1, 4),
    coef=COEF,
    pad=st.sampled_from([1, 4]),
)
@pytest.mark.slow
def test_lpt_ranks_matches_reference(lengths, load, depth, coef, pad):
    lengths = sorted(lengths, reverse=True)
    busy = np.array(load)
    ok, rank_of, slot_of, count = _kernels.lpt_ranks(np.array(lengths, dtype=np.int64), busy, 128, pad, coef, depth)
    ref = lpt_ranks_reference(lengths, load, 128, pad, coef, depth)
    assert ok == ref[0]
    assert (rank_of.tolist(), slot_of.tolist(), count.tolist()) == tuple(ref[1:])
