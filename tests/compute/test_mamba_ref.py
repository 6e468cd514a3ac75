import sys
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.compute import backends
from seqpack.compute.mamba import GatedRMSNorm, Mamba2Mixer, causal_conv1d, seq_idx_from_cu_seqlens, ssd_scan
from seqpack.thd import pack_sequences, padding_only_batch
from seqpack.thd.cp import shard_for_cp

F64 = torch.float64


# --- slow, obvious references ---------------------------------------------------------


def conv_per_sequence(x, weight, bias, lengths):
    """F.conv1d on each sequence alone (zero history), then SiLU."""
    outs, start = [], 0
    for n in lengths:
        seg = x[start : start + n].T[None]  # (1, C, n)
        y = F.conv1d(seg, weight[:, None, :], bias, padding=weight.shape[1] - 1, groups=weight.shape[0])[..., :n]
        outs.append(F.silu(y[0].T))
        start += n
    return torch.cat(outs)


def scan_loop(x, dt, A, B, C, seq_idx):
    """Token-by-token SSD recurrence, state zeroed where seq_idx changes."""
    T, H, P = x.shape
    G, N = B.shape[1:]
    h = x.new_zeros(H, P, N)
    ys = []
    for t in range(T):
        if t == 0 or seq_idx[t] != seq_idx[t - 1]:
            h = x.new_zeros(H, P, N)
        Bt = B[t].repeat_interleave(H // G, dim=0)  # (H, N)
        Ct = C[t].repeat_interleave(H // G, dim=0)
        h = torch.exp(dt[t] * A)[:, None, None] * h + (dt[t][:, None] * x[t])[:, :, None] * Bt[:, None, :]
        ys.append((h * Ct[:, None, :]).sum(-1))
    return torch.stack(ys)


def seq_idx_for(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))


def make_pack(lengths, pad_multiple=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return pack_sequences(
        [{"input_ids": torch.randint(1, 100, (n,), generator=g)} for n in lengths], pad_multiple=pad_multiple
    )


def mixer(**kw):
    torch.manual_seed(kw.pop("seed", 0))
    base = dict(d_model=16, d_state=4, d_conv=4, expand=2, headdim=8, ngroups=2, dtype=F64, backend="torch")
    base.update(kw)
    return Mamba2Mixer(**base)


# --- seq_idx ---------------------------------------------------------------------------


def test_seq_idx_right_true_opens_sequence_at_its_offset():
    cu = torch.tensor([0, 4, 6, 10], dtype=torch.int32)
    assert seq_idx_from_cu_seqlens(cu, 10).tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    late = torch.searchsorted(cu[1:].long(), torch.arange(10), right=False)  # the bug: one token late
    assert late.tolist() != seq_idx_from_cu_seqlens(cu, 10).tolist()


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.sampled_from([1, 2, 4]))
@settings(max_examples=20)
def test_seq_idx_matches_packer(lengths, pad_multiple):
    b = make_pack(lengths, pad_multiple)
    assert torch.equal(seq_idx_from_cu_seqlens(b.cu_seqlens_padded, b.num_tokens), b.seq_idx)


# --- conv1d ----------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [[5, 1, 7, 2], [1], [3, 3, 3], [10]])
@pytest.mark.slow
def test_conv_resets_at_sequence_boundaries(lengths):
    g = torch.Generator().manual_seed(1)
    T, Cn, W = sum(lengths), 6, 4
    x = torch.randn(T, Cn, dtype=F64, generator=g, requires_grad=True)
    w = torch.randn(Cn, W, dtype=F64, generator=g, requires_grad=True)
    bias = torch.randn(Cn, dtype=F64, generator=g, requires_grad=True)
    out = causal_conv1d(x, w, bias, seq_idx_for(lengths))
    ref = conv_per_sequence(x, w, bias, lengths)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, bias), gy)
    ref_grads = torch.autograd.grad(ref, (x, w, bias), gy)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --- SSD scan --------------------------------------------------------------------------


@given(
    st.lists(st.integers(1, 11), min_size=1, max_size=5),
    st.sampled_from([1, 3, 4, 8, 64]),
    st.sampled_from([(4, 1), (4, 2), (2, 2)]),
    st.integers(0, 2**16),
)
@settings(max_examples=15)
@pytest.mark.slow
def test_chunked_scan_matches_token_loop(lengths, chunk, heads_groups, seed):
    H, G = heads_groups
    T, P, N = sum(lengths), 3, 2
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, P, dtype=F64, generator=g, requires_grad=True)
    dt = F.softplus(torch.randn(T, H, dtype=F64, generator=g)).requires_grad_()
    A = (-torch.rand(H, dtype=F64, generator=g) * 4 - 0.1).requires_grad_()
    B = torch.randn(T, G, N, dtype=F64, generator=g, requires_grad=True)
    C = torch.randn(T, G, N, dtype=F64, generator=g, requires_grad=True)
    seq = seq_idx_for(lengths)
    y = ssd_scan(x, dt, A, B, C, seq, chunk)
    ref = scan_loop(x, dt, A, B, C, seq)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    gy = torch.randn(y.shape, dtype=F64, generator=g)
    inputs = (x, dt, A, B, C)
    for a, b in zip(torch.autograd.grad(y, inputs, gy), torch.autograd.grad(ref, inputs, gy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_scan_long_sequence_stays_finite_and_exact():
    # Many strongly decaying steps: exponents of cumulative sums would underflow/overflow if
    # they were differenced across the whole sequence.
    g = torch.Generator().manual_seed(3)
    T, H, P, N = 300, 2, 2, 2
    x = torch.randn(T, H, P, dtype=F64, generator=g)
    dt = torch.full((T, H), 3.0, dtype=F64)
    A = torch.tensor([-20.0, -0.01], dtype=F64)
    B = torch.randn(T, 1, N, dtype=F64, generator=g)
    C = torch.randn(T, 1, N, dtype=F64, generator=g)
    seq = torch.zeros(T, dtype=torch.int32)
    y = ssd_scan(x, dt, A, B, C, seq, 16)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, scan_loop(x, dt, A, B, C, seq), rtol=1e-10, atol=1e-10)


# --- the mixer -------------------------------------------------------------------------


def test_parameter_names_and_shapes_follow_mamba2():
    m = mixer(d_model=16, d_state=4, headdim=8, ngroups=2)  # d_inner 32, nheads 4
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {
        "in_proj.weight": (2 * 32 + 2 * 2 * 4 + 4, 16),
        "conv1d.weight": (32 + 2 * 2 * 4, 1, 4),
        "conv1d.bias": (32 + 2 * 2 * 4,),
        "dt_bias": (4,),
        "A_log": (4,),
        "D": (4,),
        "norm.weight": (32,),
        "out_proj.weight": (16, 32),
    }


def test_gated_rmsnorm_groups():
    g = torch.Generator().manual_seed(0)
    norm = GatedRMSNorm(8, group_size=4, eps=1e-5, dtype=F64)
    norm.weight.data = torch.randn(8, dtype=F64, generator=g)
    y, z = torch.randn(3, 8, dtype=F64, generator=g), torch.randn(3, 8, dtype=F64, generator=g)
    gated = y * F.silu(z)
    parts = [p / torch.sqrt(p.pow(2).mean(-1, keepdim=True) + 1e-5) for p in gated.split(4, dim=-1)]
    torch.testing.assert_close(norm(y, z), torch.cat(parts, -1) * norm.weight)


def _mixer_loss(m, hidden, batch, weights):
    out = m(hidden, batch)
    return out, (out * weights).sum()


@pytest.mark.parametrize("pad_multiple", [1, 4])
@pytest.mark.slow
def test_pack_equals_each_sequence_alone(pad_multiple):
    lengths = [5, 1, 9, 3]
    m = mixer(chunk_size=4)  # chunks straddle sequence boundaries
    pack = make_pack(lengths, pad_multiple)
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(pack.num_tokens, 16, dtype=F64, generator=g, requires_grad=True)
    weights = torch.randn(pack.num_tokens, 16, dtype=F64, generator=g)
    out, loss = _mixer_loss(m, hidden, pack, weights)
    loss.backward()
    pack_grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    cu = pack.cu_seqlens_padded.tolist()
    sep_grads = {k: torch.zeros_like(p) for k, p in m.named_parameters()}
    for i, n in enumerate(lengths):
        rows = slice(cu[i], cu[i + 1])
        alone = make_pack([n], pad_multiple)
        h = hidden.detach()[rows].clone().requires_grad_()
        o, seq_loss = _mixer_loss(m, h, alone, weights[rows])
        torch.testing.assert_close(o, out[rows], rtol=1e-12, atol=1e-12)
        seq_loss.backward()
        torch.testing.assert_close(h.grad, hidden.grad[rows], rtol=1e-12, atol=1e-12)
        for k, p in m.named_parameters():
            sep_grads[k] += p.grad
        m.zero_grad()
    for k in pack_grads:
        torch.testing.assert_close(pack_grads[k], sep_grads[k], rtol=1e-11, atol=1e-12, msg=k)


@pytest.mark.slow
def test_changing_one_sequence_changes_no_other():
    lengths = [4, 1, 7, 5]
    m = mixer(chunk_size=4)
    pack = make_pack(lengths, 2)
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(pack.num_tokens, 16, dtype=F64, generator=g)
    base = m(hidden, pack)
    cu = pack.cu_seqlens_padded.tolist()
    for i in range(len(lengths)):
        changed = hidden.clone()
        changed[cu[i] : cu[i + 1]] += torch.randn(cu[i + 1] - cu[i], 16, dtype=F64, generator=g)
        out = m(changed, pack)
        other = torch.ones(pack.num_tokens, dtype=torch.bool)
        other[cu[i] : cu[i + 1]] = False
        assert torch.equal(out[other], base[other])  # exactly: no leak through conv or state
        assert not torch.equal(out[~other], base[~other])  # not vacuous


def test_pads_do_not_leak_into_next_sequence():
    pack = make_pack([3, 4], pad_multiple=4)  # 1 pad after the first sequence
    assert pack.padding_mask.tolist()[3]
    m = mixer()
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(pack.num_tokens, 16, dtype=F64, generator=g)
    base = m(hidden, pack)
    changed = hidden.clone()
    changed[3] = 1e3  # a wild pad
    out = m(changed, pack)
    assert torch.equal(out[:3], base[:3]) and torch.equal(out[4:], base[4:])


def test_padding_only_batch_runs_forward_and_backward():
    m = mixer()
    batch = padding_only_batch(8)
    hidden = torch.randn(8, 16, dtype=F64, requires_grad=True)
    out = m(hidden, batch)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(hidden.grad).all()


def test_bfloat16_runs_with_fp32_statistics():
    m = mixer(dtype=torch.bfloat16)
    pack = make_pack([5, 3])
    out = m(torch.randn(pack.num_tokens, 16, dtype=torch.bfloat16), pack)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=10, headdim=8), r"d_inner = expand \* d_model = 20 is not divisible by headdim=8"),
        (dict(d_model=24, headdim=8, ngroups=4), r"nheads=6 .* not divisible by ngroups=4"),
        (dict(backend="cuda"), r"backend must be one of"),
        (dict(d_state=0), r"d_state must be a positive integer, got 0"),
    ],
)
def test_bad_sizes_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mixer(**kwargs)


def test_bad_inputs_raise():
    m = mixer()
    pack = make_pack([4, 4], 4)
    with pytest.raises(ValueError, match=r"hidden has shape \(7, 16\), expected \(8, 16\)"):
        m(torch.zeros(7, 16, dtype=F64), pack)
    with pytest.raises(TypeError, match=r"hidden has dtype torch.float32 but the parameters are torch.float64"):
        m(torch.zeros(8, 16), pack)
    shard = shard_for_cp(pack, 2, 1)
    with pytest.raises(ValueError, match=r"batch is CP shard 1 of 2 but this module has no CP group") as caught:
        m(torch.zeros(4, 16, dtype=F64), shard)
    assert "cp_group=" in str(caught.value) and "shard_for_cp(batch, 1, 0)" not in str(caught.value)


def test_mamba_ssm_backend_without_package_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)  # `import causal_conv1d` now fails
    with pytest.raises(ImportError, match="mamba_ssm and causal_conv1d"):
        mixer(backend="mamba_ssm")


# --- the kernel adapter, exercised on CPU with stand-ins that check the real call contract


def _fake_kernels(calls):
    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):  # fmt: skip
        assert x.dim() == 3 and x.shape[0] == 1 and x.stride(1) == 1, "channel-last [1, C, T] with seq_idx"
        assert seq_idx.dtype == torch.int32 and tuple(seq_idx.shape) == (1, x.shape[2])
        assert weight.shape == (x.shape[1], 4) and activation == "silu"
        calls.append("conv")
        return causal_conv1d(x[0].T, weight, bias, seq_idx[0], activation).T[None]

    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                  seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                                  return_final_states=False, return_varlen_states=False):  # fmt: skip
        assert x.dim() == 4 and dt.shape == x.shape[:3] and B.dim() == 4 and seq_idx.shape == x.shape[:2]
        assert dt_softplus and z is None and chunk_size == 256
        calls.append("scan")
        dtv = F.softplus(dt[0] + dt_bias)
        return (ssd_scan(x[0], dtv, A, B[0], C[0], seq_idx[0]) + x[0] * D[:, None])[None]

    names = ("causal_conv1d", "mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined")
    mods = {name: types.ModuleType(name) for name in names}
    mods["causal_conv1d"].causal_conv1d_fn = causal_conv1d_fn
    mods["mamba_ssm.ops.triton.ssd_combined"].mamba_chunk_scan_combined = mamba_chunk_scan_combined
    return mods


@pytest.mark.slow
def test_kernel_adapter_passes_seq_idx_and_matches_torch(monkeypatch):
    calls = []
    for name, mod in _fake_kernels(calls).items():
        monkeypatch.setitem(sys.modules, name, mod)
    pack = make_pack([5, 1, 6], 2)
    hidden = torch.randn(pack.num_tokens, 16, dtype=F64)
    ref = mixer(backend="torch")(hidden, pack)
    out = mixer(backend="mamba_ssm")(hidden, pack)
    assert calls == ["conv", "scan"]
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    calls.clear()
    mixer(backend="auto")(hidden, pack)  # CPU inputs: auto keeps the torch path
    assert calls == []


def _has_mamba_kernels():
    return torch.cuda.is_available() and backends.import_mamba_kernels().ok


@pytest.mark.gpu
@pytest.mark.skipif(not _has_mamba_kernels(), reason="needs CUDA with mamba_ssm and causal_conv1d")
def test_mamba_ssm_kernels_match_torch_reference():
    pack = make_pack([37, 1, 90, 16], 8).to("cuda")
    m_ref = mixer(d_model=64, d_state=16, headdim=16, dtype=torch.float32, backend="torch").cuda()
    m_k = mixer(d_model=64, d_state=16, headdim=16, dtype=torch.float32, backend="mamba_ssm").cuda()
    hidden = torch.randn(pack.num_tokens, 64, device="cuda", requires_grad=True)
    ref, out = m_ref(hidden, pack), m_k(hidden, pack)
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
    g_ref = torch.autograd.grad(ref.square().sum(), hidden)[0]
    g_k = torch.autograd.grad(out.square().sum(), hidden)[0]
    torch.testing.assert_close(g_k, g_ref, rtol=5e-3, atol=5e-3)
