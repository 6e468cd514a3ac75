"""Step.to_origin on gloo: values computed on packed, rebalanced microbatches come back to the
rank that read each sample, in read order, exactly once, an empty value in the place of each
zero-length sample (dp=2 with most samples moving, with and without deferred samples; dp=2 x
cp=2; dp=2 x tp=2, where TP rank 1 gets its steps over the wire; with and without prefetch).
A mistake on one rank raises the same error, naming it, on every rank."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
from wrapper_data import ScatterScheduler, items, mesh_topology, sequence_lengths

from seqpack.errors import ConfigError
from seqpack.loader import wrap_data_iterator

SEED = 11
SPR, ITEMS = 6, 40  # items 7, 20 and 33 of every rank are zero-length samples (wrapper_data.EMPTY_EVERY)
LAYOUTS = {"dp2": (("dp", 2),), "dp2cp2": (("dp", 2), ("cp", 2)), "dp2tp2": (("dp", 2), ("tp", 2))}


def _origin_of(first_token: int) -> tuple[int, int, int]:
    """(rank, item, sub) encoded in a sequence's first token (see wrapper_data)."""
    return first_token // 10**7, (first_token % 10**7) // 10**4, (first_token % 10**4) // 10**3


def run_to_origin(layout, scheduler: str, prefetch: int, cp_layout: str = "dualchunk"):
    topo = mesh_topology(layout)
    cp = topo.cp_size
    sched = ScatterScheduler(defer_longest=True) if scheduler == "scatter_defer" else scheduler
    it = wrap_data_iterator(
        items(SEED, topo.dp_rank, ITEMS) if topo.tp_rank == 0 else None,
        topo,
        samples_per_rank=SPR,
        max_tokens_per_rank=96 // cp if cp > 1 else 48,
        scheduler=sched,
        pad_multiple=None if cp > 1 else 4,
        prefetch=prefetch,
        drop_last=False,
        cp_layout=cp_layout,
    )
    out = {"rank": dist.get_rank(), "dp_rank": topo.dp_rank, "steps": [], "moved": 0}
    for step in it:
        # Per-token values that say where each token came from, and a per-sequence value.
        values = [mb.input_ids.to(torch.float64) * 2 + 1 for mb in step.microbatches]
        per_seq = [mb.sample_ids.to(torch.float64)[:, None].repeat(1, 3) for mb in step.microbatches]
        back = step.to_origin(values)
        seq_back = step.to_origin(per_seq, per_sequence=True)
        ids = step.origin_ids
        ran_here = {int(g) for mb in step.microbatches for g in mb.sample_ids.tolist() if g >= 0}
        out["moved"] += len(set(ids[ids >= 0].tolist()) - ran_here)
        out["steps"].append(
            {
                "ids": ids.tolist(),
                "tokens": [((t - 1) / 2).to(torch.int64).tolist() for t in back],
                "per_seq": [s.tolist() for s in seq_back],
                "lengths": [int(step.schedule.lengths[g]) if g >= 0 else 0 for g in ids.tolist()],
                # dtype and trailing shape of every value, the empty ones included ([0, 3] per sequence)
                "kinds": sorted({(str(t.dtype), tuple(t.shape[1:])) for t in back}),
                "seq_kinds": sorted({(str(t.dtype), t.shape[-1]) for t in seq_back}),
                "empty_samples": step.stats.empty_samples,
            }
        )
    return out


def _read_order(step: dict, read: list[tuple[int, int, int] | None], carried: list) -> list:
    """What one step must return on a rank, in order (``None``: a zero-length sample): the
    sequences held back from the previous step, then those read this step, without those
    held back for the next one (the sequences of the pool that did not come back)."""
    came = {_origin_of(t[0]) for t in step["tokens"] if t}
    return [who for who in carried + read if who is None or who in came]


def _reads(rank: int, k: int) -> list[tuple[int, int, int] | None]:
    """The sequences DP rank ``rank`` reads in step ``k``, in order (``None``: zero-length)."""
    out = []
    for index in range(SPR * k, min(SPR * (k + 1), ITEMS)):
        for sub, n in enumerate(sequence_lengths(SEED, rank, index)):
            out.append((rank, index, sub) if n else None)
    return out


@pytest.mark.parametrize(
    "name, scheduler, prefetch, cp_layout",
    [
        ("dp2", "test_scatter", 0, "dualchunk"),
        ("dp2", "scatter_defer", 1, "dualchunk"),
        ("dp2cp2", "balanced", 0, "dualchunk"),
        ("dp2cp2", "balanced", 2, "dualchunk"),
        ("dp2cp2", "balanced", 0, "contiguous"),
        ("dp2tp2", "scatter_defer", 0, "dualchunk"),
    ],
)
def test_values_come_back_to_their_origin_in_read_order_exactly_once(dist_pools, name, scheduler, prefetch, cp_layout):
    from wrapper_data import expected_sequences

    layout = LAYOUTS[name]
    if scheduler == "test_scatter":
        scheduler = ScatterScheduler()
    results = dist_pools.get(int(np.prod([s for _, s in layout]))).run(
        run_to_origin, layout, scheduler, prefetch, cp_layout, timeout=600
    )
    late = []  # per rank: some sequence came back after one read later (held back a step)
    for result in results:
        rank = result["dp_rank"]
        seen, carried, empties = [], [], 0
        for k, step in enumerate(result["steps"]):
            here, order = [], []
            assert len(step["tokens"]) == len(step["ids"]) == len(step["per_seq"])
            for gid, tokens, per_seq, length in zip(step["ids"], step["tokens"], step["per_seq"], step["lengths"],
                                                    strict=True):  # fmt: skip
                assert len(tokens) == length  # pads removed, CP shards joined
                if gid < 0:  # a zero-length sample: an empty value in its place
                    assert tokens == [] and per_seq == []
                    order.append(None)
                    continue
                origin = _origin_of(tokens[0])
                assert origin[0] == rank  # back on the rank that read it
                assert tokens == list(range(tokens[0], tokens[0] + length))  # in token order, complete
                assert per_seq == [float(gid)] * 3
                here.append(origin)
                order.append(origin)
            assert here == sorted(here)  # read order (held-back samples of the last step first, read before)
            # One value per sequence read, in read order, the zero-length ones included.
            read = _reads(rank, k)
            assert order == _read_order(step, read, carried)
            carried = [who for who in carried + read if who is not None and who not in here]
            assert set(step["kinds"]) <= {("torch.float64", ())} and set(step["seq_kinds"]) <= {("torch.float64", 3)}
            empties += order.count(None)
            seen += here
        assert empties == 3  # not vacuous: every zero-length sample (items 7, 20, 33) came back empty
        expected = sorted(expected_sequences(SEED, rank, 40))
        assert len(set(seen)) == len(seen) and sorted(seen) == expected[: len(seen)]  # exactly once
        late.append(seen != sorted(seen))
        if scheduler != "scatter_defer":
            assert seen == sorted(seen)  # nothing held back: the whole run comes back in read order
    if scheduler == "scatter_defer":
        assert any(late)  # not vacuous: a held-back sequence came back a step after a later one
        assert len(seen) >= len(expected) - 12  # not vacuous: nearly all the data came back
    assert sum(r["moved"] for r in results) > 0  # not vacuous: sequences really came from other replicas


def run_one_rank_wrong(layout) -> dict:
    """Calls of to_origin where the last global rank alone passes something wrong, then one
    right call on every rank (the ranks must still be in step)."""
    topo = mesh_topology(layout)
    cp = topo.cp_size
    it = wrap_data_iterator(
        items(SEED, topo.dp_rank, ITEMS), topo, samples_per_rank=SPR, max_tokens_per_rank=96 // cp if cp > 1 else 48,
        scheduler=ScatterScheduler(), pad_multiple=None if cp > 1 else 4, prefetch=0,
    )  # fmt: skip
    wrong = dist.get_rank() == dist.get_world_size() - 1
    out: dict = {"dp_rank": topo.dp_rank}
    with it:
        step = next(it)
        values = [mb.input_ids.to(torch.float64) for mb in step.microbatches]
        rows = [mb.sample_ids.to(torch.float64)[:, None] for mb in step.microbatches]
        cases = {
            "count": (values[:-1] if wrong else values, False),
            "dtype": ([v.float() for v in values] if wrong else values, False),
            "trailing": ([v[:, None].repeat(1, 2) for v in values] if wrong else values, False),
            "per_sequence": (rows, True) if wrong else (values, False),
        }
        for name, (given, per_sequence) in cases.items():
            try:
                step.to_origin(given, per_sequence=per_sequence)
                out[name] = None
            except Exception as exc:  # the test compares what every rank raised
                out[name] = (type(exc).__name__, str(exc), isinstance(exc, ConfigError))
        out["after"] = [t.tolist() for t in step.to_origin(values)]
        out["moved"] = any(int(g) >= 0 and int(step.schedule.placement()[0][g]) != topo.dp_rank
                           for g in step.origin_ids.tolist())  # fmt: skip
    return out


@pytest.mark.parametrize("name", ["dp2", "dp2cp2"])
def test_a_mistake_on_one_rank_is_the_same_named_error_on_every_rank(dist_pools, name):
    layout = LAYOUTS[name]
    results = dist_pools.get(int(np.prod([s for _, s in layout]))).run(run_one_rank_wrong, layout)
    last = len(results) - 1
    expected = {
        "count": rf"to_origin of step 0 on DP rank 1, CP rank {1 if name == 'dp2cp2' else 0} \(global rank {last}\): "
        r"values holds \d+ tensors but this step has \d+ microbatches",
        "dtype": r"disagree on to_origin calls: dtype: torch.float64 on dp rank 0, torch.float32 on dp rank 1",
        "trailing": r"disagree on to_origin calls: trailing shape: \(\) on dp rank 0, \(2,\) on dp rank 1",
        "per_sequence": r"disagree on to_origin calls: per_sequence: False on dp rank 0, True on dp rank 1",
    }
    for case, pattern in expected.items():
        raised = {r[case] for r in results}
        assert len(raised) == 1, raised  # every rank: the same error, the same message
        kind, message, named = raised.pop()
        assert kind == "ConfigError" and named, message
        assert re.search(pattern, message), message
    for r in results:  # the ranks are still in step: the right call brings every rank its own samples
        assert r["after"] and all(_origin_of(int(t[0]))[0] == r["dp_rank"] for t in r["after"] if t)
    assert any(r["moved"] for r in results)  # not vacuous: values cross ranks (the return's all-to-all runs)


def run_nothing_of_its_own(layout, kind: str) -> dict:
    """DP rank 1 reads zero-length samples only (``kind="empty"``) or nothing at all
    (``"none"``); DP rank 0 reads four samples."""
    topo = mesh_topology(layout)
    mine = [{"input_ids": torch.arange(5 + 3 * i) + 100 * i} for i in range(4)]
    if topo.dp_rank == 1:
        mine = [{"input_ids": torch.zeros(0, dtype=torch.int64)}] * 4 if kind == "empty" else []
    it = wrap_data_iterator(
        iter(mine), topo, samples_per_rank=4, max_tokens_per_rank=48, scheduler=ScatterScheduler(), prefetch=0,
        drop_last=False,
    )  # fmt: skip
    with it:
        return {
            "dp_rank": topo.dp_rank,
            "back": [[t.tolist() for t in step.to_origin([mb.input_ids for mb in step.microbatches])] for step in it],
        }


@pytest.mark.parametrize("name", ["dp2", "dp2cp2"])
@pytest.mark.parametrize("kind", ["empty", "none"])
def test_a_dp_rank_with_nothing_of_its_own_that_ran(dist_pools, name, kind):
    layout = LAYOUTS[name]
    results = dist_pools.get(int(np.prod([s for _, s in layout]))).run(run_nothing_of_its_own, layout, kind)
    for r in results:
        if r["dp_rank"] == 0:
            assert r["back"] == [[list(range(100 * i, 100 * i + 5 + 3 * i)) for i in range(4)]]
        else:
            assert r["back"] == [[[]] * 4 if kind == "empty" else []]
