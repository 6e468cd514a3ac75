"""``minibatches=k`` under dynamic CP on gloo (dp=2 x cp=2, a sequence of 3.5x a rank's
capacity among short ones, with prefetch): the bounds agree on every rank; mini-batch ``j``
runs exactly the ``j``-th contiguous slice each DP rank read; its loss-token count equals the
sum of its groups' counts; every token comes back to the reading ranks exactly once
(``Step.to_origin``)."""

from __future__ import annotations

import torch.distributed as dist
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

STEPS, K = 2, 2


def run_minibatches() -> dict:
    topo = mesh_topology(LAYOUTS["dp2cp2"])
    it = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, steps=STEPS)), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY,
        scheduler="dynamic_cp", group_cost=GROUP_COST, minibatches=K, prefetch=1,
    )  # fmt: skip
    out: dict = {"dp_rank": topo.dp_rank, "steps": [], "tokens": []}
    with it:
        for step in it:
            parts = step.minibatches
            out["steps"].append({
                "bounds": list(step.minibatch_bounds),
                "counts": list(step.minibatch_loss_tokens),
                "ids": [sorted({int(g) for mb in part for g in mb.sample_ids.tolist() if g >= 0}) for part in parts],
                # Each group's count appears on its cp_size ranks: summed over ranks, each once.
                "shares": [sum(mb.num_loss_tokens / mb.cp_size for mb in part if mb.num_loss_tokens) for part in parts],
                "wide": [sum(mb.cp_size > 1 for mb in part) for part in parts],
            })  # fmt: skip
            out["tokens"] += [t.tolist() for t in step.to_origin([mb.input_ids for mb in step.microbatches])]
    out["rank"] = dist.get_rank()
    return out


def test_minibatches_under_dynamic_cp(dist_pools):
    results = dist_pools.get(4).run(run_minibatches)
    for r in results:
        assert r["tokens"] == [s["input_ids"].tolist() for s in samples_of(r["dp_rank"], steps=STEPS)]
    half = SPR // K
    for s in range(STEPS):
        first = results[0]["steps"][s]
        assert all(r["steps"][s]["bounds"] == first["bounds"] for r in results) and len(first["bounds"]) == K + 1
        for j in range(K):
            ran = set().union(*(r["steps"][s]["ids"][j] for r in results))
            # Global ids: DP rank d's samples of the step are d*SPR .. d*SPR+SPR-1, read order.
            assert ran == {d * SPR + j * half + i for d in range(2) for i in range(half)}
            assert all(r["steps"][s]["counts"] == first["counts"] for r in results)
            assert sum(r["steps"][s]["shares"][j] for r in results) == first["counts"][j]
        assert sum(r["steps"][s]["wide"][0] for r in results) > 0  # the long sequence's group, in mini-batch 0
