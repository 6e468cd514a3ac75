"""The CUDA paths against the torch references, on a real GPU (skipped elsewhere).

- Transformer Engine attention (``ThdAttention(backend="te")``) vs the torch reference on
  random packs: GQA, bf16 and fp16, pads between sequences, tail-only pads, no pads; pad rows
  and pad gradients exactly 0. Sliding windows and bidirectional masks too, and under CP on
  two or more GPUs (NCCL) with ``cp_comm_type`` ``p2p``, ``all_gather`` and ``a2a``.
- TE's CUDA partition function ``thd_get_partitioned_indices`` vs ``seqpack.thd.partition_indices``.
- The mamba_ssm / causal_conv1d kernels vs the torch Mamba2 reference, and sequence isolation.
- THD through a real ``transformer_engine.pytorch.TransformerLayer`` (keyword arguments from
  ``PackedBatch.te_kwargs()``) vs the same layer run on each sequence alone.
- ``backend="auto"`` on CUDA warns once when a fast path does not import.

Reference comparisons stay <= 8K tokens: the torch reference keeps every score block for
backward. Errors are measured relative to the reference's largest magnitude.
"""

import logging
import os
import sys
import tempfile

import numpy as np
import pytest
import torch

from seqpack._logging import reset_warn_once
from seqpack.compute import backends
from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.thd import pack_sequences, pad_multiple_for, shard_for_cp
from seqpack.thd.cp import gather_order, partition_indices

pytestmark = pytest.mark.gpu

HAS_CUDA = torch.cuda.is_available()
# Probing imports only on CUDA machines: TE's import alone takes seconds.
HAS_TE = HAS_CUDA and backends.import_te_attention().ok
HAS_MAMBA = HAS_CUDA and backends.import_mamba_kernels().ok
DEVICE = torch.device("cuda")  # one name, so a dry run of these tests' own logic can point it elsewhere
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
needs_te = pytest.mark.skipif(not HAS_TE, reason="needs CUDA and Transformer Engine")
needs_mamba = pytest.mark.skipif(not HAS_MAMBA, reason="needs CUDA with mamba_ssm and causal_conv1d")


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    """max |a - b| / max(max |b|, floor) in float64 (0 when both are empty)."""
    if b.numel() == 0:
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def randn(shape, seed, dtype=torch.float32):
    """Random values drawn on the CPU (reproducible everywhere), then moved to the GPU."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def random_lengths(rng, budget, longest=2048):
    """Lognormal SFT-like lengths (some of length 1) filling up to ``budget`` tokens."""
    lengths = []
    while True:
        n = 1 if rng.random() < 0.1 else int(np.clip(rng.lognormal(np.log(300), 1.0), 1, longest))
        if sum(lengths) + n > budget:
            return lengths or [min(n, budget)]
        lengths.append(n)


def make_pack(lengths, *, pad_multiple=1, pad_to=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 1000, (n,), generator=g)} for n in lengths]
    return pack_sequences(samples, pad_multiple=pad_multiple, pad_to=pad_to)


# --- Transformer Engine attention vs the torch reference --------------------------------------

HEADS = [(8, 8, 64), (8, 2, 64), (16, 4, 128), (4, 1, 64)]  # (heads, kv heads, head dim): MHA, GQA, MQA


def _layout(rng, layout, budget=6000):
    lengths = random_lengths(rng, budget)
    if layout == "between":  # every sequence padded to a multiple: pads sit between sequences
        return make_pack(lengths, pad_multiple=int(rng.choice([8, 16, 64])))
    if layout == "tail":  # only the pack's tail is padding
        packed = sum(lengths)
        return make_pack(lengths, pad_to=packed + int(rng.integers(1, 200)))
    return make_pack(lengths)  # no padding at all


def _te_vs_reference(batch, heads, kv_heads, head_dim, dtype, seed, causal=True, window=None):
    """(forward error, gradient errors, TE output, TE gradients) of TE against the fp32 reference."""
    batch = batch.to(DEVICE)
    T = batch.num_tokens
    inputs = [
        randn((T, n, head_dim), seed + i, dtype=dtype).requires_grad_()
        for i, n in enumerate((heads, kv_heads, kv_heads))
    ]
    reference_inputs = [t.detach().float().requires_grad_() for t in inputs]  # the same values, fp32
    mask = dict(causal=causal, window=window)
    out = ThdAttention(heads, head_dim, kv_heads, backend="te", **mask)(*inputs, batch)
    ref = ThdAttention(heads, head_dim, kv_heads, backend="torch", **mask)(*reference_inputs, batch)
    gy = randn(out.shape, seed + 7)
    gy[batch.padding_mask] = 0  # pads carry no loss
    grads = torch.autograd.grad(out, inputs, gy.to(dtype))
    ref_grads = torch.autograd.grad(ref, reference_inputs, gy)
    # A gradient the reference has exactly zero (under window (0, 0) every query sees only
    # itself, and a softmax over one score has no gradient) is measured against 1% of the
    # largest reference gradient: bf16 noise of ~2e-6 there is no error.
    floor = 1e-2 * max(float(g.abs().max()) for g in ref_grads)
    grad_errors = [rel_err(a, b, floor) for a, b in zip(grads, ref_grads, strict=True)]
    return rel_err(out, ref), grad_errors, out, grads


@needs_te
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["between", "tail", "none"])
def test_te_attention_matches_reference_on_random_packs(dtype, layout):
    rng = np.random.default_rng([0 if dtype == torch.bfloat16 else 1, ["between", "tail", "none"].index(layout)])
    tolerance = 2e-2 if dtype == torch.bfloat16 else 5e-3
    for trial in range(4):
        batch = _layout(rng, layout)
        te_kwargs = batch.te_kwargs()
        pads = batch.padding_mask
        if layout == "between":
            assert te_kwargs["pad_between_seqs"] is True  # not vacuous: pads really sit between sequences
        if layout == "tail":
            assert pads.any() and te_kwargs["cu_seqlens_q"] is te_kwargs["cu_seqlens_q_padded"]  # TE #3487 path
        heads, kv_heads, head_dim = HEADS[trial % len(HEADS)]
        fwd, grad_errors, out, grads = _te_vs_reference(batch, heads, kv_heads, head_dim, dtype, seed=10 * trial)
        context = f"{layout} {dtype} trial {trial}: {len(batch.seq_lens())} seqs, T={batch.num_tokens}, heads={heads}"
        assert fwd < tolerance, (context, fwd)
        assert max(grad_errors) < 2 * tolerance, (context, grad_errors)
        pads = pads.to(DEVICE)
        assert torch.equal(out[pads], torch.zeros_like(out[pads])), context  # pad rows exactly 0
        for grad in grads:
            assert torch.equal(grad[pads], torch.zeros_like(grad[pads])), context  # pad gradients exactly 0


@needs_te
def test_te_attention_matches_reference_on_one_8k_sequence():
    batch = make_pack([8000, 1, 150], pad_multiple=16)  # 8K tokens, a long sequence and pads between
    fwd, grad_errors, _, _ = _te_vs_reference(batch, 8, 2, 64, torch.bfloat16, seed=99)
    assert fwd < 2e-2 and max(grad_errors) < 4e-2, (fwd, grad_errors)


# --- masks: sliding windows and bidirectional attention -----------------------------------------

TE_MASKS = [(True, (128, 0)), (True, (0, 0)), (False, None), (False, (64, 64)), (False, (0, 32))]


@needs_te
@pytest.mark.parametrize("causal, window", TE_MASKS)
@pytest.mark.parametrize("layout", ["between", "tail", "none"])
def test_te_masks_match_reference_on_random_packs(causal, window, layout):
    rng = np.random.default_rng([7, TE_MASKS.index((causal, window)), ["between", "tail", "none"].index(layout)])
    for trial in range(2):
        batch = _layout(rng, layout, budget=4000)
        heads, kv_heads, head_dim = HEADS[trial % len(HEADS)]
        fwd, grad_errors, out, grads = _te_vs_reference(
            batch, heads, kv_heads, head_dim, torch.bfloat16, seed=10 * trial, causal=causal, window=window
        )
        context = f"{layout} causal={causal} window={window} trial {trial}: T={batch.num_tokens}"
        assert fwd < 2e-2 and max(grad_errors) < 4e-2, (context, fwd, grad_errors)
        pads = batch.padding_mask.to(DEVICE)
        assert torch.equal(out[pads], torch.zeros_like(out[pads])), context


# --- TE under CP on several GPUs (NCCL), every comm type a mask allows ---------------------------

CP_CASES = [  # (cp_comm_type, causal, window)
    ("p2p", True, None), ("all_gather", True, None), ("a2a", True, None),
    ("all_gather", True, (128, 0)), ("a2a", True, (128, 0)),
    ("all_gather", False, None), ("a2a", False, None), ("all_gather", False, (64, 64)),
]  # fmt: skip
needs_two_gpus = pytest.mark.skipif(
    not (HAS_TE and torch.cuda.device_count() >= 2), reason="needs 2 GPUs and Transformer Engine"
)


def _te_cp_worker(rank, world, store_path, comm_type, causal, window, results):
    import torch.distributed as dist

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        lengths = [700, 1, 333, 1200, 64, 9]
        batch = make_pack(lengths, pad_multiple=pad_multiple_for(world))
        T, heads, kv_heads, dim = batch.num_tokens, 8, 2, 64
        g = torch.Generator().manual_seed(0)
        full = [torch.randn(T, n, dim, generator=g).to(device) for n in (heads, kv_heads, kv_heads)]
        gy = torch.randn(T, heads, dim, generator=g).to(device)
        gy[batch.padding_mask.to(device)] = 0  # pads carry no loss
        ref_in = [t.clone().requires_grad_() for t in full]  # fp32 reference on the whole pack
        ref = ThdAttention(heads, dim, kv_heads, backend="torch", causal=causal, window=window)(
            *ref_in, batch.to(device)
        )
        ref_grads = torch.autograd.grad(ref, ref_in, gy)
        idx = partition_indices(batch.cu_seqlens_padded, T, world, rank).to(device)
        local = [t[idx].to(torch.bfloat16).requires_grad_() for t in full]
        att = ThdAttention(heads, dim, kv_heads, backend="te", cp_group=dist.group.WORLD, cp_comm_type=comm_type,
                           causal=causal, window=window)  # fmt: skip
        out = att(*local, shard_for_cp(batch, world, rank).to(device))
        grads = torch.autograd.grad(out, local, gy[idx].to(torch.bfloat16))
        errors = [rel_err(out, ref[idx])] + [rel_err(a, b[idx]) for a, b in zip(grads, ref_grads, strict=True)]
        results.put((rank, errors))
    except BaseException as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


@needs_two_gpus
@pytest.mark.parametrize("comm_type, causal, window", CP_CASES)
def test_te_under_cp_matches_reference(comm_type, causal, window):
    import torch.multiprocessing as mp

    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_te_cp_worker, args=(r, world, store, comm_type, causal, window, results))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        outcomes = dict(results.get(timeout=600) for _ in range(world))
        for p in procs:
            p.join(timeout=60)
    for rank, errors in outcomes.items():
        assert not isinstance(errors, str), (rank, errors)
        assert errors[0] < 2e-2 and max(errors[1:]) < 4e-2, (comm_type, causal, window, rank, errors)


def _te_dynamic_worker(rank, world, store_path, results):
    """Dynamic CP under TE: one module without a CP group runs a batch alone, then a batch
    carrying a 2-rank cp_group, then alone again (TE's group switched per batch)."""
    import dataclasses

    import torch.distributed as dist

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        heads, kv_heads, dim = 8, 2, 64
        att = ThdAttention(heads, dim, kv_heads, backend="te")  # no cp_group: every batch brings its own
        errors = []
        for case, lengths in enumerate(([300, 77], [700, 1, 333, 1200], [64, 9, 500])):
            grouped = case == 1
            batch = make_pack(lengths, pad_multiple=pad_multiple_for(world if grouped else 1))
            T = batch.num_tokens
            g = torch.Generator().manual_seed(case)
            full = [torch.randn(T, n, dim, generator=g).to(device) for n in (heads, kv_heads, kv_heads)]
            ref = ThdAttention(heads, dim, kv_heads, backend="torch")(*full, batch.to(device))
            if grouped:
                idx = partition_indices(batch.cu_seqlens_padded, T, world, rank).to(device)
                local = dataclasses.replace(shard_for_cp(batch, world, rank), cp_group=dist.group.WORLD)
                out = att(*[t[idx].to(torch.bfloat16) for t in full], local.to(device))
                errors.append(rel_err(out, ref[idx]))
            else:
                out = att(*[t.to(torch.bfloat16) for t in full], batch.to(device))
                errors.append(rel_err(out, ref))
        results.put((rank, errors))
    except BaseException as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


@needs_two_gpus
def test_te_switches_to_each_batch_cp_group():
    import torch.multiprocessing as mp

    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_te_dynamic_worker, args=(r, world, store, results)) for r in range(world)]
        for p in procs:
            p.start()
        outcomes = dict(results.get(timeout=600) for _ in range(world))
        for p in procs:
            p.join(timeout=60)
    for rank, errors in outcomes.items():
        assert not isinstance(errors, str), (rank, errors)
        assert max(errors) < 2e-2, (rank, errors)


# --- TE's partition function vs seqpack.thd.partition_indices ------------------------------------


@needs_te
def test_te_partition_function_equals_partition_indices():
    import transformer_engine.pytorch  # noqa: F401  (loads transformer_engine_torch first)
    import transformer_engine_torch as tex

    rng = np.random.default_rng(2262)
    checked = 0
    for _ in range(400):
        cp = int(rng.integers(2, 17))
        padded = rng.integers(1, 9, size=int(rng.integers(1, 10))) * 2 * cp  # every length divisible by 2*cp
        cu = np.concatenate([[0], np.cumsum(padded)]).astype(np.int32)
        total = int(cu[-1])
        cu_cpu = torch.from_numpy(cu)
        cu_cuda = cu_cpu.to(DEVICE)
        for rank in range(cp):
            theirs = tex.thd_get_partitioned_indices(cu_cuda, total, cp, rank)
            ours = partition_indices(cu_cpu, total, cp, rank)
            assert torch.equal(theirs.cpu().long(), ours), (cu.tolist(), cp, rank)
            checked += 1
    assert checked > 2000


@needs_cuda
@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
def test_partition_indices_on_cuda_offsets_equal_the_cpu_ones(layout):
    """Offsets on the GPU expand the runs there (run_indices' device path): same indices."""
    rng = np.random.default_rng(40)
    for cp in (1, 2, 3, 8):
        multiple = 2 * cp if layout == "dualchunk" else cp
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum(rng.integers(0, 9, size=7) * multiple)]))
        total = int(cu[-1])
        for rank in range(cp):
            ours = partition_indices(cu.to(DEVICE), total, cp, rank, layout=layout)
            assert ours.device.type == "cuda"
            assert torch.equal(ours.cpu(), partition_indices(cu, total, cp, rank, layout=layout))
        on_gpu = gather_order(cu.to(DEVICE), total, cp, layout=layout)
        assert torch.equal(on_gpu.cpu(), gather_order(cu, total, cp, layout=layout))


# --- mamba_ssm / causal_conv1d kernels vs the torch reference -----------------------------------

# One (headdim, d_state) pair: mamba_ssm autotunes its Triton kernels per (chunk, headdim, d_state,
# dtypes), minutes each time on a fresh machine. causal_conv1d wants conv_dim % 8 == 0.
MAMBA_SHAPES = [
    dict(d_model=64, d_state=16, headdim=16, ngroups=2),  # 8 heads, 2 groups, conv_dim 192
    dict(d_model=128, d_state=16, headdim=16, ngroups=1),  # 16 heads, 1 group, conv_dim 288
]


def _mamba_pair(shape, dtype):
    torch.manual_seed(0)
    kernel = Mamba2Mixer(**shape, backend="mamba_ssm", device=DEVICE, dtype=dtype)
    reference = Mamba2Mixer(**shape, backend="torch", device=DEVICE, dtype=torch.float32)
    reference.load_state_dict(kernel.state_dict())  # the same weights, in fp32
    return kernel, reference


@needs_mamba
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", range(len(MAMBA_SHAPES)))
def test_mamba_kernels_match_reference(dtype, shape):
    kernel, reference = _mamba_pair(MAMBA_SHAPES[shape], dtype)
    rng = np.random.default_rng(shape)
    batch = make_pack(random_lengths(rng, 3000) + [1, 5], pad_multiple=8).to(DEVICE)
    assert batch.te_kwargs()["pad_between_seqs"]  # pads between sequences too
    d_model = MAMBA_SHAPES[shape]["d_model"]
    hidden = randn((batch.num_tokens, d_model), 1, dtype=dtype).requires_grad_()
    hidden_ref = hidden.detach().float().requires_grad_()
    out, ref = kernel(hidden, batch), reference(hidden_ref, batch)
    tolerance = 5e-3 if dtype == torch.float32 else 3e-2
    assert rel_err(out, ref) < tolerance, rel_err(out, ref)
    gy = randn(out.shape, 2)
    out.backward(gy.to(dtype))
    ref.backward(gy)
    assert rel_err(hidden.grad, hidden_ref.grad) < 4 * tolerance
    for (name, p), (_, p_ref) in zip(kernel.named_parameters(), reference.named_parameters(), strict=True):
        assert p_ref.grad.abs().max() > 0, name  # every parameter really gets gradient
        assert rel_err(p.grad, p_ref.grad) < 4 * tolerance, (name, rel_err(p.grad, p_ref.grad))


@needs_mamba
def test_mamba_kernels_keep_packed_sequences_apart():
    kernel, _ = _mamba_pair(MAMBA_SHAPES[0], torch.float32)
    lengths = [300, 1, 77, 512, 40]
    batch = make_pack(lengths, pad_multiple=8).to(DEVICE)
    hidden = randn((batch.num_tokens, 64), 3)
    with torch.no_grad():
        base = kernel(hidden, batch)
        scale = float(base.abs().max())
        cu = batch.cu_seqlens_padded.tolist()
        for i in range(len(lengths)):
            changed = hidden.clone()
            changed[cu[i] : cu[i + 1]] += randn((cu[i + 1] - cu[i], 64), 10 + i)
            out = kernel(changed, batch)
            mine = torch.zeros(batch.num_tokens, dtype=torch.bool, device=DEVICE)
            mine[cu[i] : cu[i + 1]] = True
            leak = float((out[~mine] - base[~mine]).abs().max()) / scale
            moved = float((out[mine] - base[mine]).abs().max()) / scale
            assert leak < 2e-3 and moved > 1e-2, (i, leak, moved)  # rounding at most; the sequence itself moves


# --- THD through a real TE TransformerLayer -----------------------------------------------------


@needs_te
@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_te_transformer_layer_thd_equals_each_sequence_alone(pad_multiple):
    import transformer_engine.pytorch as te

    torch.manual_seed(0)
    hidden_size = 512
    layer = te.TransformerLayer(
        hidden_size,
        4 * hidden_size,
        8,
        num_gqa_groups=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        self_attn_mask_type="padding_causal",
        attn_input_format="thd",
        params_dtype=torch.bfloat16,
        device=DEVICE,
        layer_number=1,
    )
    lengths = [37, 3, 300, 64, 129]  # (length-1 sequences: covered by the attention tests)
    batch = make_pack(lengths, pad_multiple=pad_multiple).to(DEVICE)
    pads = batch.padding_mask
    assert bool(pads.any()) == (pad_multiple > 1)
    x = randn((batch.num_tokens, hidden_size), 5, dtype=torch.bfloat16).requires_grad_()
    out = layer(x, self_attn_mask_type="padding_causal", **batch.te_kwargs(include_format=False))
    gy = randn(out.shape, 6, dtype=torch.bfloat16)
    gy[pads] = 0  # pads carry no loss
    out.backward(gy)
    packed_grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)

    cu, cu_padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    for i, n in enumerate(lengths):
        rows = slice(cu_padded[i], cu_padded[i] + n)  # the real tokens of sequence i
        alone = make_pack([n]).to(DEVICE)
        assert cu[i + 1] - cu[i] == n
        x_i = x.detach()[rows].clone().requires_grad_()
        out_i = layer(x_i, self_attn_mask_type="padding_causal", **alone.te_kwargs(include_format=False))
        assert rel_err(out[rows], out_i) < 2e-2, (i, rel_err(out[rows], out_i))
        out_i.backward(gy[rows])  # parameter gradients accumulate over the sequences
        assert rel_err(x.grad[rows], x_i.grad) < 3e-2, (i, rel_err(x.grad[rows], x_i.grad))
    for name, p in layer.named_parameters():
        assert rel_err(packed_grads[name], p.grad) < 5e-2, (name, rel_err(packed_grads[name], p.grad))
    assert torch.equal(x.grad[pads], torch.zeros_like(x.grad[pads]))  # pads feed nothing back


# --- no silent fallback on a real GPU -----------------------------------------------------------


@needs_cuda
def test_auto_warns_once_on_cuda_when_te_does_not_import(monkeypatch, caplog):
    reset_warn_once()
    caplog.set_level(logging.WARNING)
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    att = ThdAttention(4, 64, 2, backend="auto")
    assert att.te_attention is None
    batch = make_pack([30, 1, 17], pad_multiple=8).to(DEVICE)
    q = randn((batch.num_tokens, 4, 64), 1, dtype=torch.bfloat16)
    kv = randn((batch.num_tokens, 2, 64), 2, dtype=torch.bfloat16)
    out = att(q, kv, kv, batch)
    att(q, kv, kv, batch)
    warnings = [r for r in caplog.records if r.name == "seqpack.compute.attention"]
    assert len(warnings) == 1 and "ModuleNotFoundError" in warnings[0].getMessage()
    torch.testing.assert_close(out, ThdAttention(4, 64, 2, backend="torch")(q, kv, kv, batch))
    reset_warn_once()


@needs_cuda
def test_environment_report_sees_the_gpu():
    report = backends.environment_report()
    assert report["torch"]["cuda_available"] and report["torch"]["devices"]
    assert report["auto"]["attention"]["backend"] == ("te" if HAS_TE else "torch")
    assert report["auto"]["mamba"]["backend"] == ("mamba_ssm" if HAS_MAMBA else "torch")
    if HAS_TE:
        assert report["packages"]["transformer_engine_torch"]["thd_get_partitioned_indices"]
    assert report["torch"]["devices"][0]["name"] in backends.format_environment_report(report)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rmsnorm_on_cuda_matches_the_formula(dtype):
    from seqpack.compute.mamba import GatedRMSNorm

    norm = GatedRMSNorm(256, 64, device=DEVICE, dtype=dtype)
    norm.weight.data = randn((256,), 1, dtype=dtype)
    y, z = randn((100, 256), 2, dtype=dtype), randn((100, 256), 3, dtype=dtype)
    g = (y.float() * torch.nn.functional.silu(z.float())).unflatten(-1, (-1, 64))
    expected = ((g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * norm.weight).to(dtype)
    torch.testing.assert_close(norm(y, z), expected)  # the fused CUDA rms_norm may round differently
