"""Transformer Engine's mask arguments and CP rules, checked in pure Python (no TE, no GPU)."""

import sys
import types

import pytest
import torch

from seqpack.compute.attention import ThdAttention, attention_mask, check_te_rules
from seqpack.compute.attention.te import check_te_batch, te_forward_kwargs, te_rule_violation
from seqpack.errors import ConfigError
from seqpack.options import CpCommType, CpLayout
from seqpack.thd import pack_sequences, shard_for_cp

CAUSAL, BIDIRECTIONAL = attention_mask(True), attention_mask(False)
SLIDING, TWO_SIDED = attention_mask(True, (128, 0)), attention_mask(False, (64, 32))


@pytest.mark.parametrize(
    "mask, cp, comm, heads, kv_heads, a2a, layout, problem",
    [
        # Causal and bidirectional masks work with every comm type (REFERENCE: TE main).
        *[(m, 4, c, 8, 4, 2, None, None) for m in (CAUSAL, BIDIRECTIONAL) for c in CpCommType],
        # A real window only with all_gather or a2a.
        (SLIDING, 4, CpCommType.ALL_GATHER, 8, 4, None, None, None),
        (SLIDING, 4, CpCommType.A2A, 8, 4, None, None, None),
        (TWO_SIDED, 4, CpCommType.ALL_GATHER, 8, 4, None, None, None),
        (SLIDING, 4, CpCommType.P2P, 8, 4, None, None, "does not support a sliding window"),
        (TWO_SIDED, 2, CpCommType.P2P, 8, 4, None, None, "does not support a sliding window"),
        (SLIDING, 4, CpCommType.A2A_P2P, 8, 4, 2, None, "does not support a sliding window"),
        (attention_mask(True, (0, 0)), 2, CpCommType.P2P, 8, 4, None, None, "does not support a sliding window"),
        (SLIDING, 1, CpCommType.P2P, 8, 4, None, None, None),  # no CP, no comm rule
        # a2a splits heads: heads and GQA groups divisible by cp (a2a+p2p: by the a2a group).
        (CAUSAL, 4, CpCommType.A2A, 6, 2, None, None, "num_heads=6 and num_kv_heads=2 are not both divisible by 4"),
        (CAUSAL, 4, CpCommType.A2A, 8, 2, None, None, "not both divisible by 4"),
        (CAUSAL, 4, CpCommType.A2A_P2P, 6, 2, 2, None, None),
        (CAUSAL, 4, CpCommType.A2A_P2P, 6, 3, 2, None, "splits heads over 2 ranks"),
        (CAUSAL, 4, CpCommType.P2P, 6, 3, None, None, None),
        # Non-causal windows bound both sides or neither.
        (attention_mask(False, (-1, 3)), 1, CpCommType.P2P, 8, 4, None, None, "bound both sides or neither"),
        (attention_mask(False, (3, -1)), 2, CpCommType.ALL_GATHER, 8, 4, None, None, "bound both sides"),
        # TE shards THD under CP with DualChunkSwap only.
        (CAUSAL, 2, CpCommType.P2P, 8, 4, None, CpLayout.CONTIGUOUS, "DualChunkSwap only"),
        (CAUSAL, 1, CpCommType.P2P, 8, 4, None, CpLayout.CONTIGUOUS, None),
        (CAUSAL, 2, CpCommType.P2P, 8, 4, None, CpLayout.DUALCHUNK, None),
    ],
)
def test_te_rules(mask, cp, comm, heads, kv_heads, a2a, layout, problem):
    why = te_rule_violation(
        mask, cp_size=cp, cp_comm_type=comm, num_heads=heads, num_kv_heads=kv_heads, a2a_size=a2a, cp_layout=layout
    )
    assert (why is None) if problem is None else (problem in why), why


@pytest.mark.parametrize(
    "mask, comm, heads, kv_heads, expected",
    [
        (SLIDING, "p2p", 8, 4, r"cp_comm_type='p2p' does not support a sliding window \(window=\(128, 0\)\) under CP "
                               r"\(cp_comm_type='p2p'; cp_comm_type choices that work here: \('all_gather', 'a2a'\)\); "
                               r"or use backend='torch'"),
        (SLIDING, "p2p", 6, 6, r"choices that work here: \('all_gather',\)"),  # a2a would split 6 heads over 4
        (CAUSAL, "a2a", 6, 2, r"\(cp_comm_type='a2a'; cp_comm_type choices that work here: \('p2p', 'all_gather'\)\)"),
        (SLIDING, "a2a", 6, 6, r"cp_comm_type choices that work here: \('all_gather',\)"),
    ],
)  # fmt: skip
def test_check_te_rules_names_the_comm_type_and_the_choices_that_work(mask, comm, heads, kv_heads, expected):
    with pytest.raises(ConfigError, match=expected):
        check_te_rules(mask, cp_size=4, cp_comm_type=CpCommType(comm), num_heads=heads, num_kv_heads=kv_heads)


def test_check_te_rules_with_no_working_choice():
    with pytest.raises(ConfigError, match=r"no cp_comm_type works here\); or use backend='torch'"):
        check_te_rules(CAUSAL, cp_size=2, cp_comm_type=CpCommType.P2P, num_heads=2, num_kv_heads=2,
                       cp_layout=CpLayout.CONTIGUOUS)  # fmt: skip


def test_te_mask_arguments():
    assert (CAUSAL.te_mask_type, CAUSAL.window_size) == ("padding_causal", (-1, 0))
    assert (BIDIRECTIONAL.te_mask_type, BIDIRECTIONAL.window_size) == ("padding", (-1, -1))
    assert (SLIDING.te_mask_type, SLIDING.window_size) == ("padding_causal", (128, 0))
    assert (TWO_SIDED.te_mask_type, TWO_SIDED.window_size) == ("padding", (64, 32))


def test_te_batch_checks():
    batch = pack_sequences([{"input_ids": torch.arange(1, 7)}], pad_multiple=2)
    check_te_batch(batch)  # no CP: anything goes
    with pytest.raises(ConfigError, match=r"backend='te' under CP needs the dualchunk layout.*'contiguous'"):
        check_te_batch(shard_for_cp(batch, 2, 0, layout="contiguous"))
    # A dualchunk shard whose offsets were changed afterwards (e.g. by hand): refused before TE.
    shard = shard_for_cp(pack_sequences([{"input_ids": torch.arange(1, 9)}], pad_multiple=4), 2, 0)
    shard.cu_seqlens_padded = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(ConfigError, match=r"cu_seqlens_padded\[1\]=6 is not divisible by 2\*cp_size=4"):
        check_te_batch(shard)


def test_forward_kwargs_give_non_causal_masks_the_real_lengths():
    tail_only = pack_sequences([{"input_ids": torch.arange(1, 4)}, {"input_ids": torch.arange(1, 5)}], pad_to=10)
    causal = te_forward_kwargs(tail_only, CAUSAL)
    assert causal["cu_seqlens_q"] is causal["cu_seqlens_q_padded"] and causal["pad_between_seqs"] is False
    assert causal["attn_mask_type"] == "padding_causal" and causal["qkv_format"] == "thd"
    both = te_forward_kwargs(tail_only, BIDIRECTIONAL)  # the tail's pads must not be attended
    assert torch.equal(both["cu_seqlens_q"], tail_only.cu_seqlens) and both["pad_between_seqs"] is True
    assert torch.equal(both["cu_seqlens_kv_padded"], tail_only.cu_seqlens_padded)
    assert both["attn_mask_type"] == "padding"
    no_pads = pack_sequences([{"input_ids": torch.arange(1, 4)}])
    plain = te_forward_kwargs(no_pads, BIDIRECTIONAL)
    assert plain["cu_seqlens_q"] is plain["cu_seqlens_q_padded"] and plain["pad_between_seqs"] is False


# --- the module, with a stand-in TE ------------------------------------------------------------


class FakeTE(torch.nn.Module):
    """Records its construction and calls; computes like TE would, from the arguments it got."""

    instances = []

    def __init__(self, **kwargs):
        super().__init__()
        self.init, self.calls = kwargs, []
        FakeTE.instances.append(self)

    def forward(self, q, k, v, **kwargs):
        from seqpack.compute.attention import thd_attention

        self.calls.append(kwargs)
        causal = kwargs["attn_mask_type"] == "padding_causal"
        out = thd_attention(q, k, v, kwargs["cu_seqlens_q"], kwargs["cu_seqlens_q_padded"], causal=causal,
                            window=self.init["window_size"])  # fmt: skip
        return out.reshape(q.shape[0], -1)


@pytest.fixture
def fake_te(monkeypatch):
    FakeTE.instances = []
    te, te_pt = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.pytorch")
    te_pt.DotProductAttention = FakeTE
    te.pytorch = te_pt
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pt)
    return FakeTE


@pytest.mark.parametrize("causal, window", [(True, (2, 0)), (False, None), (False, (1, 2))])
def test_te_backend_gets_the_mask_and_matches_the_reference(fake_te, causal, window):
    batch = pack_sequences([{"input_ids": torch.arange(1, 6)}, {"input_ids": torch.arange(1, 4)}], pad_to=11)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(11, 2, 4, dtype=torch.float64, generator=g) for _ in range(3))
    out = ThdAttention(2, 4, backend="te", causal=causal, window=window)(q, k, v, batch)
    (dpa,) = fake_te.instances
    mask = attention_mask(causal, window)
    assert dpa.init["attn_mask_type"] == mask.te_mask_type and dpa.init["window_size"] == mask.window_size
    assert dpa.calls[0]["attn_mask_type"] == mask.te_mask_type
    ref = ThdAttention(2, 4, backend="torch", causal=causal, window=window)(q, k, v, batch)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_auto_on_cuda_checks_the_rules_when_it_builds_te(fake_te, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="bound both sides or neither"):
        ThdAttention(2, 4, backend="auto", causal=False, window=(-1, 3))
    assert fake_te.instances == []
    ThdAttention(2, 4, backend="torch", causal=False, window=(-1, 3))  # the reference runs every mask


def test_te_rules_come_before_the_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # TE absent
    with pytest.raises(ConfigError, match="bound both sides or neither") as info:
        ThdAttention(2, 4, backend="te", causal=False, window=(3, -1))
    assert not isinstance(info.value, ImportError)


@pytest.mark.parametrize("key", ["window_size", "attn_mask_type", "qkv_format", "num_gqa_groups"])
def test_te_options_cannot_override_the_mask_or_sizes(key):
    with pytest.raises(ConfigError, match=f"te_options may not set '{key}'"):
        ThdAttention(2, 4, backend="torch", te_options={key: None})
