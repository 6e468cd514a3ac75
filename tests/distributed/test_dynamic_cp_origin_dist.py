"""Step.to_origin under dynamic CP on gloo (dp=4 and dp=2 x cp=2, a sequence of 3.5x a rank's
capacity among short ones, with prefetch): every value computed on a group's shards comes back
to the ranks of the replica that read its sample, in read order, pads removed, exactly once."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator

STEPS = 3


def run_to_origin(name: str, prefetch: int) -> dict:
    topo = mesh_topology(LAYOUTS[name])
    it = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, steps=STEPS)), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY,
        dynamic_cp=True, group_cost=GROUP_COST, prefetch=prefetch,
    )  # fmt: skip
    out: dict = {"rank": dist.get_rank(), "dp_rank": topo.dp_rank, "tokens": [], "pairs": [], "rows": [],
                 "wide": 0, "moved": 0}  # fmt: skip
    with it:
        for step in it:
            # Per token: the token id and its position's parity, two columns; per sequence: its id.
            values = [torch.stack([mb.input_ids.to(torch.float64) * 2 + 1, mb.input_ids.to(torch.float64)], 1)
                      for mb in step.microbatches]  # fmt: skip
            flat = [mb.input_ids.to(torch.int64) + 5 for mb in step.microbatches]
            per_seq = [mb.sample_ids.to(torch.float64)[:, None] for mb in step.microbatches]
            back, back_flat = step.to_origin(values), step.to_origin(flat)
            seq_back = step.to_origin(per_seq, per_sequence=True)
            ids = step.origin_ids.tolist()
            assert len(back) == len(back_flat) == len(seq_back) == len(ids)
            out["tokens"] += [((t[:, 0] - 1) / 2).to(torch.int64).tolist() for t in back]
            out["pairs"] += [bool(torch.equal(t[:, 1], (t[:, 0] - 1) / 2)) for t in back]
            out["tokens_flat"] = out.get("tokens_flat", []) + [(t - 5).tolist() for t in back_flat]
            out["rows"] += [(gid, s.tolist()) for gid, s in zip(ids, seq_back, strict=True)]
            out["wide"] += sum(mb.cp_size > 1 for mb in step.microbatches)
            ran = {int(g) for mb in step.microbatches for g in mb.sample_ids.tolist() if g >= 0}
            out["moved"] += len(set(ids) - ran)
    return out


@pytest.mark.parametrize(("name", "prefetch"), [("dp4", 1), ("dp2cp2", 1), ("dp2cp2", 0)])
def test_values_come_back_to_the_reading_rank_in_order_exactly_once(dist_pools, name, prefetch):
    results = dist_pools.get(4).run(run_to_origin, name, prefetch)
    for r in results:
        read = [s["input_ids"].tolist() for s in samples_of(r["dp_rank"], steps=STEPS)]
        assert r["tokens"] == read  # every sample this replica read, in read order, pads removed, once
        assert r["tokens_flat"] == read
        assert all(r["pairs"])
        assert all(row == [float(gid)] for gid, row in r["rows"])
    assert sum(r["wide"] for r in results) > 0  # some groups spread over several ranks
    assert sum(r["moved"] for r in results) > 0  # and values crossed ranks to come back
