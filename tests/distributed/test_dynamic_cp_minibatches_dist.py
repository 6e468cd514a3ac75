"""``minibatches=k`` and ``group_id`` under dynamic CP on gloo (dp=2 x cp=2, a sequence of
3.5x a rank's capacity among short ones, with prefetch): the bounds agree on every rank;
mini-batch ``j`` runs exactly the ``j``-th contiguous slice each DP rank read; its loss-token
count equals the sum of its groups' counts; every sequence of a group runs on one replica's
own CP ranks; every token comes back to the reading ranks exactly once (``Step.to_origin``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

STEPS, K = 2, 2


def _grouped(dp_rank: int) -> list[dict]:
    """The samples with pairs in groups (the first of every step, the long one, alone)."""
    out = []
    for i, s in enumerate(samples_of(dp_rank, steps=STEPS)):
        out.append(s if i % SPR == 0 else {**s, "group_id": torch.tensor(100 * dp_rank + i // 2)})
    return out


def run_minibatches(groups: bool) -> dict:
    topo = mesh_topology(LAYOUTS["dp2cp2"])
    data = _grouped(topo.dp_rank) if groups else samples_of(topo.dp_rank, steps=STEPS)
    it = wrap_data_iterator(
        iter(data), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY,
        dynamic_cp=True, cost=GROUP_COST, minibatches=K, prefetch=1,
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
                # (global id, replica block) of every sequence this rank ran a shard of.
                "blocks": [(int(g), topo.dp_rank if mb.cp_size == 2 else -1) for mb in step.microbatches
                           for g in mb.sample_ids.tolist() if g >= 0],
            })  # fmt: skip
            out["tokens"] += [t.tolist() for t in step.to_origin([mb.input_ids for mb in step.microbatches])]
    out["rank"] = dist.get_rank()
    return out


@pytest.mark.parametrize("groups", [False, True])
def test_minibatches_under_dynamic_cp(dist_pools, groups):
    results = dist_pools.get(4).run(run_minibatches, groups)
    for r in results:
        assert r["tokens"] == [s["input_ids"].tolist() for s in samples_of(r["dp_rank"], steps=STEPS)]
    half = SPR // K
    for s in range(STEPS):
        first = results[0]["steps"][s]
        assert all(r["steps"][s]["bounds"] == first["bounds"] for r in results) and len(first["bounds"]) == K + 1
        for j in range(K):
            ran = set().union(*(r["steps"][s]["ids"][j] for r in results))
            # Global ids: DP rank d's samples of the step are d*SPR .. d*SPR+SPR-1, read order.
            # With groups the pair (2, 3) goes with its first sequence, to mini-batch 0.
            local = ([0, 1, 2, 3], [4, 5])[j] if groups else range(j * half, j * half + half)
            assert ran == {d * SPR + i for d in range(2) for i in local}
            assert all(r["steps"][s]["counts"] == first["counts"] for r in results)
            assert sum(r["steps"][s]["shares"][j] for r in results) == first["counts"][j]
        assert sum(r["steps"][s]["wide"][0] for r in results) > 0  # the long sequence's group, in mini-batch 0
        if groups:  # a pair (ids 2t-1, 2t of a rank's step) runs on one replica's 2 CP ranks
            where: dict = {}
            for r in results:
                for g, block in r["steps"][s]["blocks"]:
                    if g % SPR:
                        where.setdefault((g // SPR, (g % SPR) // 2), set()).add(block)
            assert where and all(len(b) == 1 and -1 not in b for b in where.values())
