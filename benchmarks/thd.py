"""Packing and CP-sharding speed: ~64K tokens in ~500 lognormal sequences.

Prints microseconds per 1K tokens for seqpack's vectorized paths and, side by side in the
same run, for straightforward per-sequence loops (pad each sequence with torch.cat; build
each sequence's layout with torch.full / arange; slice each sequence's two DualChunkSwap
chunks), which is how most training code does it.

    python benchmarks/thd.py [--tokens 65536] [--sequences 500] [--repeats 30]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from seqpack.thd import BATCH_TOKEN_FIELDS, pack_sequences, pad_multiple_for, shard_for_cp, token_layout


def make_samples(num_sequences: int, total_tokens: int, seed: int) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=0.0, sigma=1.0, size=num_sequences)
    lengths = np.maximum(1, np.round(raw / raw.sum() * total_tokens)).astype(np.int64)
    return [{"input_ids": torch.from_numpy(rng.integers(1, 32000, n))} for n in lengths]


def loop_pack(samples, pad_multiple):
    """Per-sequence loop: what a hand-written collator does."""
    ids, labels, pos, masks, cu = [], [], [], [], [0]
    for s in samples:
        x = s["input_ids"]
        n = x.numel()
        p = -(-n // pad_multiple) * pad_multiple
        pad = p - n
        ids.append(torch.cat([x, x.new_zeros(pad)]))
        lab = torch.cat([x[1:], x.new_full((1 + pad,), -100)])
        labels.append(lab)
        pos.append(torch.arange(p))
        masks.append(torch.cat([torch.ones(n - 1), torch.zeros(pad + 1)]))
        cu.append(cu[-1] + p)
    return torch.cat(ids), torch.cat(labels), torch.cat(pos), torch.cat(masks), torch.tensor(cu)


def loop_layout(cu_seqlens, cu_seqlens_padded):
    """Per-sequence loop: seq_idx, position and padding mask of every token."""
    seq_idx, position, padding = [], [], []
    cu, cu_padded = cu_seqlens.tolist(), cu_seqlens_padded.tolist()
    for i, (r0, r1, p0, p1) in enumerate(zip(cu[:-1], cu[1:], cu_padded[:-1], cu_padded[1:], strict=True)):
        seq_idx.append(torch.full((p1 - p0,), i, dtype=torch.int32))
        position.append(torch.arange(p1 - p0))
        padding.append(torch.arange(p1 - p0) >= r1 - r0)
    return torch.cat(seq_idx), torch.cat(position), torch.cat(padding)


def loop_shard(tensors, cu, cp, rank):
    """Per-sequence slicing of the two DualChunkSwap chunks."""
    out = []
    cu = cu.tolist()
    for t in tensors:
        pieces = []
        for start, end in zip(cu[:-1], cu[1:], strict=True):
            chunk = (end - start) // (2 * cp)
            pieces.append(t[start + rank * chunk : start + (rank + 1) * chunk])
            pieces.append(t[start + (2 * cp - 1 - rank) * chunk : start + (2 * cp - rank) * chunk])
        out.append(torch.cat(pieces))
    return out


def timeit(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--sequences", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    samples = make_samples(args.sequences, args.tokens, args.seed)
    real = sum(s["input_ids"].numel() for s in samples)
    print(f"# machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread")
    print(f"# workload: {len(samples)} sequences, {real} real tokens (lognormal lengths), median of {args.repeats}")
    print(f"{'operation':<34}{'seqpack us/1K':>15}{'loop us/1K':>13}{'speedup':>9}")

    def row(name: str, tokens: int, fast, slow) -> None:
        fast_s, _ = timeit(fast, args.repeats)
        slow_s, _ = timeit(slow, args.repeats)
        per_k = 1e6 * 1000 / tokens
        print(f"{name:<34}{fast_s * per_k:>15.1f}{slow_s * per_k:>13.1f}{slow_s / fast_s:>8.1f}x")

    for cp in (1, 2, 4, 8):
        pm = pad_multiple_for(cp)
        batch = pack_sequences(samples, pad_multiple=pm)
        cu, cu_padded, n = batch.cu_seqlens, batch.cu_seqlens_padded, batch.num_tokens
        row(
            f"pack (pad_multiple={pm})",
            n,
            lambda pm=pm: pack_sequences(samples, pad_multiple=pm),
            lambda pm=pm: loop_pack(samples, pm),
        )
        row(
            f"token_layout (pad_multiple={pm})",
            n,
            lambda cu=cu, cu_padded=cu_padded: token_layout(cu_padded, cu),
            lambda cu=cu, cu_padded=cu_padded: loop_layout(cu, cu_padded),
        )
        if cp > 1:
            fields = [getattr(batch, name) for name in BATCH_TOKEN_FIELDS]
            row(
                f"shard all {cp} CP ranks (6 fields)",
                n,
                lambda batch=batch, cp=cp: [shard_for_cp(batch, cp, r) for r in range(cp)],
                lambda fields=fields, cu_padded=cu_padded, cp=cp: [
                    loop_shard(fields, cu_padded, cp, r) for r in range(cp)
                ],
            )


if __name__ == "__main__":
    main()
