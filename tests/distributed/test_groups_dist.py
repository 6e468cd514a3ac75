"""group_id through the wrapper on gloo (dp=2, and dp=2 x cp=2): the responses of one prompt,
read on both ranks, run on one replica (and with ``group_microbatch`` in one microbatch),
every sequence exactly once, values back to origin; ungrouped samples mixed in."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

LAYOUTS = {"dp2": (("dp", 2),), "dp2cp2": (("dp", 2), ("cp", 2))}


def _items(dp_rank: int, count: int):
    """Prompt ``p`` has 4 responses dealt to both ranks; every 5th sample has no group. The
    first token encodes (group or -1, rank, index)."""
    rng = np.random.default_rng(100 + dp_rank)
    for i in range(count):
        group = (i // 2) * 2 + 100 * (i % 5 == 4)  # ranks 0 and 1 both read responses of group 2k
        length = int(rng.integers(3, 45))
        ids = torch.arange(length, dtype=torch.int64) + 1
        ids[0] = 10**6 * (group + 1 if i % 5 != 4 else 0) + 1000 * dp_rank + i
        item = {"input_ids": ids}
        if i % 5 != 4:
            item["group_id"] = group
        yield item


def run_groups(layout, together: bool):
    topo = mesh_topology(layout)
    cp = topo.cp_size
    it = wrap_data_iterator(
        _items(topo.dp_rank, 24),
        topo,
        samples_per_rank=8,
        max_tokens_per_rank=128 // cp,
        pad_multiple=2 * cp if cp > 1 else 1,
        group_microbatch=together,
        prefetch=1,
    )
    steps = []
    for step in it:
        replica, micro, _ = step.schedule.placement()
        ran = [mb.sample_ids.tolist() for mb in step.microbatches]
        firsts = {}
        for mb in step.microbatches:
            tokens = mb.input_ids.tolist() if cp == 1 else None
            if tokens is not None:
                for g, start in zip(mb.sample_ids.tolist(), mb.cu_seqlens_padded[:-1].tolist(), strict=True):
                    if g >= 0:
                        firsts[g] = tokens[start]
        back = step.to_origin([mb.input_ids.to(torch.float64) for mb in step.microbatches])
        steps.append(
            {
                "replica": replica.tolist(),
                "micro": micro.tolist(),
                "padded": [
                    -(-int(n) // step.schedule.pad_multiple) * step.schedule.pad_multiple for n in step.schedule.lengths
                ],
                "ran": ran,
                "firsts": firsts,
                "origin_ids": step.origin_ids.tolist(),
                "back_first": [int(b[0]) for b in back],
            }
        )
    return {"rank": dist.get_rank(), "dp_rank": topo.dp_rank, "steps": steps}


@pytest.mark.parametrize("name, together", [("dp2", False), ("dp2", True), ("dp2cp2", False)])
def test_groups_run_on_one_replica_through_the_wrapper(dist_pools, name, together):
    layout = LAYOUTS[name]
    results = dist_pools.get(int(np.prod([s for _, s in layout]))).run(run_groups, layout, together)
    by_dp = {r["dp_rank"]: r for r in results}
    assert len(by_dp[0]["steps"]) == 3
    split_candidates = whole = 0
    for s in range(3):
        steps = [by_dp[d]["steps"][s] for d in (0, 1)]
        replica, micro = np.array(steps[0]["replica"]), np.array(steps[0]["micro"])
        # the first token of every sequence, from what it sent back to its origin
        first = {}
        for d in (0, 1):
            for g, token in zip(steps[d]["origin_ids"], steps[d]["back_first"], strict=True):
                first[g] = token
        assert sorted(first) == list(range(len(replica)))  # every sequence back exactly once
        group = {g: t // 10**6 - 1 for g, t in first.items()}  # -1: no group
        for gid in set(group.values()) - {-1}:
            members = [g for g, v in group.items() if v == gid]
            origins = {first[g] // 1000 % 1000 for g in members}
            split_candidates += len(origins) > 1
            assert len({int(replica[g]) for g in members}) == 1, (s, gid, members, replica)
            if together and sum(steps[0]["padded"][g] for g in members) <= 128:
                assert len({int(micro[g]) for g in members}) == 1, (s, gid, members, micro)
                whole += 1
        ran = sorted(g for d in (0, 1) for mb in steps[d]["ran"] for g in mb if g >= 0)
        assert ran == list(range(len(replica)))
        if name == "dp2":  # the packed tokens are the ones sent back
            for d in (0, 1):
                for g, token in steps[d]["firsts"].items():
                    assert first[g] == token
    assert whole > 0 or not together
    assert split_candidates > 0  # groups were read on both ranks: keeping them together moved samples


def run_equal_counts():
    topo = mesh_topology(LAYOUTS["dp2"])
    rng = np.random.default_rng(7 + topo.dp_rank)
    # rank 0 reads long samples, rank 1 short ones: balance alone would give rank 1 more
    lengths = rng.integers(60, 120, 16) if topo.dp_rank == 0 else rng.integers(3, 20, 16)
    data = [{"input_ids": torch.arange(int(n), dtype=torch.int64)} for n in lengths]
    counts = []
    for equal in (False, True):
        it = wrap_data_iterator(iter(data), topo, samples_per_rank=8, max_tokens_per_rank=256,
                                equal_samples_per_replica=equal, prefetch=0)  # fmt: skip
        counts.append([np.bincount(step.schedule.placement()[0], minlength=2).tolist() for step in it])
    return counts


def test_equal_samples_per_replica_through_the_wrapper(dist_pools):
    free, equal = dist_pools.get(2).run(run_equal_counts)[0]
    assert equal == [[8, 8], [8, 8]]
    assert any(c != [8, 8] for c in free)  # not vacuous: balance alone splits them unequally
