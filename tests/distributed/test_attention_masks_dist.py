"""Masked CP attention on gloo: causal, bidirectional and sliding-window attention under both
CP layouts (cp 2 and 4), every rank's outputs and q/k/v gradients against the brute-force
masked reference of the whole pack, in float64. The K/V exchange moves only the keys in reach;
its backward must bring every key's gradient back to the rank that owns it."""

import sys
import types

import pytest
import torch
import torch.distributed as dist
from benchmark_module import load
from compute.masked_attention import brute_force
from harness import RankFailure

from seqpack.compute.attention import ThdAttention
from seqpack.errors import ConfigError
from seqpack.thd import pack_sequences, pad_multiple_for
from seqpack.thd.cp import partition_indices, shard_for_cp

kv_exchange_traffic = load("kv_traffic").kv_exchange_traffic  # benchmarks/kv_traffic.py

F64 = torch.float64
LENGTHS = [13, 1, 22, 6, 3]  # uneven, with a length-1 sequence; padded to 2*cp
CASES = [  # (causal, window, heads, kv_heads)
    (True, None, 4, 2),
    (False, None, 4, 2),
    (True, (0, 0), 4, 2),
    (True, (3, 0), 4, 1),
    (True, (5, 0), 4, 4),
    (True, (100, 0), 4, 2),  # longer than every sequence: full causal
    (False, (2, 5), 4, 2),
    (False, (4, 4), 4, 1),
    (False, (-1, 3), 2, 2),
    (False, (6, -1), 2, 2),
]


def _group():
    world = dist.get_world_size()
    return dist.group.WORLD, world, dist.get_rank()


def _inputs(T, heads, kv_heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, heads, dim, dtype=F64, generator=g)
    k = torch.randn(T, kv_heads, dim, dtype=F64, generator=g)
    v = torch.randn(T, kv_heads, dim, dtype=F64, generator=g)
    w = torch.randn(T, heads, dim, dtype=F64, generator=g)
    return q, k, v, w


def _masked_cp(layout, lengths=LENGTHS):
    group, cp, rank = _group()
    g = torch.Generator().manual_seed(0)
    batch = pack_sequences([{"input_ids": torch.randint(1, 99, (n,), generator=g)} for n in lengths],
                           pad_multiple=pad_multiple_for(cp))  # fmt: skip
    shard = shard_for_cp(batch, cp, rank, layout=layout)
    idx = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, rank, layout=layout)
    results = []
    for case, (causal, window, heads, kv_heads) in enumerate(CASES):
        q, k, v, w = _inputs(batch.num_tokens, heads, kv_heads, 4, seed=case)
        full_in = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = brute_force(*full_in, batch, causal, window)
        (ref * w).sum().backward()
        local_in = [t[idx].clone().requires_grad_() for t in (q, k, v)]
        att = ThdAttention(heads, 4, kv_heads, backend="torch", cp_group=group, causal=causal, window=window)
        out = att(*local_in, shard)
        (out * w[idx]).sum().backward()
        errors = {"out": float((out - ref[idx]).detach().abs().max())}
        for name, a, b in zip("qkv", local_in, full_in, strict=True):
            errors["d" + name] = float((a.grad - b.grad[idx]).abs().max())
        traffic = kv_exchange_traffic(batch.cu_seqlens, batch.cu_seqlens_padded, cp, causal=causal, window=window,
                                      layout=layout)  # fmt: skip
        results.append((causal, window, heads, kv_heads, errors, traffic.rows_received[rank]))
    return results, int(shard.padding_mask.sum())


@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
@pytest.mark.parametrize("cp", [2, 4])
def test_masked_cp_attention_matches_brute_force(dist_pools, cp, layout):
    per_rank = dist_pools.get(cp).run(_masked_cp, layout)
    assert sum(pads for _, pads in per_rank) > 0  # the pack really has pads
    for results, _ in per_rank:
        assert len(results) == len(CASES)
        for causal, window, heads, kv_heads, errors, _moved in results:
            assert max(errors.values()) < 1e-12, (causal, window, heads, kv_heads, errors)
    worst = max(max(r[4].values()) for results, _ in per_rank for r in results)
    print(f"cp={cp} {layout}: {len(CASES)} mask cases, max |diff| of outputs and dq/dk/dv {worst:.1e}")
    # Not vacuous: keys (and their gradients) crossed ranks in every case but window (0, 0),
    # where each query sees only itself and nothing needs to move.
    for c, (causal, window, *_) in enumerate(CASES):
        received = sum(per_rank[r][0][c][5] for r in range(cp))
        assert (received == 0) if window == (0, 0) else (received > 0), (causal, window, received)


def _windowed_pads(layout):
    """A pack whose second rank holds only pads (one token): forward and backward finish."""
    group, cp, rank = _group()
    batch = pack_sequences([{"input_ids": torch.tensor([5])}], pad_multiple=pad_multiple_for(cp))
    shard = shard_for_cp(batch, cp, rank, layout=layout)
    q, k, v = (torch.randn(shard.num_tokens, 2, 4, dtype=F64, requires_grad=True) for _ in range(3))
    out = ThdAttention(2, 4, backend="torch", cp_group=group, window=(2, 0))(q, k, v, shard)
    out.sum().backward()
    return bool(shard.padding_mask.all()), float(out.abs().max()), k.grad is not None


@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
def test_all_pad_ranks_with_a_window_do_not_hang(dist_pools, layout):
    results = dist_pools.get(2).run(_windowed_pads, layout)
    assert results[1][0] and results[1][1] == 0.0
    assert all(has_grad for _, _, has_grad in results)


def _exchange_traffic_matches(layout):
    """The rows each rank really receives equal kv_exchange_traffic's count."""
    group, cp, rank = _group()
    lengths = [40, 9, 64, 3]
    batch = pack_sequences([{"input_ids": torch.ones(n, dtype=torch.int64)} for n in lengths],
                           pad_multiple=pad_multiple_for(cp))  # fmt: skip
    from seqpack.compute.attention.kv_exchange import plan_kv_exchange

    att = ThdAttention(2, 4, backend="torch", cp_group=group, window=(4, 0))
    plan = plan_kv_exchange(batch.cu_seqlens, batch.cu_seqlens_padded, cp, rank, mask=att.mask, layout=layout)
    traffic = kv_exchange_traffic(batch.cu_seqlens, batch.cu_seqlens_padded, cp, window=(4, 0), layout=layout)
    return sum(plan.recv_counts) - plan.recv_counts[rank], traffic.rows_received[rank], traffic.saving


@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
def test_exchange_traffic_is_what_ranks_receive(dist_pools, layout):
    for received, counted, saving in dist_pools.get(4).run(_exchange_traffic_matches, layout):
        assert received == counted
        assert saving > 0.7  # a 4-token window needs a few keys per chunk, not the whole pack


def _layout_mismatch():
    group, cp, rank = _group()
    batch = pack_sequences([{"input_ids": torch.arange(1, 9)}], pad_multiple=pad_multiple_for(cp))
    shard = shard_for_cp(batch, cp, rank, layout="contiguous")
    att = ThdAttention(2, 4, backend="torch", cp_group=group, cp_layout="dualchunk")
    att(*(torch.zeros(shard.num_tokens, 2, 4) for _ in range(3)), shard)


def test_a_module_told_its_layout_refuses_another(dist_pools):
    with pytest.raises(RankFailure, match=r"batch is cut in cp_layout='contiguous' but this module was built for"):
        dist_pools.get(2).run(_layout_mismatch)


class _FakeDPA(torch.nn.Module):
    """Stands in for TE's DotProductAttention: records how it was built."""

    def __init__(self, **kwargs):
        super().__init__()
        self.init, self.cp = kwargs, None

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p"):
        self.cp = cp_comm_type


def _te_rules_at_build(comm_type, window, heads, kv_heads, layout):
    """ThdAttention(backend='te') under CP refuses what TE cannot run (a stand-in TE otherwise)."""
    group, _, rank = _group()
    subgroups = None
    if comm_type == "a2a+p2p":  # a2a over {0,1}/{2,3}, p2p over {0,2}/{1,3}; every rank builds every group
        a2a = [dist.new_group(r) for r in ([0, 1], [2, 3])]
        p2p = [dist.new_group(r) for r in ([0, 2], [1, 3])]
        subgroups = (a2a[rank // 2], p2p[rank % 2])
    te, te_pt = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.pytorch")
    te_pt.DotProductAttention = _FakeDPA
    te.pytorch = te_pt
    saved = {n: sys.modules.get(n) for n in ("transformer_engine", "transformer_engine.pytorch")}
    sys.modules.update({"transformer_engine": te, "transformer_engine.pytorch": te_pt})
    try:
        causal = window is None or window[1] == 0
        att = ThdAttention(heads, 4, kv_heads, backend="te", cp_group=group, cp_comm_type=comm_type, causal=causal,
                           window=window, cp_layout=layout, cp_subgroups=subgroups)  # fmt: skip
    except ConfigError as exc:
        return str(exc)
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    dpa = att.te_attention
    return f"built {dpa.init['attn_mask_type']} {dpa.init['window_size']} {dpa.cp}"


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ("p2p", (128, 0), 4, 4, None),
            r"cp_comm_type='p2p' does not support a sliding window .*\('all_gather', 'a2a'\)",
        ),
        (("a2a+p2p", (128, 0), 4, 4, None), r"does not support a sliding window"),
        (("a2a+p2p", None, 6, 3, None), r"splits heads over 2 ranks, but num_heads=6 and num_kv_heads=3"),
        (("a2a+p2p", None, 6, 2, None), r"^built padding_causal \(-1, 0\) a2a\+p2p$"),
        (("a2a", None, 6, 2, None), r"splits heads over 4 ranks, but num_heads=6 and num_kv_heads=2"),
        (("a2a", None, 8, 2, None), r"num_kv_heads=2 are not both divisible by 4.*\('p2p', 'all_gather'\)"),
        (("all_gather", None, 4, 4, "contiguous"), r"DualChunkSwap only.*no cp_comm_type works here"),
        (("all_gather", (128, 0), 4, 4, None), r"^built padding_causal \(128, 0\) all_gather$"),
        (("a2a", (64, 64), 8, 4, None), r"^built padding \(64, 64\) a2a$"),
        (("p2p", None, 4, 2, None), r"^built padding_causal \(-1, 0\) p2p$"),
    ],
)
def test_te_rules_are_checked_when_the_module_is_built(dist_pools, args, expected):
    import re

    for message in dist_pools.get(4).run(_te_rules_at_build, *args):
        assert re.search(expected, message), message
