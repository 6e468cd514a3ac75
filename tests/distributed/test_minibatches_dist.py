"""``PackingConfig(minibatches=k)`` through the wrapper on gloo (dp=2, with and without
prefetch, and dp=2 x tp=2 where TP rank 1 gets its steps over the wire): every sample once;
mini-batch ``j`` holds exactly the samples each DP rank read in its ``j``-th contiguous slice;
the bounds agree on every rank; each mini-batch's loss-token count equals a recount of its
labels; a resumed run yields the same steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

LAYOUTS = {"dp2": (("dp", 2),), "dp2tp2": (("dp", 2), ("tp", 2))}
K, PER_RANK, STEPS = 3, 9, 3


def _items(dp_rank: int, count: int):
    """Sample ``i`` of DP rank ``r``: first token ``1000 * r + i + 1``; lengths 3..60."""
    rng = np.random.default_rng(7 + dp_rank)
    for i in range(count):
        ids = torch.arange(int(rng.integers(3, 61)), dtype=torch.int64) + 5
        ids[0] = 1000 * dp_rank + i + 1
        yield {"input_ids": ids}


def _wrap(topo, prefetch: int):
    return wrap_data_iterator(
        _items(topo.dp_rank, PER_RANK * STEPS) if topo.tp_rank == 0 else None,
        topo,
        samples_per_rank=PER_RANK,
        max_tokens_per_rank=96,
        minibatches=K,
        prefetch=prefetch,
    )


def _summary(step) -> dict:
    firsts = []  # first token of every sequence of each microbatch (padding-only fillers have none)
    for mb in step.microbatches:
        starts = mb.cu_seqlens_padded[:-1].tolist()
        firsts.append([int(mb.input_ids[a]) for a, g in zip(starts, mb.sample_ids.tolist(), strict=True) if g >= 0])
    return {
        "bounds": list(step.minibatch_bounds),
        "counts": list(step.minibatch_loss_tokens),
        "firsts": firsts,
        "supervised": [int((mb.labels != -100).sum()) for mb in step.microbatches],
        "origin": step.origin_ids.tolist(),
        "ids": [mb.sample_ids.tolist() for mb in step.microbatches],
        "split": [len(part) for part in step.minibatches],
    }


def run_minibatches(layout, prefetch: int):
    topo = mesh_topology(layout)
    it = _wrap(topo, prefetch)
    steps = [_summary(step) for step in it]
    # Resume: save after the first step, continue in a fresh iterator.
    it = _wrap(topo, prefetch)
    next(it)
    state = it.state_dict()
    it.close()
    resumed = _wrap(topo, prefetch)
    resumed.load_state_dict(state)
    again = [_summary(step) for step in resumed]
    return {"rank": dist.get_rank(), "dp": topo.dp_rank, "tp": topo.tp_rank, "steps": steps, "resumed": again}


@pytest.mark.parametrize("name, prefetch", [("dp2", 0), ("dp2", 2), ("dp2tp2", 1)])
def test_minibatches_through_the_wrapper(dist_pools, name, prefetch):
    layout = LAYOUTS[name]
    results = dist_pools.get(int(np.prod([s for _, s in layout]))).run(run_minibatches, layout, prefetch)
    readers = {r["dp"]: r for r in results if r["tp"] == 0}
    seen: list[int] = []
    for s in range(STEPS):
        bounds = results[0]["steps"][s]["bounds"]
        counts = results[0]["steps"][s]["counts"]
        assert len(bounds) == K + 1 and bounds[0] == 0 and all(b > a for a, b in zip(bounds, bounds[1:], strict=False))
        for r in results:  # every rank, TP receivers included, sees the same steps
            assert r["steps"][s]["bounds"] == bounds and r["steps"][s]["counts"] == counts
            assert r["steps"][s]["split"] == [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
            mirror = readers[r["dp"]]["steps"][s]
            assert (r["steps"][s]["firsts"], r["steps"][s]["ids"]) == (mirror["firsts"], mirror["ids"])
        for j in range(K):
            ran = {f for d in (0, 1) for mb in readers[d]["steps"][s]["firsts"][bounds[j] : bounds[j + 1]] for f in mb}
            # What each DP rank read in its j-th slice, by the first token that names it.
            # (nothing is deferred here, so step s reads samples s * PER_RANK ... of each rank).
            read = set()
            for d in (0, 1):
                assert len(readers[d]["steps"][s]["origin"]) == PER_RANK
                chunk = np.array_split(np.arange(PER_RANK), K)[j] + s * PER_RANK
                read |= {1000 * d + int(i) + 1 for i in chunk}
            assert ran == read, (s, j)
            recount = sum(sum(readers[d]["steps"][s]["supervised"][bounds[j] : bounds[j + 1]]) for d in (0, 1))
            assert counts[j] == recount, (s, j)
        seen += [f for d in (0, 1) for mb in readers[d]["steps"][s]["firsts"] for f in mb]
    assert sorted(seen) == sorted(1000 * d + i + 1 for d in (0, 1) for i in range(PER_RANK * STEPS))
    for r in results:
        assert r["resumed"] == r["steps"][1:]
