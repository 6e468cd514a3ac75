"""verl's ``test_seqlen_balancing_distributed_params`` ported to gloo: 2 ranks with batches of
different sizes (20 and 25 rows), ``max_token_len=300``; ``min_num_micro_batch=4`` without the
DP agreement, then the agreement alone (every rank takes the largest count)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from seqpack.errors import ConfigError
from seqpack.interop.verl import fewest_microbatches, rearrange_micro_batches
from seqpack.interop.verl_batch import row_lengths

try:
    import verl  # noqa: F401  (verl's own venv only: it pins transformers < 5.11)
except ImportError:
    HAVE_VERL = False
else:
    HAVE_VERL = True

IMPLS = ["seqpack", pytest.param("verl", marks=pytest.mark.skipif(not HAVE_VERL, reason="verl not installed"))]


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
    _, lengths = row_lengths(batch)
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


def implementation(impl: str):
    """seqpack's drop-in, or verl's own function (verl's venv only) with its TensorDict input."""
    if impl == "seqpack":
        return rearrange_micro_batches, dict
    from tensordict import TensorDict
    from verl.utils import seqlen_balancing

    # verl puts its agreement's tensors on get_device_name(), "cuda" even without a GPU.
    seqlen_balancing.get_device_name = lambda: "cpu"
    return seqlen_balancing.rearrange_micro_batches, lambda **values: TensorDict(
        values, batch_size=[len(values["input_ids"])]
    )


def masked(lengths: list[int], width: int) -> dict[str, torch.Tensor]:
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)
    return {"input_ids": torch.zeros_like(mask), "attention_mask": mask}


def run_without_dp_group(impl: str, rows: int):
    rearrange, make = implementation(impl)
    lengths = [90] * (rows + dist.get_rank() * 10)  # rank 1 needs more micro-batches than rank 0
    micros, _ = rearrange(make(**masked(lengths, 100)), 300)
    return len(micros)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_dp_group_the_ranks_do_not_agree(dist_pools, impl):
    # verl 0.9.1 agrees on a count only over a dp_group it is given (dp_group=None: no
    # collective at all); seqpack all-reduced over WORLD, so both ranks got rank 1's count.
    counts = dist_pools.get(2).run(run_without_dp_group, impl, 6)
    assert counts == [6 // 3, 16 // 3 + 1]


def run_one_rank_fails(same: bool):
    lengths = [50, 60, 70] + ([400] if dist.get_rank() == 1 else [40])  # rank 1: a row over the cap
    try:
        rearrange_micro_batches(masked(lengths, 400), 300, dp_group=dist.group.WORLD, same_micro_num_in_dp=same)
    except ConfigError as error:
        return str(error)
    return None


def test_a_rank_that_fails_fails_every_rank_of_the_dp_group(dist_pools):
    # Rank 1 refused its batch before the count's all-reduce and left rank 0 waiting in it
    # forever; verl 0.9.1 agrees on such constraints before any rank raises.
    errors = dist_pools.get(2).run(run_one_rank_fails, True, timeout=30)
    assert "row 3 holds 400 tokens > max_token_len=300" in errors[1]
    assert errors[0] is not None and "dp rank 1" in errors[0]


def run_groups_agreed(impl: str):
    rearrange, make = implementation(impl)
    lengths = [40, 50] * (4 + 2 * dist.get_rank())  # 4 pairs on rank 0, 6 on rank 1, 90 tokens each
    micros, indices = rearrange(make(**masked(lengths, 64)), 180, dp_group=dist.group.WORLD, force_group_size=2)
    return [len(micros), indices]


@pytest.mark.parametrize("impl", IMPLS)
def test_force_group_size_with_the_count_agreed(dist_pools, impl):
    results = dist_pools.get(2).run(run_groups_agreed, impl)
    assert [r[0] for r in results] == [3, 3]  # rank 1's 6 pairs need 3 micro-batches of 2 pairs
    for _, indices in results:
        assert all(
            len(rows) % 2 == 0 and all(rows[i] + 1 == rows[i + 1] for i in range(0, len(rows), 2)) for rows in indices
        )
