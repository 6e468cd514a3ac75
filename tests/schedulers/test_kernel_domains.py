"""Kernel fuzz over every argument: each scheduler kernel called directly with every one of
its arguments drawn over the domain its docstring states, each call checked against its
slow reference by the checks of test_kernel_fuzz.py.

The schedulers pass only the arguments their options make (eight ranks per node, the
planner's capacities and orders), so a kernel reached through them never sees much of its
domain: issue 39's out-of-bounds write needed one rank per node. Here the node size runs
from 1 past the ranks, group-size sets are any ascending sets, capacities, multiples,
origins, caps and work limits are drawn, and the preconditions a docstring names
(longest first, rounds within the ranks, ...) are the only shaping.

The fuzz runs under ``./dev test-kernels`` only, bounds-checked and as plain Python on
small shapes (tests/kernel_tier.py); what it found is pinned below it for every tier.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

import numpy as np
import pytest
from dynamic_cp_reference import choose_sizes_reference, pack_time, padded, shelf_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_tier import TIER, small
from sched_reference import first_cost_above_reference, walk_reference
from test_kernel_fuzz import CHECKS, _grid

pytestmark = pytest.mark.kernels
fuzz = pytest.mark.skipif(not TIER, reason="the kernel fuzz runs under ./dev test-kernels (checked and plain Python)")

N = 12 if small() else 40  # sequences per call
R = 8 if small() else 16  # ranks, replicas, bins
LENGTH = st.integers(1, 400)
FLOAT = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 100.0))
# CostModel.group_coefficients: (constant, linear, quadratic, ring_step, ring_token, ring_token_inter), each >= 0
COEF = st.lists(st.one_of(st.just(0.0), st.floats(0.0, 10.0)), min_size=6, max_size=6)
CAP = st.one_of(st.just(np.inf), FLOAT)  # a cost cap or budget: any non-negative float, or none


def _i(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64).reshape(-1)


def _f(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.float64).reshape(-1)


def _longest_first(lengths: np.ndarray) -> np.ndarray:
    return np.lexsort((np.arange(lengths.shape[0]), -lengths)).astype(np.int64)


def _floats(draw: st.DrawFn, n: int, values: st.SearchStrategy[float] = FLOAT) -> np.ndarray:
    return _f(draw(st.lists(values, min_size=n, max_size=n)))


def _ints(draw: st.DrawFn, n: int, lo: int, hi: int) -> np.ndarray:
    return _i(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)))


def _sizes(draw: st.DrawFn, ranks: int) -> np.ndarray:
    """Allowed group sizes: any ascending set within the ranks (pow2 and "any" among them)."""
    return _i(sorted(draw(st.sets(st.integers(1, ranks), min_size=1))))


# --- balanced -------------------------------------------------------------------------------


@st.composite
def grid_lpt(draw: st.DrawFn) -> dict[str, Any]:
    lengths = _i(draw(st.lists(st.integers(0, 400), max_size=N)))
    n = lengths.shape[0]
    return {
        "order": _longest_first(lengths),  # items longest first
        "lengths": lengths,
        "costs": _floats(draw, n),
        "targets": _floats(draw, draw(st.integers(1 if n else 0, R)), st.floats(-100.0, 100.0)),
        "capacity": draw(st.integers(1, 800)),
        "mode": draw(st.sampled_from([0, 1, 2])),  # MODE_COST, MODE_TOKENS, MODE_FIRST_FIT
    }


@st.composite
def grid_local(draw: st.DrawFn) -> dict[str, Any]:
    dp, rounds = draw(st.integers(1, R)), draw(st.integers(1, 4))  # targets: rounds * dp, rounds >= 1
    lengths = _i(draw(st.lists(LENGTH, max_size=N)))
    n = lengths.shape[0]
    capacity = draw(st.integers(1, 1200))
    return {
        "order": _longest_first(lengths),
        "lengths": lengths,
        "values": _floats(draw, n),
        "targets": _floats(draw, rounds * dp, st.floats(0.0, 2000.0)),
        "home_fill": draw(st.floats(0.0, 3.0)),
        "token_share": draw(st.integers(0, 2 * capacity)),
        "capacity": capacity,
        "origin": _ints(draw, n, 0, dp - 1),
        "dp_size": dp,
    }


@st.composite
def home_swaps(draw: st.DrawFn) -> dict[str, Any]:
    """Homes of HOME_TREE_MIN (256) sequences or more and 64 rounds or more take the tree
    paths: the checked build draws them too."""
    many = not small() and draw(st.booleans())
    dp = draw(st.integers(1, 2 if many else R))
    rounds = draw(st.integers(64, 72) if many else st.integers(1, 6))
    n = draw(st.integers(256 * dp, 300 * dp) if many else st.integers(0, N))
    lengths, costs = _ints(draw, n, 1, 400), _floats(draw, n)
    round_of, replica_of, origin = _ints(draw, n, 0, rounds - 1), _ints(draw, n, 0, dp - 1), _ints(draw, n, 0, dp - 1)
    load = _grid(round_of, replica_of, costs, (rounds, dp))
    within = _grid(round_of, replica_of, lengths, (rounds, dp)).max(initial=0)
    slack = draw(st.sampled_from([0.0, 0.1, 1.0]))  # caps over the plan's own as the caller sets them, or any
    return {
        "round_of": round_of,
        "replica_of": replica_of,
        "lengths": lengths,
        "costs": costs,
        "origin": origin,
        "dp": dp,
        "rounds": rounds,
        "capacity": draw(st.integers(max(1, within // 2), within + 400)),
        "round_cap": load.max(axis=1) * (1 + slack) if draw(st.booleans()) else _floats(draw, rounds, CAP),
        "replica_cap": float(load.sum(axis=0).max(initial=0)) * (1 + slack) if draw(st.booleans()) else draw(CAP),
        "order": np.lexsort((draw(st.permutations(range(n))), origin)).astype(np.int64),  # grouped by origin
        "passes": draw(st.integers(0, 3)),
    }


@st.composite
def repair_replicas(draw: st.DrawFn) -> dict[str, Any]:
    dp, rounds = draw(st.integers(1, R)), draw(st.integers(1, 5))
    n = draw(st.integers(0, N))
    lengths, costs = _ints(draw, n, 1, 400), _floats(draw, n)
    round_of, replica_of = _ints(draw, n, 0, rounds - 1), _ints(draw, n, 0, dp - 1)
    load, tok = _grid(round_of, replica_of, costs, (rounds, dp)), _grid(round_of, replica_of, lengths, (rounds, dp))
    return {
        "round_of": round_of,
        "replica_of": replica_of,
        "costs": costs,
        "lengths": lengths,
        "load": load,  # the sums over the sequences
        "tok": tok,
        "capacity": draw(st.integers(1, int(tok.max(initial=0)) + 400)),
        "max_moves": draw(st.integers(0, 40)),
        "rel_tol": draw(st.sampled_from([0.0, 1e-9, 0.1])),
        "stop_at": draw(st.one_of(st.just(0.0), st.just(np.inf), st.floats(0.0, float(load.sum()) + 1.0))),
        "swap_candidates": draw(st.integers(0, dp + 1)),
        "max_work": draw(st.sampled_from([0, 7, 100, 50_000_000])),
        "scan_limit": draw(st.integers(0, 20)),
    }


@st.composite
def greedy_matching(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, R))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n)) if n else []
    return {"rows": _i([r for r, _ in pairs]), "cols": _i([c for _, c in pairs]), "n": n}


@st.composite
def next_fit(draw: st.DrawFn) -> dict[str, Any]:
    capacity = draw(st.integers(1, 400))
    return {"lengths": _i(draw(st.lists(st.integers(0, 2 * capacity), max_size=N))), "capacity": capacity}


@st.composite
def _packing(draw: st.DrawFn, positive: bool) -> dict[str, Any]:
    """Items longest first, each at most ``capacity`` (``complete_bins``: positive, total at
    most ``n_bins * capacity``); at most 10, so an infeasibility is checked by brute force."""
    capacity, n_bins = draw(st.integers(1, 60)), draw(st.integers(1, 5))
    sizes = sorted(draw(st.lists(st.integers(1 if positive else 0, capacity), min_size=1, max_size=10)), reverse=True)
    while positive and sum(sizes) > n_bins * capacity:
        sizes.pop(0)
    max_work = draw(st.sampled_from([0, 5, 10**6]))
    return {"sizes": _i(sizes), "n_bins": n_bins, "capacity": capacity, "max_work": max_work}


@st.composite
def replica_lpt(draw: st.DrawFn) -> dict[str, Any]:
    capacity = draw(st.integers(1, 400))
    sizes = _i(draw(st.lists(st.integers(1, capacity), max_size=N)))  # padded, each at most capacity
    costs = _floats(draw, sizes.shape[0])
    return {
        "order": np.lexsort((np.arange(costs.shape[0]), -costs)).astype(np.int64),  # costliest first
        "sizes": sizes,
        "costs": costs,
        "dp": draw(st.integers(1, R)),
        "num_rounds": draw(st.integers(1, 4)),
        "capacity": capacity,
        "max_work": draw(st.sampled_from([0, 3, 10**6])),
    }


# --- dynamic CP -----------------------------------------------------------------------------


@st.composite
def _step(draw: st.DrawFn) -> dict[str, Any]:
    """The planner's common arguments: ranks, allowed sizes, cost, node size (1 to past the
    ranks), capacity and multiple."""
    ranks = draw(st.integers(1, R))
    return {
        "num_ranks": ranks,
        "sizes": _sizes(draw, ranks),
        "coef": _f(draw(COEF)),
        "ranks_per_node": draw(st.integers(1, ranks + 1)),
        "capacity": draw(st.integers(1, 300)),
        "pad_multiple": draw(st.integers(1, 8)),
    }


@st.composite
def choose_sizes(draw: st.DrawFn) -> dict[str, Any]:
    s = draw(_step())
    del s["num_ranks"]
    return {**s, "lengths": _i(draw(st.lists(LENGTH, max_size=N))), "height": draw(st.one_of(st.just(np.inf), FLOAT))}


@st.composite
def shelf(draw: st.DrawFn) -> dict[str, Any]:
    ranks = draw(st.integers(1, R))
    return {"widths": _i(draw(st.lists(st.integers(1, ranks), max_size=N))), "num_ranks": ranks}


@st.composite
def widen(draw: st.DrawFn) -> dict[str, Any]:
    """Sizes and times of a height's choice, rounds of :func:`shelf` (each holds one)."""
    s = draw(_step())
    lengths = draw(st.lists(LENGTH, max_size=N))
    size_of, time_of = choose_sizes_reference(lengths, s["sizes"].tolist(), s["coef"], s["ranks_per_node"],
                                              s["capacity"], s["pad_multiple"], draw(FLOAT))  # fmt: skip
    held = [i for i in range(len(lengths)) if size_of[i] > 0]
    round_of, used = shelf_reference([size_of[i] for i in held], s["num_ranks"])
    return {
        **s,
        "round_of": _i(round_of),
        "size_of": _i([size_of[i] for i in held]),
        "time_of": _f([time_of[i] for i in held]),
        "lengths": _i([lengths[i] for i in held]),
        "used": _i(used),
    }


@st.composite
def lpt(draw: st.DrawFn) -> dict[str, Any]:
    s = draw(_step())
    nb = draw(st.integers(0, R))
    size = _i(draw(st.lists(st.sampled_from(s["sizes"].tolist()), min_size=nb, max_size=nb)))
    full = size * s["capacity"]
    tokens = _i([draw(st.integers(0, f)) for f in full.tolist()])
    room = _i([draw(st.integers(0, f)) for f in (full - tokens).tolist()])
    tf = tokens.astype(np.float64)
    return {
        "lengths": _i(sorted(draw(st.lists(LENGTH, max_size=N)), reverse=True)),  # longest first
        "bin_size": size,
        "bin_room": room,
        "bin_load": _floats(draw, nb),
        "bin_floor": _floats(draw, nb),
        "bin_tokens": tokens,
        "bin_s": tf,
        "bin_ss": tf * tf,
        "coef": s["coef"],
        "ranks_per_node": s["ranks_per_node"],
        "pad_multiple": s["pad_multiple"],
    }


@st.composite
def _rounds(draw: st.DrawFn, ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, round, size) of bins in rounds whose widths sum to at most ``ranks`` (the
    order the callers give: by round, then size descending, then index)."""
    rnd, size, used = [], [], {}
    for m, c in draw(st.lists(st.tuples(st.integers(0, 3), st.integers(1, ranks)), max_size=N)):
        if used.get(m, 0) + c <= ranks:
            used[m] = used.get(m, 0) + c
            rnd.append(m)
            size.append(c)
    rnd_a, size_a = _i(rnd), _i(size)
    return np.lexsort((np.arange(size_a.shape[0]), -size_a, rnd_a)).astype(np.int64), rnd_a, size_a


@st.composite
def layout(draw: st.DrawFn) -> dict[str, Any]:
    order, rnd, size = draw(_rounds(draw(st.integers(1, R))))
    return {"order": order, "bin_round": rnd, "bin_size": size}


@st.composite
def layout_in_nodes(draw: st.DrawFn) -> dict[str, Any]:
    ranks = draw(st.integers(1, R))
    order, rnd, size = draw(_rounds(ranks))
    rpn = draw(st.integers(1, ranks + 1))
    return {"order": order, "bin_round": rnd, "bin_size": size, "ranks_per_node": rpn, "num_ranks": ranks}


@st.composite
def bin_times(draw: st.DrawFn) -> dict[str, Any]:
    s = draw(_step())
    nb = draw(st.integers(0, R))
    size = _i(draw(st.lists(st.integers(1, s["num_ranks"]), min_size=nb, max_size=nb)))
    return {
        "bin_size": size,
        "bin_start": _i([draw(st.integers(0, s["num_ranks"] - c)) for c in size.tolist()]),
        "bin_count": _ints(draw, nb, 0, 3),
        "bin_s": _floats(draw, nb),
        "bin_ss": _floats(draw, nb),
        "coef": s["coef"],
        "ranks_per_node": s["ranks_per_node"],
    }


@st.composite
def replica_finish(draw: st.DrawFn) -> dict[str, Any]:
    ranks = draw(st.integers(0, R))
    order, _, size = draw(_rounds(ranks)) if ranks else (_i([]), _i([]), _i([]))
    start = _i([draw(st.integers(0, ranks - c)) for c in size.tolist()])  # every block inside the ranks
    return {
        "order": order,
        "bin_start": start,
        "bin_size": size,
        "times": _floats(draw, size.shape[0]),
        "num_ranks": ranks,
    }


@st.composite
def place_blocks(draw: st.DrawFn) -> dict[str, Any]:
    ranks = draw(st.integers(1, R))
    widths = _i(sorted(draw(st.lists(st.integers(1, ranks), max_size=N)), reverse=True))  # largest first
    return {"widths": widths, "times": _floats(draw, widths.shape[0]), "num_ranks": ranks}


@st.composite
def lpt_ranks(draw: st.DrawFn) -> dict[str, Any]:
    s = draw(_step())
    return {
        "lengths": _i(sorted(draw(st.lists(LENGTH, max_size=N)), reverse=True)),  # longest first
        "load": _floats(draw, s["num_ranks"]),
        "capacity": s["capacity"],
        "pad_multiple": s["pad_multiple"],
        "coef": s["coef"],
        "depth": draw(st.integers(1, 4)),
    }


_PLANNER = (choose_sizes, shelf, widen, lpt, layout, layout_in_nodes, bin_times, replica_finish, place_blocks)
_PLANNER += (lpt_ranks,)
# Every entry point of test_kernel_fuzz.KERNELS: (module in seqpack.schedulers._kernels, domain).
DOMAINS = {
    "grid_lpt": ("grid", grid_lpt()),
    "grid_local": ("grid", grid_local()),
    "home_swaps": ("locality_swaps", home_swaps()),
    "repair_replicas": ("replica_repair", repair_replicas()),
    "greedy_matching": ("matching", greedy_matching()),
    "next_fit": ("consecutive", next_fit()),
    "exact.dfs": ("bin_search", _packing(positive=False)),
    "exact.complete_bins": ("bin_search", _packing(positive=True)),
    "replicas.replica_lpt": ("replica_repair", replica_lpt()),
    **{f"dynamic_cp.{f.__name__}": ("cp_planner", f()) for f in _PLANNER},
}


def _kernel(name: str) -> Any:
    module = importlib.import_module(f"seqpack.schedulers._kernels.{DOMAINS[name][0]}")
    return getattr(module, name.rpartition(".")[2])


def test_every_kernel_has_a_domain():
    assert sorted(DOMAINS) == sorted(CHECKS)
    for module in {m for m, _ in DOMAINS.values()}:
        public = {
            name
            for name, value in vars(importlib.import_module(f"seqpack.schedulers._kernels.{module}")).items()
            if callable(value) and getattr(value, "__module__", "").endswith(module) and not name.startswith("_")
        }
        fuzzed = {n.rpartition(".")[2] for n, (m, _) in DOMAINS.items() if m == module}
        helpers = {"padded", "ring_per_token", "pack_time", "first_cost_above", "walk_next"}  # tests of their own
        assert public - fuzzed <= helpers


_EXAMPLES = settings(max_examples=25 if small() else 80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@pytest.mark.slow
@_EXAMPLES
@pytest.mark.parametrize("name", sorted(DOMAINS))
@given(data=st.data())
def test_every_argument(name, data):
    kernel = _kernel(name)
    args = data.draw(DOMAINS[name][1], label="arguments")
    assert set(args) == set(inspect.signature(getattr(kernel, "py_func", kernel)).parameters)
    before = copy.deepcopy(args)
    out = kernel(**args)
    CHECKS[name](before, args, out)


@fuzz
@_EXAMPLES
@given(
    length=st.integers(0, 10**6),
    size=st.integers(1, 64),
    pad=st.integers(1, 64),
    s=st.floats(0.0, 1e6),
    ss=st.floats(0.0, 1e12),
    spans=st.booleans(),
    coef=COEF,
)
def test_cost_helpers(length, size, pad, s, ss, spans, coef):
    """The planner's scalar helpers (inlined by every planner kernel) against the reference's."""
    from seqpack.schedulers._kernels import cp_planner

    coef = _f(coef)
    ring = (size - 1) * (coef[5] if spans else coef[4]) / size if size > 1 else 0.0
    assert cp_planner.ring_per_token(size, spans, coef) == ring
    assert cp_planner.padded(length, size, pad) == padded(length, size, pad)
    assert cp_planner.pack_time(size, s, ss, spans, coef) == pack_time(size, s, ss, spans, coef)


@fuzz
@_EXAMPLES
@given(
    costs=st.lists(FLOAT, max_size=N),
    data=st.data(),
    value=st.floats(-10.0, 110.0),
    base=st.floats(-100.0, 100.0),
    gap=st.floats(0.0, 200.0),
)
def test_repair_walk(costs, data, value, base, gap):
    """The repair's candidate walk (first_cost_above, then walk_next to the end) over a
    cost-sorted subset ``items[:k]`` of a longer list, from any start."""
    from seqpack.schedulers._kernels.replica_repair import first_cost_above, walk_next

    subset = data.draw(st.lists(st.sampled_from(range(len(costs))), unique=True) if costs else st.just([]))
    items = _i(sorted(subset, key=lambda i: (costs[i], i)))
    k, c = data.draw(st.integers(0, items.shape[0])), _f(costs)
    assert first_cost_above(items, k, c, value) == first_cost_above_reference(items.tolist(), k, costs, value)
    start = data.draw(st.sampled_from([first_cost_above(items, k, c, value), *range(k + 1)]))
    walk, left, right = [], start - 1, start
    while True:
        item, gain, left, right = walk_next(items, k, c, base, gap, left, right)
        if item < 0:
            break
        walk.append((item, gain))
    assert walk == walk_reference(items.tolist(), k, costs, base, gap, start)
    assert len(walk) == k


def test_repair_swap_keeps_the_busier_replicas_bin_within_capacity():
    """Found by the fuzz: a swap within one round checked only the lighter replica's bin, so
    a longer, cheaper sequence (costs not growing with length) overfilled the busier one."""
    from seqpack.schedulers._kernels.replica_repair import repair_replicas

    replica_of, lengths, tok = _i([0, 0, 1]), _i([1, 1, 3]), np.array([[2, 3]])
    repair_replicas(_i([0, 0, 0]), replica_of, _f([1.0, 1.0, 0.0]), lengths, np.array([[2.0, 0.0]]), tok,
                    3, 10, 1e-9, 0.0, 4, 10**6, 16)  # fmt: skip
    assert tok.max() <= 3 and tok.tolist() == [np.bincount(replica_of, lengths, 2).tolist()]


def test_next_fit_closes_a_group_of_empty_items():
    """Found by the fuzz: a group holding only empty items took the next item even when it
    overflowed the group (it closed only once it held tokens)."""
    from seqpack.schedulers._kernels.consecutive import next_fit

    group_of, groups = next_fit(_i([0, 3]), 2)
    assert (group_of.tolist(), groups) == ([0, 1], 2)
