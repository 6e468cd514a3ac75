"""The brute-force masked attention reference: a T x T mask built token pair by token pair."""

import math

import torch

from seqpack.compute.attention import attention_mask


def brute_force_mask(batch, causal=True, window=None):
    """bool [T, T]: query i sees key j when both are real tokens of one sequence and
    ``-left <= pos_j - pos_i <= right`` (-1 unbounded), written out pair by pair."""
    left, right = attention_mask(causal, window).window_size
    seq, pad, pos = batch.seq_idx.tolist(), batch.padding_mask.tolist(), batch.position_ids.tolist()
    T = len(seq)
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            if seq[i] != seq[j] or pad[i] or pad[j]:
                continue
            offset = pos[j] - pos[i]  # key minus query, inside one sequence
            allowed[i, j] = (left < 0 or offset >= -left) and (right < 0 or offset <= right)
    return allowed


def brute_force(q, k, v, batch, causal=True, window=None):
    """softmax(q k^T / sqrt(D)) v over the whole pack with that mask; all-masked (pad) rows are 0."""
    allowed = brute_force_mask(batch, causal, window)
    group = q.shape[1] // k.shape[1]
    kh, vh = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q, kh) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
    return torch.einsum("hts,shd->thd", probs, vh)
