"""verl's ``test_seqlen_balancing_distributed_params`` ported to gloo: 2 ranks with batches of
different sizes (20 and 25 rows), ``max_token_len=300``; ``min_num_micro_batch=4`` without the
DP agreement, then the agreement alone (every rank takes the largest count)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from seqpack.interop.verl import effective_lengths, fewest_microbatches, rearrange_micro_batches


def run_rearrange(same_micro_num_in_dp: bool, min_mb: int | None):
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(42 + rank)
    rows, width = 20 + rank * 5, 100
    input_ids = torch.randint(0, 10, (rows, width), generator=g)
    valid = torch.randint(50, 91, (rows,), generator=g)
    left = torch.randint(0, 11, (rows,), generator=g)
    pos = torch.arange(width)[None, :]
    mask = ((pos >= left[:, None]) & (pos < (left + valid)[:, None])).to(torch.int64)
    batch = {"input_ids": input_ids, "attention_mask": mask}
    micros, indices = rearrange_micro_batches(
        batch, 300, dp_group=dist.group.WORLD, same_micro_num_in_dp=same_micro_num_in_dp, min_num_micro_batch=min_mb
    )
    lengths = effective_lengths(batch)
    local, _ = fewest_microbatches(lengths, 300)  # the fewest that fit, verl's count when it does
    verl_local = min(rows, -(-int(lengths.sum()) // 300))
    order = list(itertools.chain.from_iterable(indices))
    flat = torch.cat([m["input_ids"] for m in micros])
    inverse = torch.empty(len(order), dtype=torch.int64)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return {
        "count": len(micros),
        "local": local,
        "verl_local": verl_local,
        "restored": bool(torch.equal(flat[inverse], input_ids)),
        "max_tokens": max(int(m["attention_mask"].sum()) for m in micros),
    }


@pytest.mark.parametrize("same, min_mb", [(False, 4), (True, None)])
def test_rearrange_micro_batches_on_two_ranks(dist_pools, same, min_mb):
    results = dist_pools.get(2).run(run_rearrange, same, min_mb)
    for r in results:
        assert r["restored"] and r["max_tokens"] <= 300
        assert r["local"] >= r["verl_local"]  # never fewer than verl: the cap may need more
        if min_mb is not None:
            assert r["count"] == max(r["local"], min_mb)
    if same:
        assert [r["count"] for r in results] == [max(r["local"] for r in results)] * 2
    else:
        assert all(r["count"] == r["local"] for r in results)
    assert results[0]["local"] != results[1]["local"] or not same  # the agreement was needed
