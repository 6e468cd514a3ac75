"""Slow, obvious references that the fast paths are checked against."""

from __future__ import annotations

from itertools import pairwise

import torch

IGNORE = -100


def pack_reference(samples, pad_multiple=1, pad_to=None, pad_token_id=0):
    """Per-sequence, per-token loop version of pack_sequences."""
    out = {k: [] for k in ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask")}
    cu, cu_padded = [0], [0]
    for i, s in enumerate(samples):
        ids = [int(v) for v in s["input_ids"]]
        n = len(ids)
        labels = [int(v) for v in s["labels"]] if s.get("labels") is not None else ids[1:] + [IGNORE]
        mask = (
            [float(v) for v in s["loss_mask"]]
            if s.get("loss_mask") is not None
            else [float(label != IGNORE) for label in labels]
        )
        pos = [int(v) for v in s["position_ids"]] if s.get("position_ids") is not None else list(range(n))
        padded = -(-n // pad_multiple) * pad_multiple
        if pad_to is not None and i == len(samples) - 1:
            used = cu_padded[-1] + padded
            padded += pad_to - used
        for t in range(padded):
            real = t < n
            out["input_ids"].append(ids[t] if real else pad_token_id)
            out["labels"].append(labels[t] if real else IGNORE)
            out["loss_mask"].append(mask[t] if real else 0.0)
            out["position_ids"].append(pos[t] if real else pos[-1] + (t - n + 1))
            out["seq_idx"].append(i)
            out["padding_mask"].append(not real)
        cu.append(cu[-1] + n)
        cu_padded.append(cu_padded[-1] + padded)
    return out, cu, cu_padded


def te_partition_reference(cu_seqlens_padded, total_tokens, cp_size, cp_rank):
    """Token-by-token transcription of TE's thd_partition_indices_kernel."""
    cu_s = [int(c) // cp_size for c in cu_seqlens_padded]
    batch = len(cu_s) - 1
    out = []
    for token in range(total_tokens // cp_size):
        # binary_search: last i in [0, batch) with cu_s[i] <= token
        seq = 0
        for i in range(1, batch + 1):
            if cu_s[i] <= token and i < batch:
                seq = i
        seq_len = cu_s[seq + 1] - cu_s[seq]
        index = token - cu_s[seq]
        offset = cp_rank if index < seq_len // 2 else (cp_size - 1) * 2 - cp_rank
        out.append(index + cu_s[seq] * cp_size + seq_len // 2 * offset)
    return torch.tensor(out, dtype=torch.int64)


def dualchunk_reference(cu_seqlens_padded, cp_size, cp_rank):
    """DualChunkSwap from its definition: rank r holds chunks r and 2cp-1-r of every sequence."""
    out = []
    for start, end in pairwise(cu_seqlens_padded):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
    return torch.tensor(out, dtype=torch.int64)


def nnls_kkt_violation(features, y, coef, weights=None):
    """How far ``coef`` is from the KKT conditions of ``min ||W^(1/2)(X c - y)||^2, c >= 0``:
    ``c >= 0``, gradient ``g = X^T W (X c - y) >= 0``, and ``g_j = 0`` where ``c_j > 0``.
    The conditions characterise the optimum exactly (the problem is convex), so a fit that
    satisfies them is the NNLS solution. Returns the worst violation relative to
    ``||X_j|| ||y||`` per column (0 at the optimum)."""
    import numpy as np

    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    grad = x.T @ (w * (x @ coef - y))
    norm = np.sqrt((w[:, None] * x * x).sum(axis=0)) * np.sqrt((w * y * y).sum())
    norm[norm == 0] = 1.0
    worst = 0.0
    for j in range(x.shape[1]):
        if coef[j] < 0:
            return float("inf")
        rel = grad[j] / norm[j]
        worst = max(worst, abs(rel) if coef[j] > 0 else max(0.0, -rel))
    return worst
