"""Causal, bidirectional and sliding-window THD attention against a brute-force masked
reference (a T x T mask built token by token from each sequence), in float64, forward and
backward, GQA, both CP layouts, with whole-pack keys and with the CP exchange's key subsets."""

import numpy as np
import pytest
import torch
from benchmark_module import load
from hypothesis import given, settings
from hypothesis import strategies as st
from masked_attention import brute_force, brute_force_mask

from seqpack.compute.attention import ThdAttention, attention_mask, thd_attention
from seqpack.compute.attention.kv_exchange import keys_in_reach, plan_kv_exchange
from seqpack.compute.attention.masks import AttentionMask, block_mask
from seqpack.compute.attention.reference import attend
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import CpLayout
from seqpack.thd import pack_sequences, pad_multiple_for
from seqpack.thd.cp import partition_indices

kv_exchange_traffic = load("kv_traffic").kv_exchange_traffic  # benchmarks/kv_traffic.py

F64 = torch.float64
# (causal, window): full causal, bidirectional, causal windows (0, short, longer than any
# sequence), two-sided windows, one-sided non-causal windows (torch only; TE refuses them).
MASKS = [
    (True, None), (False, None), (True, (0, 0)), (True, (2, 0)), (True, (100, 0)),
    (False, (0, 0)), (False, (1, 3)), (False, (3, 1)), (False, (100, 100)), (False, (-1, 2)), (False, (2, -1)),
    (False, (4, 0)),
]  # fmt: skip


def make_pack(lengths, pad_multiple=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = [{"input_ids": torch.randint(1, 99, (n,), generator=g)} for n in lengths]
    return pack_sequences(samples, pad_multiple=pad_multiple)


def qkv(tokens, heads, kv_heads, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, h, dim, dtype=F64, generator=g).requires_grad_() for h in (heads, kv_heads, kv_heads)]


def max_err(a, b):
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


mask_strategy = st.one_of(
    st.tuples(st.just(True), st.one_of(st.none(), st.tuples(st.integers(-1, 12), st.just(0)))),
    st.tuples(st.just(False), st.one_of(st.none(), st.tuples(st.integers(-1, 12), st.integers(-1, 12)))),
)


@given(
    lengths=st.lists(st.integers(1, 11), min_size=1, max_size=4),
    mask=mask_strategy,
    heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
    cp=st.sampled_from([1, 2, 4]),
    layout=st.sampled_from(list(CpLayout)),
    seed=st.integers(0, 100),
)
@settings(max_examples=60, deadline=None)
@pytest.mark.slow
def test_every_rank_matches_the_brute_force_reference(lengths, mask, heads, cp, layout, seed):
    causal, window = mask
    batch = make_pack(lengths, pad_multiple_for(cp), seed)
    q, k, v = qkv(batch.num_tokens, *heads, seed=seed)
    ref = brute_force(q, k, v, batch, causal, window)
    gy = torch.randn(ref.shape, dtype=F64, generator=torch.Generator().manual_seed(seed + 1))
    ref_grads = torch.autograd.grad(ref, (q, k, v), gy)
    grad_q = torch.zeros_like(q)
    grad_kv = [torch.zeros_like(k), torch.zeros_like(v)]
    for rank in range(cp):
        idx = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, rank, layout=layout)
        q_local = q.detach()[idx].requires_grad_()
        out = thd_attention(q_local, k, v, batch.cu_seqlens, batch.cu_seqlens_padded, cp_size=cp, cp_rank=rank,
                            causal=causal, window=window, cp_layout=layout)  # fmt: skip
        assert max_err(out, ref[idx]) < 1e-12
        gq, gk, gv = torch.autograd.grad(out, (q_local, k, v), gy[idx])
        grad_q[idx] = gq
        grad_kv[0] += gk
        grad_kv[1] += gv
    for a, b in zip((grad_q, *grad_kv), ref_grads, strict=True):
        assert max_err(a, b) < 1e-12


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.slow
def test_masks_on_a_fixed_pack_with_pads_between_sequences(causal, window):
    batch = make_pack([7, 1, 12, 4], pad_multiple=4)
    assert batch.padding_mask.sum() > 0  # not vacuous: pads between sequences
    q, k, v = qkv(batch.num_tokens, 4, 2)
    att = ThdAttention(4, 4, 2, backend="torch", causal=causal, window=window)
    out = att(q, k, v, batch)
    ref = brute_force(q, k, v, batch, causal, window)
    assert max_err(out, ref) < 1e-12
    assert torch.equal(out[batch.padding_mask], torch.zeros_like(out[batch.padding_mask]))
    gy = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    for a, b in zip(torch.autograd.grad(out, (q, k, v), gy), torch.autograd.grad(ref, (q, k, v), gy), strict=True):
        assert max_err(a, b) < 1e-12
        assert torch.equal(a[batch.padding_mask], torch.zeros_like(a[batch.padding_mask]))  # pads feed nothing


def test_masks_really_differ():
    batch = make_pack([9, 6])
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 2, 2))
    outs = [ThdAttention(2, 4, backend="torch", causal=c, window=w)(q, k, v, batch) for c, w in MASKS[:5]]
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            if (i, j) != (0, 4):  # a causal window of 100 is full causal on sequences of 9 and 6
                assert not torch.allclose(outs[i], outs[j]), (MASKS[i], MASKS[j])
    torch.testing.assert_close(outs[0], outs[4], rtol=0, atol=0)


def test_window_zero_attends_only_itself():
    batch = make_pack([5, 3], pad_multiple=4)
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 2, 1))
    for causal in (True, False):
        out = ThdAttention(2, 4, 1, backend="torch", causal=causal, window=(0, 0))(q, k, v, batch)
        real = ~batch.padding_mask
        torch.testing.assert_close(out[real], v[real].expand(-1, 2, -1), rtol=0, atol=0)


# --- the CP exchange's key subsets -------------------------------------------------------------


def simulate_exchange(batch, cp, layout, mask):
    """Run every rank's plan as one all-to-all in this process; return each rank's received keys."""
    plans = [plan_kv_exchange(batch.cu_seqlens, batch.cu_seqlens_padded, cp, r, mask=mask, layout=layout)
             for r in range(cp)]  # fmt: skip
    owned = [partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, r, layout=layout) for r in range(cp)]
    sent = []  # sent[s][d]: global positions rank s sends rank d
    for s, plan in enumerate(plans):
        rows = np.split(plan.send_index, np.cumsum(plan.send_counts)[:-1])
        sent.append([owned[s].numpy()[r] for r in rows])
    received = []
    for d, plan in enumerate(plans):
        arrived = np.concatenate([sent[s][d] for s in range(cp)])
        assert [len(sent[s][d]) for s in range(cp)] == list(plan.recv_counts)
        received.append(arrived[plan.recv_order])
        assert np.array_equal(received[-1], plan.key_positions)
    return plans


@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=5),
    mask=mask_strategy,
    cp=st.sampled_from([2, 3, 4]),
    layout=st.sampled_from(list(CpLayout)),
)
@settings(max_examples=60, deadline=None)
@pytest.mark.slow
def test_exchange_brings_exactly_the_keys_in_reach(lengths, mask, cp, layout):
    causal, window = mask
    batch = make_pack(lengths, pad_multiple_for(cp))
    m = attention_mask(causal, window)
    plans = simulate_exchange(batch, cp, layout, m)
    allowed = brute_force_mask(batch, causal, window)
    q, k, v = (t.detach() for t in qkv(batch.num_tokens, 2, 1))
    real, padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    for rank, plan in enumerate(plans):
        idx = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, rank, layout=layout)
        needed = np.flatnonzero(allowed[idx].any(dim=0).numpy())  # keys some query of this rank attends
        assert np.array_equal(plan.key_positions, needed)  # nothing missing, nothing extra
        keys = torch.from_numpy(plan.key_positions)
        out = attend(q[idx], k[keys], v[keys], real, padded, mask=m, scale=0.5, cp_size=cp, cp_rank=rank,
                     layout=layout, key_positions=plan.key_positions)  # fmt: skip
        full = thd_attention(q[idx], k, v, batch.cu_seqlens, batch.cu_seqlens_padded, cp_size=cp, cp_rank=rank,
                             softmax_scale=0.5, causal=causal, window=window, cp_layout=layout)  # fmt: skip
        assert torch.equal(out, full)


def test_traffic_counts_what_the_plans_receive_and_saves_with_windows():
    batch = make_pack([64, 17, 40, 3, 120], pad_multiple=8)
    for layout in CpLayout:
        for causal, window in [(True, None), (True, (8, 0)), (False, None)]:
            m = attention_mask(causal, window)
            traffic = kv_exchange_traffic(batch.cu_seqlens, batch.cu_seqlens_padded, 4, causal=causal, window=window,
                                          layout=layout, num_kv_heads=2, head_dim=16, element_size=2)  # fmt: skip
            assert traffic.bytes_per_row == 2 * 2 * 16 * 2
            assert traffic.rows_all_gather == 3 * batch.num_tokens // 4
            for rank in range(4):
                plan = plan_kv_exchange(batch.cu_seqlens, batch.cu_seqlens_padded, 4, rank, mask=m, layout=layout)
                assert traffic.rows_received[rank] == sum(plan.recv_counts) - plan.recv_counts[rank]
            assert traffic.bytes <= traffic.bytes_all_gather
            if window is not None:
                assert traffic.saving > 0.5, (layout, window, traffic.saving)  # a window of 8 needs little
    contiguous_window = kv_exchange_traffic(batch.cu_seqlens, batch.cu_seqlens_padded, 4, window=(8, 0),
                                            layout="contiguous")  # fmt: skip
    # Contiguous + a window of 8: each rank needs at most 8 keys per sequence from its left neighbour.
    assert max(contiguous_window.rows_received) <= 8 * 5


def test_keys_in_reach_of_a_hand_example():
    # One sequence of 8 real tokens, cp=2 dualchunk: rank 0 holds 0,1 and 6,7; rank 1 holds 2..5.
    need = keys_in_reach([0, 8], [0, 8], 2, CpLayout.DUALCHUNK, AttentionMask(1, 0))
    assert need[0].nonzero()[0].tolist() == [0, 1, 5, 6, 7]
    assert need[1].nonzero()[0].tolist() == [1, 2, 3, 4, 5]
    need = keys_in_reach([0, 6], [0, 8], 2, CpLayout.CONTIGUOUS, AttentionMask(-1, 0))  # 2 pads at the end
    assert need[0].nonzero()[0].tolist() == [0, 1, 2, 3] and need[1].nonzero()[0].tolist() == [0, 1, 2, 3, 4, 5]


# --- masks: arguments and blocks --------------------------------------------------------------


def test_attention_mask_arguments():
    assert attention_mask().window_size == (-1, 0) and attention_mask(False).window_size == (-1, -1)
    assert attention_mask(True, (128, 0)).sliding and not attention_mask(False, None).sliding
    assert attention_mask(False, (4, 0)).causal and attention_mask(False, (4, 0)).te_mask_type == "padding_causal"
    assert attention_mask(False, [2, 3]).te_mask_type == "padding"
    with pytest.raises(ConfigError, match=r"causal=True takes window=\(left, 0\).*got window=\(4, 4\)"):
        attention_mask(True, (4, 4))
    with pytest.raises(
        ConfigError, match=r"window\[0\] must be -1 \(unbounded\) or an integer 0 <= w <= 2147483647, got -2"
    ):
        attention_mask(False, (-2, 0))
    with pytest.raises(SeqpackTypeError, match="window must be None or a pair"):
        attention_mask(True, 128)
    with pytest.raises(SeqpackTypeError, match="window must be None or a pair"):
        attention_mask(True, (1, 2, 3))
    with pytest.raises(SeqpackTypeError, match="causal must be True or False"):
        attention_mask("yes")
    with pytest.raises(SeqpackTypeError, match=r"window\[1\] must be an integer"):
        attention_mask(False, (1, 2.5))
    with pytest.raises(ConfigError, match="causal=True takes"):
        ThdAttention(2, 4, backend="torch", window=(3, 3))


@pytest.mark.parametrize("bound", [2**31, 2**62, 2**63, 2**64])
def test_a_window_past_int32_is_refused_where_it_enters(bound):
    # (2**64, 0) was accepted here and failed later in the forward pass with "OverflowError:
    # Python int too large to convert to C long" (key_range's numpy arithmetic).
    message = rf"window\[0\] must be -1 \(unbounded\) or an integer 0 <= w <= 2147483647, got {bound}"
    with pytest.raises(ConfigError, match=message):
        attention_mask(True, (bound, 0))
    with pytest.raises(ConfigError, match=message):
        ThdAttention(2, 4, backend="torch", window=(bound, 0))
    q = torch.randn(6, 2, 4)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    with pytest.raises(ConfigError, match=message):
        thd_attention(q, q, q, cu, cu, window=(bound, 0))
    with pytest.raises(ConfigError, match=message.replace("0\\]", "1\\]")):
        attention_mask(False, (0, bound))


def test_the_widest_window_runs_and_is_the_unbounded_mask():
    q, k, v = (torch.randn(7, 2, 4, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    widest = thd_attention(q, k, v, cu, cu, causal=False, window=(2**31 - 1, 2**31 - 1))
    torch.testing.assert_close(widest, thd_attention(q, k, v, cu, cu, causal=False))


@given(
    q_start=st.integers(0, 20), num_q=st.integers(1, 12), k_start=st.integers(0, 20), num_k=st.integers(1, 12),
    left=st.integers(-1, 8), right=st.integers(-1, 8),
)  # fmt: skip
@pytest.mark.slow
def test_block_mask_matches_its_definition(q_start, num_q, k_start, num_k, left, right):
    mask = AttentionMask(left, right)
    got = block_mask(q_start, num_q, k_start, num_k, mask, torch.device("cpu"))
    rel = (torch.arange(num_k) + k_start)[None, :] - (torch.arange(num_q) + q_start)[:, None]
    expected = ((left < 0) | (rel >= -left)) & ((right < 0) | (rel <= right))
    assert torch.equal(torch.ones_like(expected) if got is None else got, expected)


@pytest.mark.processes
def test_benchmark_prints_the_traffic_table():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "benchmarks/compute.py", "--traffic-only", "--traffic-tokens", "16384", "--cp", "4"],
        cwd=root, capture_output=True, text=True, check=True, env={"PYTHONPATH": str(root), "PATH": ""},
    ).stdout  # fmt: skip
    rows = [line.split() for line in out.splitlines() if line.startswith(("causal", "window", "bidirectional"))]
    assert len(rows) == 8 and {row[-5] for row in rows} == {"dualchunk", "contiguous"}
    saved = {(" ".join(row[:-5]), row[-5]): float(row[-2].rstrip("%")) for row in rows}
    assert saved[("window 128", "contiguous")] > saved[("window 4096", "contiguous")] > saved[("causal", "contiguous")]


@pytest.mark.parametrize("layout", list(CpLayout))
@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.slow
def test_windowed_blocks_with_exchanged_keys(monkeypatch, cp, layout):
    """Windows cut long pieces into many query blocks, each finding its key run among the
    exchanged keys by position; all of it against the brute force, forward and backward."""
    from seqpack.compute.attention import reference

    monkeypatch.setattr(reference, "MIN_WINDOW_ROWS", 3)  # blocks of a few rows
    calls = []
    real_sdpa = reference.F.scaled_dot_product_attention
    monkeypatch.setattr(
        reference.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real_sdpa(*a, **kw)
    )
    batch = make_pack([61, 33, 1, 18], pad_multiple_for(cp))
    real, padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    for causal, window in [(True, (5, 0)), (False, (3, 7)), (True, (0, 0))]:
        m = attention_mask(causal, window)
        q, k, v = qkv(batch.num_tokens, 4, 2, seed=cp)
        ref = brute_force(q, k, v, batch, causal, window)
        gy = torch.randn(ref.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
        ref_grads = torch.autograd.grad(ref, (q, k, v), gy)
        grads = [torch.zeros_like(t) for t in (q, k, v)]
        for rank in range(cp):
            plan = plan_kv_exchange(batch.cu_seqlens, batch.cu_seqlens_padded, cp, rank, mask=m, layout=layout)
            idx = partition_indices(batch.cu_seqlens_padded, batch.num_tokens, cp, rank, layout=layout)
            keys = torch.from_numpy(plan.key_positions)
            q_local = q.detach()[idx].requires_grad_()
            k_keys, v_keys = k.detach()[keys].requires_grad_(), v.detach()[keys].requires_grad_()
            out = attend(q_local, k_keys, v_keys, real, padded, mask=m, scale=0.5, cp_size=cp, cp_rank=rank,
                         layout=layout, key_positions=plan.key_positions)  # fmt: skip
            assert max_err(out, ref[idx]) < 1e-12, (causal, window, rank)
            gq, gk, gv = torch.autograd.grad(out, (q_local, k_keys, v_keys), gy[idx])
            grads[0][idx] += gq
            grads[1][keys] += gk  # what the exchange's backward returns to the owners
            grads[2][keys] += gv
        for a, b in zip(grads, ref_grads, strict=True):
            assert max_err(a, b) < 1e-12, (causal, window)
    assert len(calls) > 20 * cp  # not vacuous: many blocks per piece
