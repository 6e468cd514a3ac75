"""A step that fails on one rank fails on every rank, the same way (gloo, 4 ranks); here:
grouped sequences under dynamic CP with mini-batches, where a replica's block runs an empty
microbatch (issue 39)."""

from __future__ import annotations

import torch
from dynamic_cp_data import SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

LAYOUTS = {"dynamic": (("dp", 2), ("cp", 2))}


# -- grouped sequences under dynamic CP with mini-batches ------------------------------------


def run_grouped_minibatches() -> list[list[tuple[int, list[int], int]]]:
    """DP rank 0's first two samples of every step are a group; every step's microbatches:
    (cp size, cu_seqlens_padded, sequences)."""
    topo = mesh_topology(LAYOUTS["dynamic"])
    data = samples_of(topo.dp_rank, steps=2, long=30)
    if topo.dp_rank == 0:
        for i in range(len(data)):
            if i % SPR < 2:
                data[i] = {**data[i], "group_id": torch.tensor(i // SPR)}
    it = wrap_data_iterator(iter(data), topo, samples_per_rank=SPR, max_tokens_per_rank=48, dynamic_cp=True,
                            minibatches=2)  # fmt: skip
    with it:
        return [
            [(mb.cp_size, mb.cu_seqlens_padded.tolist(), int((mb.sample_ids >= 0).sum())) for mb in step.microbatches]
            for step in it
        ]


def test_grouped_minibatches_under_dynamic_cp(dist_pools):
    """The group runs on one replica's 2-rank block while the other replica's block runs a
    padding-only microbatch: padded for its 2 ranks (it had dynamic CP's one-rank multiple,
    and packing failed on that replica's ranks only)."""
    results = dist_pools.get(4).run(run_grouped_minibatches, timeout=60)
    assert all(len(steps) == 2 for steps in results)
    fillers = 0
    for steps in results:
        for batches in steps:
            for cp_size, cu, count in batches:
                assert cp_size == 1 or all(v % (2 * cp_size) == 0 for v in cu), (cp_size, cu)
                fillers += cp_size == 2 and count == 0
    assert fillers  # not vacuous: a 2-rank block ran an empty microbatch
