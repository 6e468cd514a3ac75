"""A Transformer Engine THD attention layer captured once as a CUDA graph and replayed over 50
fixed-shape packs of one bucket (seqpack.thd.StaticShapes): each pack's tokens and offsets
are copied into the graph's static buffers, and every replay's output equals eager TE on the
same pack. The GPU test is skipped without CUDA and Transformer Engine; the packs it replays
are checked here on the CPU.

Two ways to keep TE's ``pad_between_seqs`` (a Python branch baked into the graph) fixed:
``te_kwargs(padded_as_real=True)`` (one offsets tensor for all four ``cu_seqlens``; pads
attended as real tokens of their sequence, exact for causal attention; every backend) and
``pad_between_seqs=True`` with real and padded offsets apart (Megatron-LM's choice for THD
CUDA graphs; FusedAttention).
"""

from __future__ import annotations

import pytest
import torch

from seqpack.compute import backends
from seqpack.mock_data import lognormal_lengths
from seqpack.thd import PackedBatch, StaticShapes, pack_sequences

BUCKET = 4096
SHAPES = StaticShapes(token_buckets=(BUCKET,), max_sequences=48)
HEADS, HEAD_DIM = 8, 64
NUM_PACKS = 50


def one_bucket_packs(num_packs: int = NUM_PACKS, seed: int = 0) -> list[PackedBatch]:
    """``num_packs`` packs next-fit from a lognormal stream into one bucket (pad multiple 8)."""
    lengths = lognormal_lengths(num_packs * 64, min_seq_len=1, max_seq_len=BUCKET // 2, mean_seq_len=400, seed=seed)
    g = torch.Generator().manual_seed(seed)
    packs, current, used = [], [], 0
    for n in lengths.tolist():
        padded = -(-n // 8) * 8
        if used + padded > BUCKET or len(current) == SHAPES.max_real_sequences:
            packs.append(pack_sequences(current, pad_multiple=8, static_shapes=SHAPES))
            if len(packs) == num_packs:
                return packs
            current, used = [], 0
        current.append({"input_ids": torch.randint(1, 1000, (n,), generator=g)})
        used += padded
    raise AssertionError("the length stream ran out")


def test_cuda_graph_packs_share_one_shape():
    packs = one_bucket_packs()
    assert len(packs) == NUM_PACKS
    for batch in packs:
        assert batch.num_tokens == BUCKET and batch.max_seqlen == BUCKET
        assert batch.cu_seqlens.shape == batch.cu_seqlens_padded.shape == (SHAPES.max_sequences + 1,)
        assert int(batch.cu_seqlens_padded[-1]) == BUCKET  # the tail belongs to a sequence
    # Not vacuous: the packs differ in sequence count and real tokens, and carry tails.
    assert len({b.num_sequences - int((b.sample_ids < 0).sum()) for b in packs}) > 3
    assert len({b.num_real_tokens for b in packs}) > 10 and all(b.num_real_tokens < BUCKET for b in packs)


HAS_TE = torch.cuda.is_available() and backends.import_te_attention().ok


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TE, reason="needs CUDA and Transformer Engine")
@pytest.mark.parametrize("mode", ["padded_as_real", "pad_between_seqs"])
def test_te_thd_attention_replays_as_a_cuda_graph(mode):
    from transformer_engine.pytorch import DotProductAttention

    device = torch.device("cuda")
    attn = DotProductAttention(HEADS, HEAD_DIM, qkv_format="thd", attn_mask_type="padding_causal").to(device)
    packs = one_bucket_packs()
    g = torch.Generator().manual_seed(1)
    inputs = [
        tuple(torch.randn(BUCKET, HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16) for _ in range(3))
        for _ in packs
    ]

    # Static buffers: the graph reads these; every replay copies a pack into them.
    q, k, v = (torch.zeros(BUCKET, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16) for _ in range(3))
    cu_padded = packs[0].cu_seqlens_padded.to(device)
    cu_real = cu_padded if mode == "padded_as_real" else packs[0].cu_seqlens.to(device)

    def kwargs(real: torch.Tensor, padded: torch.Tensor) -> dict:
        return {
            "cu_seqlens_q": real, "cu_seqlens_kv": real, "cu_seqlens_q_padded": padded,
            "cu_seqlens_kv_padded": padded, "max_seqlen_q": BUCKET, "max_seqlen_kv": BUCKET,
            "pad_between_seqs": mode == "pad_between_seqs",
        }  # fmt: skip

    def load(i: int) -> None:
        for buffer, value in zip((q, k, v), inputs[i], strict=True):
            buffer.copy_(value)
        cu_padded.copy_(packs[i].cu_seqlens_padded)
        if cu_real is not cu_padded:
            cu_real.copy_(packs[i].cu_seqlens)

    with torch.no_grad():
        load(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the graph (workspaces, backend choice)
            for _ in range(3):
                attn(q, k, v, **kwargs(cu_real, cu_padded))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = attn(q, k, v, **kwargs(cu_real, cu_padded))

        for i, batch in enumerate(packs):
            load(i)
            graph.replay()
            real = batch.cu_seqlens.to(device)
            padded = batch.cu_seqlens_padded.to(device)
            eager = attn(*inputs[i], **kwargs(padded if mode == "padded_as_real" else real, padded))
            keep = ~batch.padding_mask.to(device)  # pad rows are nobody's output
            assert torch.equal(out.view(BUCKET, -1)[keep], eager.view(BUCKET, -1)[keep]), f"pack {i}"
            assert bool(torch.isfinite(out.view(BUCKET, -1)[keep]).all()), f"pack {i}"
