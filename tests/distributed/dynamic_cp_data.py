"""Data and a probe model for the dynamic-CP gloo tests (tests/distributed/test_dynamic_cp_dist.py).

Every DP rank reads ``SPR`` short sequences a step; DP rank 0's first sample of every step
is one long sequence of 3.5x a rank's capacity (``LONG``), so it needs a CP group of at
least 4 ranks. Labels are next-token targets with a random prompt masked; every fifth
sample has a ``loss_mask`` with zeros.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.cost import CostModel
from seqpack.thd import IGNORE_INDEX, PackedBatch

CAPACITY = 64  # max_tokens_per_rank
LONG = 224  # 3.5 x CAPACITY
SPR = 6  # samples per DP rank per step
VOCAB = 64
# Cost per token (and a little attention) with a small cost per ring step: the long sequence
# spreads wide, short ones are packed alone.
GROUP_COST = CostModel(1.0, 1e-3, 0.0, ring_step=0.5, ring_token=2e-3, reference_size=1)
# A costly ring step: a group no wider than a sequence needs.
NARROW_COST = CostModel(1.0, 1e-3, 0.0, ring_step=30.0, reference_size=1)
LAYOUTS = {"dp4": (("dp", 4),), "dp2cp2": (("dp", 2), ("cp", 2))}


def sample(rng: np.random.Generator, length: int, masked: bool) -> dict[str, torch.Tensor]:
    ids = torch.from_numpy(rng.integers(0, VOCAB, length))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:-1] = ids[1:]
    labels[: int(rng.integers(0, length // 3 + 1))] = IGNORE_INDEX  # the prompt
    mask = (rng.random(length) > 0.2) if masked else np.ones(length, dtype=bool)
    return {"input_ids": ids, "labels": labels, "loss_mask": torch.from_numpy(mask.astype(np.float32))}


def samples_of(dp_rank: int, steps: int = 1, seed: int = 3, long: int = LONG) -> list[dict[str, torch.Tensor]]:
    """DP rank ``dp_rank``'s samples for ``steps`` steps (``SPR`` per step; the first of DP
    rank 0's is ``long`` tokens)."""
    rng = np.random.default_rng([seed, dp_rank])
    out = []
    for step in range(steps):
        for i in range(SPR):
            first = dp_rank == 0 and i == 0
            length = long - 7 * step if first else int(rng.integers(3, 41))
            out.append(sample(rng, length, masked=i % 5 == 4))
    return out


class Probe(nn.Module):
    """Embedding -> attention (GQA) -> Mamba2 -> projection, fp64: a microbatch's outputs
    and parameter gradients, for comparing CP shards with the whole pack."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, 16)
        self.qkv = nn.Linear(16, 16 + 2 * 8, bias=False)
        self.attn = ThdAttention(4, 4, num_kv_heads=2, backend="torch")
        self.mamba = Mamba2Mixer(16, d_state=8, headdim=4, backend="torch")
        self.double()

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.embed(batch.input_ids)  # (T, 16)
        q, k, v = self.qkv(x).split([16, 8, 8], dim=-1)
        t = x.shape[0]
        x = x + self.attn(q.view(t, 4, 4), k.view(t, 2, 4), v.view(t, 2, 4), batch).reshape(t, 16)
        return x + self.mamba(x, batch)  # (T, 16)

    def loss(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """Outputs of this rank's tokens, and the gradients of a loss over its real tokens."""
        self.zero_grad()
        out = self(batch)
        weight = torch.arange(1, 17, dtype=torch.float64) / 16
        (((out * weight) ** 2).sum(dim=-1) * (~batch.padding_mask)).sum().backward()
        grads = {name: p.grad.detach().numpy().copy() for name, p in self.named_parameters() if p.grad is not None}
        return out.detach(), grads
