import math
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.compute import backends
from seqpack.compute.attention import ThdAttention, attention_mask, select_backend, thd_attention
from seqpack.compute.attention import reference as attn_mod
from seqpack.thd import pack_sequences, pad_multiple_for, padding_only_batch
from seqpack.thd.cp import partition_indices, shard_for_cp

F64 = torch.float64


def make_pack(lengths, pad_multiple=1, pad_to=None):
    return pack_sequences(
        [{"input_ids": torch.arange(1, n + 1)} for n in lengths], pad_multiple=pad_multiple, pad_to=pad_to
    )


def qkv(tokens, heads, kv_heads, dim, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dim, dtype=dtype, generator=g)
    k = torch.randn(tokens, kv_heads, dim, dtype=dtype, generator=g)
    v = torch.randn(tokens, kv_heads, dim, dtype=dtype, generator=g)
    return [t.requires_grad_() for t in (q, k, v)]


def dense_reference(q, k, v, batch):
    """Whole-pack T x T mask: same sequence, key <= query, key and query real."""
    T, H, D = q.shape
    seq, pad = batch.seq_idx, batch.padding_mask
    pos = torch.arange(T)
    allowed = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None]) & ~pad[None, :] & ~pad[:, None]
    group = H // k.shape[1]
    kh, vh = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q, kh) / math.sqrt(D)
    probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)  # all-masked rows -> 0
    return torch.einsum("hts,shd->thd", probs, vh)


def grads(out, inputs, seed=1):
    # The generator lives on the CPU: draw there, then move to the output's device (CUDA on a GPU run).
    gy = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed)).to(out.device)
    return torch.autograd.grad(out, inputs, gy)


@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=5),
    st.sampled_from([1, 4]),
    st.sampled_from([(4, 4), (4, 2), (4, 1)]),
    st.booleans(),
)
@settings(max_examples=20)
@pytest.mark.slow
def test_matches_dense_reference_forward_and_backward(lengths, pad_multiple, heads, tail):
    H, Hkv = heads
    batch = make_pack(lengths, pad_multiple)
    if tail:  # also a pack tail absorbed into the last sequence
        batch = make_pack(lengths, pad_multiple, pad_to=batch.num_tokens + 2 * pad_multiple)
    q, k, v = qkv(batch.num_tokens, H, Hkv, 8)
    out = ThdAttention(H, 8, Hkv, backend="torch")(q, k, v, batch)
    ref = dense_reference(q, k, v, batch)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_pads_output_zero_and_get_zero_gradient():
    batch = make_pack([3, 1, 6], pad_multiple=4)
    pad = batch.padding_mask
    assert pad.sum() == 6
    q, k, v = qkv(batch.num_tokens, 2, 2, 4)
    out = ThdAttention(2, 4, backend="torch")(q, k, v, batch)
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    gq, gk, gv = grads(out, (q, k, v))
    for g in (gq, gk, gv):
        assert torch.isfinite(g).all() and torch.equal(g[pad], torch.zeros_like(g[pad]))
    assert gk[~pad].abs().sum() > 0  # not vacuous


def test_padding_only_batch_is_zero_with_zero_gradients():
    batch = padding_only_batch(8)
    q, k, v = qkv(8, 2, 1, 4)
    out = ThdAttention(2, 4, 1, backend="torch")(q, k, v, batch)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in (q, k, v))


def test_length_one_sequence_attends_only_itself():
    batch = make_pack([4, 1, 3], pad_multiple=2)
    q, k, v = qkv(batch.num_tokens, 1, 1, 4)
    out = ThdAttention(1, 4, backend="torch")(q, k, v, batch)
    torch.testing.assert_close(out[4], v[4])  # softmax over one key
    assert torch.equal(out[5], torch.zeros_like(out[5]))


def test_changing_one_sequence_changes_no_other():
    batch = make_pack([5, 1, 8, 3], pad_multiple=4)
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 4, 2, 8))
    att = ThdAttention(4, 8, 2, backend="torch")
    base = att(q, k, v, batch)
    cu = batch.cu_seqlens_padded.tolist()
    for i in range(4):
        rows = slice(cu[i], cu[i + 1])
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for t in (q2, k2, v2):
            t[rows] += 1.0
        out = att(q2, k2, v2, batch)
        other = torch.ones(batch.num_tokens, dtype=torch.bool)
        other[rows] = False
        assert torch.equal(out[other], base[other])
        assert not torch.equal(out[rows], base[rows])


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("lengths", [[9, 1, 16, 3], [1], [30]])
@pytest.mark.slow
def test_cp_shard_equals_single_rank_rows(cp, lengths):
    """The chunk masking of every CP rank, with the gathered K/V given directly."""
    batch = make_pack(lengths, pad_multiple_for(cp))
    T = batch.num_tokens
    q, k, v = qkv(T, 4, 2, 8)
    full = thd_attention(q, k, v, batch.cu_seqlens, batch.cu_seqlens_padded)
    gq_full, gk_full, gv_full = grads(full, (q, k, v))
    gy = torch.randn(full.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    gk_sum, gv_sum = torch.zeros_like(k), torch.zeros_like(v)
    for r in range(cp):
        idx = partition_indices(batch.cu_seqlens_padded, T, cp, r)
        q_local = q.detach()[idx].requires_grad_()
        out = thd_attention(q_local, k, v, batch.cu_seqlens, batch.cu_seqlens_padded, cp_size=cp, cp_rank=r)
        torch.testing.assert_close(out, full[idx], rtol=1e-12, atol=1e-12)
        gq, gk, gv = torch.autograd.grad(out, (q_local, k, v), gy[idx])
        torch.testing.assert_close(gq, gq_full[idx], rtol=1e-12, atol=1e-12)
        gk_sum += gk
        gv_sum += gv
    torch.testing.assert_close(gk_sum, gk_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gv_sum, gv_full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cp", [1, 2])
def test_never_builds_scores_larger_than_a_sequence(monkeypatch, cp):
    seen = []
    real_sdpa = attn_mod.F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.shape[-2], k.shape[-2]))
        return real_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    lengths = [40, 8, 8, 1, 24]
    batch = make_pack(lengths, pad_multiple_for(cp))
    q, k, v = qkv(batch.num_tokens, 2, 2, 4)
    idx = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, 0) if cp > 1 else slice(None)
    thd_attention(q[idx], k, v, batch.cu_seqlens, batch.cu_seqlens_padded, cp_size=cp, cp_rank=0)
    longest = max(lengths)
    assert seen and max(nk for _, nk in seen) <= longest
    assert max(nq for nq, _ in seen) <= (longest if cp == 1 else -(-longest // (2 * cp)))
    assert max(nq * nk for nq, nk in seen) < batch.num_tokens**2 / 4


def test_gradcheck_small():
    batch = make_pack([3, 1, 2], pad_multiple=2)
    q, k, v = qkv(batch.num_tokens, 2, 1, 3)
    att = ThdAttention(2, 3, 1, backend="torch")
    assert torch.autograd.gradcheck(lambda a, b, c: att(a, b, c, batch), (q, k, v), fast_mode=True)


def test_softmax_scale_is_used():
    batch = make_pack([5])
    q, k, v = (t.detach() for t in qkv(5, 1, 1, 4))
    out = ThdAttention(1, 4, backend="torch", softmax_scale=0.0)(q, k, v, batch)
    torch.testing.assert_close(out, v.cumsum(0) / torch.arange(1, 6, dtype=F64)[:, None, None])  # uniform weights


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_heads=6, head_dim=4, num_kv_heads=4), r"num_heads=6 is not divisible by num_kv_heads=4"),
        (dict(num_heads=0, head_dim=4), r"num_heads must be a positive integer, got 0"),
        (dict(num_heads=2, head_dim=4, backend="flash"), r"backend must be one of"),
        (dict(num_heads=2, head_dim=4, cp_comm_type="ring"), r"cp_comm_type must be one of"),
    ],
)
def test_bad_construction_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ThdAttention(**kwargs)


def test_bad_inputs_raise():
    batch = make_pack([4, 4])
    att = ThdAttention(4, 8, 2, backend="torch")
    q, k, v = (t.detach() for t in qkv(8, 4, 2, 8))
    with pytest.raises(ValueError, match=r"q has shape \(7, 4, 8\), expected \(8, 4, 8\) \(batch.num_tokens=8"):
        att(q[:7], k, v, batch)
    with pytest.raises(ValueError, match=r"k has shape \(8, 4, 8\), expected \(8, 2, 8\)"):
        att(q, q, v, batch)
    with pytest.raises(ValueError, match=r"v has shape \(8, 2, 4\)"):
        att(q, k, v[..., :4], batch)
    with pytest.raises(TypeError, match=r"share one dtype, got torch.float64, torch.float32"):
        att(q, k.float(), v, batch)
    with pytest.raises(TypeError, match=r"floating point, got torch.int64"):
        att(q.long(), k.long(), v.long(), batch)
    # A CP shard, but neither the module nor the batch has a CP group: say which group to pass
    # (shard_for_cp(batch, 1, 0), what the message suggested, is no remedy).
    with pytest.raises(ValueError, match=r"batch is CP shard 0 of 2 but this module has no CP group") as caught:
        att(q[:4], k[:4], v[:4], shard_for_cp(make_pack([4, 4], 4), 2, 0))
    assert "cp_group=" in str(caught.value) and "shard_for_cp(batch, 1, 0)" not in str(caught.value)


def test_functional_cp_layout_errors():
    batch = make_pack([5, 3], pad_multiple=2)  # padded 6 + 4: not divisible by 2*cp = 4
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 2, 2, 4))
    with pytest.raises(
        ValueError, match=r"divisible by 2\*cp_size=4 for DualChunkSwap, got cu_seqlens_padded=\[0, 6, 10\]"
    ):
        thd_attention(q[:5], k, v, batch.cu_seqlens, batch.cu_seqlens_padded, cp_size=2, cp_rank=0)
    with pytest.raises(ValueError, match=r"cu_seqlens_padded ends at 10 but k has 9 tokens"):
        thd_attention(q, k[:9], v[:9], batch.cu_seqlens, batch.cu_seqlens_padded)


# --- backend selection and the TE adapter (with a stand-in TE on CPU) -------------------


def test_select_backend():
    assert select_backend("torch", te_ready=True, device="cuda") == "torch"
    assert select_backend("te", te_ready=True, device="cpu") == "te"
    assert select_backend("auto", te_ready=True, device="cuda") == "te"
    assert select_backend("auto", te_ready=True, device="cpu") == "torch"
    assert select_backend("auto", te_ready=False, device="cuda") == "torch"
    assert select_backend("auto", te_ready=True, device="cuda", dtype=torch.float16) == "te"
    assert select_backend("auto", te_ready=True, device="cuda", dtype=torch.float32) == "torch"
    assert select_backend("te", te_ready=True, device="cuda", dtype=torch.float32) == "te"  # asked for
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("fa3", te_ready=True, device="cuda")


class FakeDotProductAttention(torch.nn.Module):
    """Records the TE contract it is called with; computes with the torch reference."""

    instances = []

    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, **kwargs):
        super().__init__()
        self.init = dict(num_attention_heads=num_attention_heads, kv_channels=kv_channels,
                         num_gqa_groups=num_gqa_groups, **kwargs)  # fmt: skip
        self.cp = None
        self.calls = []
        FakeDotProductAttention.instances.append(self)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p"):
        self.cp = (cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def forward(self, q, k, v, **kwargs):
        self.calls.append(kwargs)
        cu = kwargs["cu_seqlens_q"]
        causal = kwargs["attn_mask_type"] == "padding_causal"
        out = thd_attention(q, k, v, cu, kwargs["cu_seqlens_q_padded"], softmax_scale=self.init.get("softmax_scale"),
                            causal=causal, window=self.init["window_size"])  # fmt: skip
        return out.reshape(q.shape[0], -1)  # TE returns THD as [T, H * D]


@pytest.fixture
def fake_te(monkeypatch):
    FakeDotProductAttention.instances = []
    te = types.ModuleType("transformer_engine")
    te_pt = types.ModuleType("transformer_engine.pytorch")
    te_pt.DotProductAttention = FakeDotProductAttention
    te.pytorch = te_pt
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pt)
    return FakeDotProductAttention


def test_te_adapter_contract(fake_te):
    batch = make_pack([5, 1, 6], pad_multiple=4)  # padding between sequences
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 4, 2, 8))
    att = ThdAttention(4, 8, 2, backend="te", softmax_scale=0.5, te_options={"layer_number": 3})
    out = att(q, k, v, batch)
    (dpa,) = fake_te.instances
    assert dpa.init == dict(num_attention_heads=4, kv_channels=8, num_gqa_groups=2, qkv_format="thd",
                            attn_mask_type="padding_causal", window_size=(-1, 0), softmax_scale=0.5,
                            layer_number=3)  # fmt: skip
    assert dpa.cp is None  # no CP group set without CP
    (call,) = dpa.calls
    assert call["pad_between_seqs"] is True  # stated explicitly (TE #3331)
    assert call["qkv_format"] == "thd" and call["attn_mask_type"] == "padding_causal"
    assert torch.equal(call["cu_seqlens_q"], batch.cu_seqlens) and call["max_seqlen_q"] == batch.max_seqlen
    assert out.shape == (batch.num_tokens, 4, 8)
    torch.testing.assert_close(out, ThdAttention(4, 8, 2, backend="torch", softmax_scale=0.5)(q, k, v, batch))


def test_te_adapter_zeroes_pads_when_te_attends_them(fake_te):
    batch = make_pack([3, 4], pad_to=10)  # only the tail is padding: absorbed, padded_as_real path
    q, k, v = (t.detach() for t in qkv(10, 2, 2, 4))
    out = ThdAttention(2, 4, backend="te")(q, k, v, batch)
    (call,) = fake_te.instances[0].calls
    assert call["pad_between_seqs"] is False and call["cu_seqlens_q"] is call["cu_seqlens_q_padded"]  # TE #3487
    assert torch.equal(out[7:], torch.zeros_like(out[7:]))
    torch.testing.assert_close(out, ThdAttention(2, 4, backend="torch")(q, k, v, batch))


def test_auto_without_cuda_never_builds_te(fake_te, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    att = ThdAttention(2, 4, backend="auto")
    assert att.te_attention is None and fake_te.instances == []


def test_auto_with_cuda_builds_te_but_cpu_inputs_use_torch(fake_te, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    att = ThdAttention(2, 4, backend="auto")
    assert att.te_attention is fake_te.instances[0]
    batch = make_pack([3, 2])
    q, k, v = (t.detach() for t in qkv(5, 2, 2, 4))
    att(q, k, v, batch)  # CPU tensors
    assert fake_te.instances[0].calls == []


def test_te_backend_without_te_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # `import transformer_engine` now fails
    with pytest.raises(ImportError, match="backend='te' needs Transformer Engine"):
        ThdAttention(2, 4, backend="te")
    assert ThdAttention(2, 4, backend="auto").te_attention is None


def _has_te():
    return torch.cuda.is_available() and backends.import_te_attention().ok


@pytest.mark.gpu
@pytest.mark.skipif(not _has_te(), reason="needs CUDA and Transformer Engine")
def test_te_matches_torch_reference_on_cuda():
    for pad_multiple in (1, 8):
        batch = make_pack([37, 1, 90, 16], pad_multiple).to("cuda")
        q, k, v = (t.detach().to("cuda", torch.bfloat16).requires_grad_() for t in qkv(batch.num_tokens, 8, 2, 64))
        out = ThdAttention(8, 64, 2, backend="te")(q, k, v, batch)
        ref = ThdAttention(8, 64, 2, backend="torch")(q, k, v, batch)
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
        for a, b in zip(grads(out.float(), (q, k, v)), grads(ref.float(), (q, k, v)), strict=True):
            torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2)


def _blocks_and_grads(q, k, v, offset, mask):
    out = attn_mod._attend_queries(q[offset:], k, v, None, offset, 0, q.shape[0], mask, 0.3)
    return out, torch.autograd.grad(out.square().sum(), (q, k, v))


@pytest.mark.parametrize("offset", [0, 80])
@pytest.mark.parametrize("window", [None, (37, 0), (20, 9)])
@pytest.mark.slow
def test_query_blocking_of_long_sequences_is_exact(monkeypatch, window, offset):
    mask = attention_mask(window is None or window[1] == 0, window)
    torch.manual_seed(0)
    q, k, v = (torch.randn(200, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    whole, grads = _blocks_and_grads(q, k, v, offset, mask)
    calls = []
    real_sdpa = attn_mod.F.scaled_dot_product_attention

    def spy(qh, kh, vh, **kwargs):
        calls.append(qh.shape[0] * qh.shape[1] * kh.shape[1])  # heads x queries x keys
        return real_sdpa(qh, kh, vh, **kwargs)

    limit = 4 * 200 * 10  # 10-row query blocks of full causal attention
    monkeypatch.setattr(attn_mod, "MAX_SCORE_BLOCK", limit)
    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    blocked, blocked_grads = _blocks_and_grads(q, k, v, offset, mask)
    monkeypatch.undo()
    assert len(calls) >= 4 and max(calls) <= limit  # not vacuous: really cut into bounded blocks
    assert torch.allclose(blocked, whole, atol=1e-12, rtol=0)
    for a, b in zip(blocked_grads, grads, strict=True):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
