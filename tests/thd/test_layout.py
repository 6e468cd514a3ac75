"""token_layout / seq_idx_from_cu_seqlens against a per-token reference, on both kernels."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from naive import te_partition_reference

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.thd import TokenLayout, gather_order, partition_indices, seq_idx_from_cu_seqlens, token_layout
from seqpack.thd.layout import _layout_torch


def layout_reference(cu_padded, cu_real, total):
    """Token by token: find the slot holding t (skipping empty slots); past the last slot, the
    tail segment N."""
    n = len(cu_padded) - 1
    seq_idx, position, padding = [], [], []
    for t in range(total):
        seq = n
        for i in range(n):
            if cu_padded[i] <= t < cu_padded[i + 1]:
                seq = i
                break
        start = cu_padded[seq]  # for the tail: cu_padded[n]
        real = 0 if seq == n else (cu_padded[seq + 1] - start if cu_real is None else cu_real[seq + 1] - cu_real[seq])
        seq_idx.append(seq)
        position.append(t - start)
        padding.append(t - start >= real)
    return seq_idx, position, padding


def _offsets(pairs):
    cu_real, cu_padded = [0], [0]
    for real, pad in pairs:
        cu_real.append(cu_real[-1] + real)
        cu_padded.append(cu_padded[-1] + real + pad)
    return cu_real, cu_padded


def _check(cu_padded, cu_real, total):
    ref = layout_reference(cu_padded, cu_real, total)
    got = token_layout(
        torch.tensor(cu_padded, dtype=torch.int32),
        None if cu_real is None else np.array(cu_real),
        total_tokens=total,
    )
    assert isinstance(got, TokenLayout) and got.num_tokens == total
    assert got.seq_idx.dtype == torch.int32 and got.position.dtype == torch.int64
    assert got.padding_mask.dtype == torch.bool
    assert (got.seq_idx.tolist(), got.position.tolist(), got.padding_mask.tolist()) == ref
    # The torch kernel (what a GPU runs) gives the same on CPU.
    real = None if cu_real is None else torch.tensor(cu_real).diff()
    seq_idx, position, padding = _layout_torch(torch.tensor(cu_padded), real, total)
    assert (seq_idx.tolist(), position.tolist(), padding.tolist()) == ref
    assert seq_idx.dtype == torch.int32 and position.dtype == torch.int64
    # Mamba's seq_idx is the layout's, and was searchsorted(right=True) before.
    expected = torch.searchsorted(torch.tensor(cu_padded[1:]), torch.arange(total), right=True).to(torch.int32)
    assert torch.equal(seq_idx_from_cu_seqlens(torch.tensor(cu_padded), total), expected)
    assert expected.tolist() == ref[0]
    return ref


layouts = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=0, max_size=8)


@given(pairs=layouts, tail=st.integers(0, 5), cut=st.integers(0, 6), with_real=st.booleans())
@example(pairs=[(3, 1), (0, 0), (2, 0), (0, 3)], tail=2, cut=0, with_real=True)
@example(pairs=[], tail=4, cut=0, with_real=True)
@pytest.mark.slow
def test_token_layout_matches_reference(pairs, tail, cut, with_real):
    cu_real, cu_padded = _offsets(pairs)
    total = max(0, cu_padded[-1] + tail - cut)  # tail > 0: unclaimed tokens; cut: a prefix
    _check(cu_padded, cu_real if with_real else None, total)


@pytest.mark.slow
def test_token_layout_random_sweep_covers_every_case():
    rng = np.random.default_rng(0)
    seen = dict.fromkeys(["pads_between", "empty_slot", "all_pad_slot", "tail", "prefix", "real_only"], 0)
    for _ in range(300):
        n = int(rng.integers(0, 7))
        pairs = [(int(rng.integers(0, 5)), int(rng.integers(0, 3))) for _ in range(n)]
        cu_real, cu_padded = _offsets(pairs)
        total = max(0, cu_padded[-1] + int(rng.integers(-3, 4)))
        seq_idx, _, padding = _check(cu_padded, cu_real, total)
        seen["pads_between"] += any(padding[t] and seq_idx[t] < n - 1 for t in range(total))
        seen["empty_slot"] += any(r == 0 and p == 0 for r, p in pairs)
        seen["all_pad_slot"] += any(r == 0 and p > 0 for r, p in pairs)
        seen["tail"] += total > cu_padded[-1]
        seen["prefix"] += total < cu_padded[-1]
        seen["real_only"] += n > 0 and not any(padding)
    assert all(count > 10 for count in seen.values()), seen


def test_token_layout_documented_example():
    # Two sequences (3 real + 1 pad, 2 real), an empty one, then 2 unclaimed tokens.
    got = token_layout([0, 4, 6, 6], [0, 3, 5, 5], total_tokens=8)
    assert got.seq_idx.tolist() == [0, 0, 0, 0, 1, 1, 3, 3]
    assert got.position.tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    assert got.padding_mask.tolist() == [False, False, False, True, False, False, True, True]
    default = token_layout([0, 4, 6])
    assert default.num_tokens == 6 and not default.padding_mask.any()
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.seq_idx = got.position  # type: ignore[misc]


@given(
    cp=st.sampled_from([2, 3, 4, 8]),
    chunks=st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
@pytest.mark.slow
def test_partition_and_gather_order_match_te_with_empty_sequences(cp, chunks):
    cu = [0]
    for c in chunks:
        cu.append(cu[-1] + 2 * cp * c)
    expected = [te_partition_reference(cu, cu[-1], cp, rank) for rank in range(cp)]
    for rank in range(cp):
        assert torch.equal(partition_indices(torch.tensor(cu), cu[-1], cp, rank), expected[rank])
    assert torch.equal(gather_order(torch.tensor(cu), cu[-1], cp), torch.cat(expected))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (([0.0, 4.0],), {}, SeqpackTypeError, r"cu_seqlens_padded must hold integers, got dtype float64"),
        ((torch.tensor([0.0, 4.5]),), {}, SeqpackTypeError, r"cu_seqlens_padded must hold integers, got dtype"),
        (([0, 4], [0.0, 3.0]), {}, SeqpackTypeError, r"cu_seqlens must hold integers"),
        ((torch.tensor([True, False]),), {}, SeqpackTypeError, "must hold integers"),
        (("0,4",), {}, SeqpackTypeError, "must be a 1-D tensor, numpy array or list, got str"),
        ((torch.zeros(2, 2, dtype=torch.long),), {}, ConfigError, r"1-D with at least one entry, got shape \(2, 2\)"),
        (([],), {}, ConfigError, "at least one entry"),
        (([1, 4],), {}, ConfigError, "must start at 0 and never decrease"),
        (([0, 4, 3],), {}, ConfigError, "must start at 0 and never decrease"),
        (([0, 4, 6], [0, 5, 6]), {}, ConfigError, r"every real length must be in \[0, padded length\] \(sequence 0\)"),
        (([0, 4, 6], [0, 3, 2]), {}, ConfigError, r"\(sequence 1\)"),
        (([0, 4, 6], [0, 3]), {}, ConfigError, "cu_seqlens has 2 entries but cu_seqlens_padded has 3"),
        (([0, 4, 8], [1, 2, 3]), {}, ConfigError, r"cu_seqlens must start at 0, got \[1, 2, 3\]"),
        (([0, 4],), {"total_tokens": -1}, ConfigError, "total_tokens must be an integer >= 0, got -1"),
        (([0, 4],), {"total_tokens": 4.0}, SeqpackTypeError, "total_tokens must be an integer"),
    ],
)
def test_token_layout_rejects(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        token_layout(*args, **kwargs)


def test_seq_idx_from_cu_seqlens_rejects_float_offsets():
    with pytest.raises(SeqpackTypeError, match="cu_seqlens_padded must hold integers"):
        seq_idx_from_cu_seqlens(torch.tensor([0.0, 4.0]), 4)


def test_token_layout_accepts_every_integer_dtype():
    for dtype in (torch.int16, torch.int32, torch.int64, torch.uint8):
        got = token_layout(torch.tensor([0, 2, 5], dtype=dtype), torch.tensor([0, 1, 4], dtype=dtype))
        assert got.padding_mask.tolist() == [False, True, False, False, False]
    assert token_layout(np.array([0, 2], dtype=np.uint32)).seq_idx.tolist() == [0, 0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_token_layout_stays_on_the_gpu_and_matches_cpu():
    rng = np.random.default_rng(1)
    for _ in range(20):
        pairs = [(int(rng.integers(0, 300)), int(rng.integers(0, 9))) for _ in range(int(rng.integers(0, 40)))]
        cu_real, cu_padded = _offsets(pairs)
        total = cu_padded[-1] + int(rng.integers(0, 5))
        cpu = token_layout(torch.tensor(cu_padded), torch.tensor(cu_real), total_tokens=total)
        gpu = token_layout(
            torch.tensor(cu_padded, device="cuda"), torch.tensor(cu_real, device="cuda"), total_tokens=total
        )
        for name in ("seq_idx", "position", "padding_mask"):
            assert getattr(gpu, name).device.type == "cuda"
            assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
        seq_idx = seq_idx_from_cu_seqlens(torch.tensor(cu_padded, device="cuda", dtype=torch.int32), total)
        assert seq_idx.device.type == "cuda" and torch.equal(seq_idx.cpu(), cpu.seq_idx)
