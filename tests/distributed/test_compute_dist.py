"""CP attention and CP Mamba on gloo: every rank's outputs and gradients equal the
single-rank module at its tokens (float64), sequences stay independent, bad layouts raise.

Each worker function builds the same global pack and inputs from a seed, runs the
single-rank module on the whole pack as the reference, then its own CP shard.
"""

import sys
import types

import pytest
import torch
import torch.distributed as dist
from harness import RankFailure

from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.thd import pack_sequences, pad_multiple_for, padding_only_batch
from seqpack.thd.cp import partition_indices, shard_for_cp

F64 = torch.float64
LENGTHS = [13, 1, 22, 6, 3]  # uneven, with a length-1 sequence


def _cp_group(cp):
    """CP groups of consecutive ranks; returns (this rank's group, its ranks)."""
    world = dist.get_world_size()
    mine = None
    for start in range(0, world, cp):
        ranks = list(range(start, start + cp))
        group = dist.new_group(ranks)  # every rank creates every group, in the same order
        if dist.get_rank() in ranks:
            mine = (group, ranks)
    return mine


def _pack(lengths, cp):
    g = torch.Generator().manual_seed(0)
    return pack_sequences([{"input_ids": torch.randint(1, 99, (n,), generator=g)} for n in lengths],
                          pad_multiple=pad_multiple_for(cp))  # fmt: skip


def _max_err(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0


# --- attention ---------------------------------------------------------------------------


def _attention_cp(cp, lengths, heads, kv_heads, dim):
    group, _ = _cp_group(cp)
    rank = dist.get_rank(group)
    batch = _pack(lengths, cp)
    T = batch.num_tokens
    g = torch.Generator().manual_seed(1)
    q = torch.randn(T, heads, dim, dtype=F64, generator=g)
    k = torch.randn(T, kv_heads, dim, dtype=F64, generator=g)
    v = torch.randn(T, kv_heads, dim, dtype=F64, generator=g)
    w = torch.randn(T, heads, dim, dtype=F64, generator=g)

    full_in = [t.clone().requires_grad_() for t in (q, k, v)]
    full = ThdAttention(heads, dim, kv_heads, backend="torch")(*full_in, batch)
    (full * w).sum().backward()

    idx = partition_indices(batch.cu_seqlens_padded, T, cp, rank)
    local_in = [t[idx].clone().requires_grad_() for t in (q, k, v)]
    att = ThdAttention(heads, dim, kv_heads, backend="torch", cp_group=group)
    out = att(*local_in, shard_for_cp(batch, cp, rank))
    (out * w[idx]).sum().backward()
    errors = {"out": _max_err(out, full[idx])}
    for name, a, b in zip("qkv", local_in, full_in, strict=True):
        errors["d" + name] = _max_err(a.grad, b.grad[idx])
    return errors, int(batch.padding_mask.sum())


@pytest.mark.parametrize("cp, world", [(2, 2), (4, 4), (2, 4)])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_cp_attention_matches_single_rank(dist_pools, cp, world, heads, kv_heads):
    results = dist_pools.get(world).run(_attention_cp, cp, LENGTHS, heads, kv_heads, 8)
    for errors, pads in results:
        assert pads > 0  # the pack really has padding
        assert max(errors.values()) < 1e-12, errors


def _attention_independence(cp):
    group, _ = _cp_group(cp)
    rank = dist.get_rank(group)
    batch = _pack(LENGTHS, cp)
    T = batch.num_tokens
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(T, 2, 4, dtype=F64, generator=g) for _ in range(3))
    shard = shard_for_cp(batch, cp, rank)
    idx = partition_indices(batch.cu_seqlens_padded, T, cp, rank)
    att = ThdAttention(2, 4, backend="torch", cp_group=group)
    base = att(q[idx], k[idx], v[idx], shard)
    cu = batch.cu_seqlens_padded.tolist()
    report = []
    for i in range(len(LENGTHS)):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for t in (q2, k2, v2):
            t[cu[i] : cu[i + 1]] += 1.0
        out = att(q2[idx], k2[idx], v2[idx], shard)
        other = shard.seq_idx != i
        report.append((torch.equal(out[other], base[other]), bool((out[~other] != base[~other]).any())))
    return report


def test_cp_attention_sequences_independent(dist_pools):
    reports = dist_pools.get(2).run(_attention_independence, 2)
    assert all(unchanged for report in reports for unchanged, _ in report)
    # not vacuous: some rank saw each changed sequence's own outputs move
    assert all(any(report[i][1] for report in reports) for i in range(len(LENGTHS)))


# --- Mamba ---------------------------------------------------------------------------------


def _mixer(group, ngroups, chunk_size):
    torch.manual_seed(0)  # identical parameters on every rank
    return Mamba2Mixer(16, d_state=4, d_conv=4, expand=2, headdim=4, ngroups=ngroups, cp_group=group,
                       chunk_size=chunk_size, backend="torch", dtype=F64)  # fmt: skip  # 8 heads


def _mamba_cp(cp, lengths, ngroups, chunk_size, layout="dualchunk"):
    group, _ = _cp_group(cp)
    rank = dist.get_rank(group)
    batch = _pack(lengths, cp)
    T = batch.num_tokens
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(T, 16, dtype=F64, generator=g)
    w = torch.randn(T, 16, dtype=F64, generator=g)

    ref = _mixer(None, ngroups, chunk_size)
    h_full = hidden.clone().requires_grad_()
    full = ref(h_full, batch)
    (full * w).sum().backward()

    idx = partition_indices(batch.cu_seqlens_padded, T, cp, rank, layout=layout)
    m = _mixer(group, ngroups, chunk_size)
    h_local = hidden[idx].clone().requires_grad_()
    out = m(h_local, shard_for_cp(batch, cp, rank, layout=layout))
    (out * w[idx]).sum().backward()
    errors = {"out": _max_err(out, full[idx]), "dhidden": _max_err(h_local.grad, h_full.grad[idx])}
    for (name, p), (_, p_ref) in zip(m.named_parameters(), ref.named_parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad, group=group)  # CP ranks hold partial parameter gradients
        errors["d" + name] = _max_err(grad, p_ref.grad)
        errors["nonzero_" + name] = float(p_ref.grad.abs().max())
    return errors


@pytest.mark.parametrize(
    "cp, world, ngroups",
    [(2, 2, 1), (2, 2, 2), (2, 2, 4), (4, 4, 1), (4, 4, 2), (4, 4, 4), (4, 4, 8), (2, 4, 2)],
)
def test_cp_mamba_matches_single_rank(dist_pools, cp, world, ngroups):
    chunk_size = 8  # chunks straddle sequence and CP-chunk boundaries
    _check_mamba(dist_pools.get(world).run(_mamba_cp, cp, LENGTHS, ngroups, chunk_size))


@pytest.mark.parametrize("cp, world, ngroups", [(2, 2, 1), (4, 4, 2), (4, 4, 8), (2, 4, 2)])
def test_cp_mamba_contiguous_layout_matches_single_rank(dist_pools, cp, world, ngroups):
    # The all-to-all's reorder must undo and redo the contiguous layout, not DualChunkSwap.
    _check_mamba(dist_pools.get(world).run(_mamba_cp, cp, LENGTHS, ngroups, 8, "contiguous"))


def _check_mamba(per_rank):
    for errors in per_rank:
        nonzero = {k: v for k, v in errors.items() if k.startswith("nonzero_")}
        assert min(nonzero.values()) > 0, nonzero  # every parameter really gets gradient
        errs = {k: v for k, v in errors.items() if not k.startswith("nonzero_")}
        assert max(errs.values()) < 1e-11, errs


def _mamba_independence(cp):
    group, _ = _cp_group(cp)
    rank = dist.get_rank(group)
    batch = _pack(LENGTHS, cp)
    T = batch.num_tokens
    hidden = torch.randn(T, 16, dtype=F64, generator=torch.Generator().manual_seed(4))
    shard = shard_for_cp(batch, cp, rank)
    idx = partition_indices(batch.cu_seqlens_padded, T, cp, rank)
    m = _mixer(group, 2, 8)
    base = m(hidden[idx], shard)
    cu = batch.cu_seqlens_padded.tolist()
    report = []
    for i in range(len(LENGTHS)):
        changed = hidden.clone()
        changed[cu[i] : cu[i + 1]] += 1.0
        out = m(changed[idx], shard)
        other = shard.seq_idx != i
        report.append((torch.equal(out[other], base[other]), bool((out[~other] != base[~other]).any())))
    return report


def test_cp_mamba_sequences_independent(dist_pools):
    reports = dist_pools.get(4).run(_mamba_independence, 4)
    assert all(unchanged for report in reports for unchanged, _ in report)
    assert all(any(report[i][1] for report in reports) for i in range(len(LENGTHS)))


# --- padding-only and all-pad ranks: forward and backward complete on every rank ---------


def _pads_everywhere(cp, which):
    group, _ = _cp_group(cp)
    rank = dist.get_rank(group)
    batch = padding_only_batch(4 * cp) if which == "padding_only" else _pack([1], cp)  # [1]: ranks > 0 all pads
    shard = shard_for_cp(batch, cp, rank)
    q, k, v = (torch.randn(shard.num_tokens, 2, 4, dtype=F64, requires_grad=True) for _ in range(3))
    out = ThdAttention(2, 4, backend="torch", cp_group=group)(q, k, v, shard)
    out.sum().backward()
    h = torch.randn(shard.num_tokens, 16, dtype=F64, requires_grad=True)
    y = _mixer(group, 1, 8)(h, shard)
    y.sum().backward()
    return (
        bool(shard.padding_mask.all()),
        float(out.abs().max()),
        k.grad is not None,
        bool(torch.isfinite(h.grad).all()),
    )


@pytest.mark.parametrize("which", ["padding_only", "one_token"])
def test_cp_all_pad_ranks_do_not_hang(dist_pools, which):
    results = dist_pools.get(2).run(_pads_everywhere, 2, which)
    assert results[1][0]  # rank 1 holds only pads
    for all_pad, out_max, has_k_grad, finite in results:
        assert has_k_grad and finite
        if all_pad:
            assert out_max == 0.0


# --- errors ----------------------------------------------------------------------------------


def _cp_errors(cp):
    group, _ = _cp_group(cp)
    messages = []
    for kwargs in (
        dict(d_model=12, headdim=4),  # d_inner 24 -> 6 heads, cp=4
        dict(d_model=12, headdim=4, ngroups=3),  # 6 heads, 3 groups, cp=2
    ):
        try:
            Mamba2Mixer(d_state=4, cp_group=group, dtype=F64, backend="torch", **kwargs)
        except ValueError as exc:
            messages.append(str(exc))
    batch = _pack([5, 3], cp)
    try:  # an unsharded batch given to a CP module
        ThdAttention(2, 4, backend="torch", cp_group=group)(
            *(torch.zeros(batch.num_tokens, 2, 4) for _ in range(3)), batch
        )
    except ValueError as exc:
        messages.append(str(exc))
    try:
        _mixer(group, 1, 8)(torch.zeros(batch.num_tokens, 16, dtype=F64), batch)
    except ValueError as exc:
        messages.append(str(exc))
    return messages


def test_cp_bad_layouts_raise_naming_values(dist_pools):
    four = dist_pools.get(4).run(_cp_errors, 4)[0]
    assert any("nheads=6 is not divisible by the CP size 4" in m for m in four), four
    two = dist_pools.get(2).run(_cp_errors, 2)[0]
    assert any("ngroups=3 and CP size 2" in m for m in two), two
    assert sum("batch is CP shard 0 of 1 but this module runs as CP rank" in m for m in two) == 2, two


# --- TE adapter under CP, with a stand-in TE module ---------------------------------------


def _te_cp_contract(cp, comm_type):
    group, ranks = _cp_group(cp)

    class FakeDPA(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            self.cp = None

        def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p"):
            self.cp = (cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    te, te_pt = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.pytorch")
    te_pt.DotProductAttention = FakeDPA
    te.pytorch = te_pt
    saved = {n: sys.modules.get(n) for n in ("transformer_engine", "transformer_engine.pytorch")}
    sys.modules.update({"transformer_engine": te, "transformer_engine.pytorch": te_pt})
    try:
        att = ThdAttention(2, 4, backend="te", cp_group=group, cp_comm_type=comm_type)
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    cp_group, cp_ranks, stream, cp_comm = att.te_attention.cp
    return cp_group is group, cp_ranks == ranks, cp_ranks, stream, cp_comm


@pytest.mark.parametrize("comm_type", ["p2p", "all_gather", "a2a"])
def test_te_context_parallel_group_is_set(dist_pools, comm_type):
    results = dist_pools.get(4).run(_te_cp_contract, 2, comm_type)
    assert [r[2] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # global ranks of each CP group
    for same_group, same_ranks, _, stream, cp_comm in results:
        assert same_group and same_ranks and cp_comm == comm_type
        assert stream is None  # no CUDA here; on CUDA a fresh torch.cuda.Stream()


def test_rank_failure_is_reported_not_hung(dist_pools):
    # A CP module built for a group the batch does not match fails fast on every rank.
    with pytest.raises(RankFailure, match="batch is CP shard"):
        dist_pools.get(2).run(_bad_shard)


def _bad_shard():
    group, _ = _cp_group(2)
    batch = shard_for_cp(_pack([5, 3], 2), 2, 1 - dist.get_rank(group))  # the other rank's shard
    ThdAttention(2, 4, backend="torch", cp_group=group)(*(torch.zeros(batch.num_tokens, 2, 4) for _ in range(3)), batch)


# --- our autograd collectives vs torch.distributed.nn.functional (kept: see _collectives.py) ---


def _collectives_vs_torch():
    import warnings

    import torch.distributed.nn.functional as torch_dnn

    from seqpack.compute._collectives import all_to_all_tokens

    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.randn(3 * world, 4, dtype=F64, generator=torch.Generator().manual_seed(rank))
    gy = torch.randn(3 * world, 4, dtype=F64, generator=torch.Generator().manual_seed(100 + rank))
    report = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # all-to-all (equal splits): forward values and backward
        ours_in, torch_in = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours = all_to_all_tokens(ours_in, dist.group.WORLD)
        theirs = torch_dnn.all_to_all_single(torch.empty_like(x), torch_in)
        ours.backward(gy)
        theirs.backward(gy)
        report["a2a_forward"] = torch.equal(ours, theirs)
        report["a2a_backward"] = torch.equal(ours_in.grad, torch_in.grad)
        report["a2a_moved_rows"] = not torch.equal(ours, x)  # not vacuous: rows really travelled
    report["deprecated"] = sorted({str(w.message).split(" is deprecated")[0] for w in caught
                                   if issubclass(w.category, FutureWarning)})  # fmt: skip
    return report


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_match_torch_distributed_nn(dist_pools, world):
    for report in dist_pools.get(world).run(_collectives_vs_torch):
        assert report["a2a_forward"] and report["a2a_backward"] and report["a2a_moved_rows"], report
