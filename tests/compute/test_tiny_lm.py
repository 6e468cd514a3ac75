import pytest
import torch

from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.thd import pack_sequences


def _batch(lengths, seed=0, pad_multiple=4):
    g = torch.Generator().manual_seed(seed)
    return pack_sequences(
        [{"input_ids": torch.randint(1, 256, (n,), generator=g)} for n in lengths], pad_multiple=pad_multiple
    )


@pytest.mark.slow
def test_tiny_lm_trains_and_isolates_sequences():
    torch.manual_seed(0)
    model = TinyHybridLM(
        TinyConfig(d_model=32, pattern="AM", num_heads=2, num_kv_heads=1, d_state=8, mamba_headdim=8)
    ).double()
    batch = _batch([9, 1, 14, 5])
    logits = model(batch)
    assert logits.shape == (batch.num_tokens, 256)
    # Changing sequence 2 leaves the logits of the other sequences untouched.
    other = _batch([9, 1, 14, 5])
    seq2 = other.seq_idx == 2
    other.input_ids[seq2 & ~other.padding_mask] = 7
    changed = model(other)
    keep = (batch.seq_idx != 2) & ~batch.padding_mask
    assert torch.equal(logits[keep], changed[keep])
    assert not torch.allclose(logits[seq2 & ~batch.padding_mask], changed[seq2 & ~batch.padding_mask])
    # A few optimizer steps on one batch reduce its loss.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(8):
        total, count = model.loss_sum(batch)
        loss = total / count
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < first - 0.1
    assert count == batch.loss_mask.sum() and count > 0


def test_tiny_config_validation():
    with pytest.raises(ValueError, match="pattern"):
        TinyConfig(pattern="AX")
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        TinyConfig(d_model=30, num_heads=4)
