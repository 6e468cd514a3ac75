"""The demo's data: which documents each rank reads, and the padded (no packing) baseline."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.cli.demo.settings import DemoSettings
from seqpack.errors import SampleError

if TYPE_CHECKING:
    from seqpack.thd import PackedBatch

__all__ = ["load_dataset", "mock_lengths", "padded_microbatches", "rank_indices", "sample_order"]


def mock_lengths(settings: DemoSettings, n: int) -> np.ndarray:
    """``n`` lengths of the mock data's lognormal (int64)."""
    from seqpack.mock_data import lognormal_lengths

    return lognormal_lengths(
        n,
        min_seq_len=settings.min_seq_len,
        max_seq_len=settings.max_seq_len,
        mean_seq_len=settings.mean_seq_len,
        sigma=settings.sigma,
        seed=settings.seed,
    )


def load_dataset(settings: DemoSettings) -> tuple[Any, int]:
    """(map-style dataset of ``{"input_ids": ...}``, vocab size) for ``settings.data``.

    Raises:
        SampleError: A file that is not a token table, holds too few documents for the run,
            or documents longer than ``--max-seq-len``.
    """
    from seqpack.mock_data import MockSFTDataset
    from seqpack.mock_data.text import BYTE_VOCAB_SIZE, TokenDataset, stdlib_corpus

    needed = settings.total_steps * settings.dp * settings.samples_per_rank
    if settings.data == "mock":
        return MockSFTDataset(
            mock_lengths(settings, needed), vocab_size=BYTE_VOCAB_SIZE, seed=settings.seed
        ), BYTE_VOCAB_SIZE
    if settings.data == "stdlib":
        dataset = TokenDataset(stdlib_corpus(max_len=settings.max_seq_len))
        vocab = BYTE_VOCAB_SIZE
    else:
        dataset = TokenDataset(settings.data)
        vocab = max(BYTE_VOCAB_SIZE, dataset.vocab_size)
        too_long = int((dataset.lengths() > settings.max_seq_len).sum())
        if too_long:
            raise SampleError(
                f"--data {settings.data!r}: {too_long} documents are longer than --max-seq-len {settings.max_seq_len}"
            )
    if len(dataset) < needed:
        raise SampleError(
            f"--data {settings.data!r} has {len(dataset)} documents; the run needs {needed} "
            f"(steps x dp x samples_per_rank); lower --steps or --samples-per-rank"
        )
    return dataset, vocab


def sample_order(settings: DemoSettings, num_documents: int) -> np.ndarray:
    """Global sample order: a seeded shuffle for real corpora (files arrive sorted)."""
    if settings.data == "mock":
        return np.arange(num_documents)
    return np.random.default_rng(settings.seed).permutation(num_documents)


def rank_indices(settings: DemoSettings, order: np.ndarray, dp_rank: int) -> Iterator[int]:
    """Document indices DP rank ``dp_rank`` reads, step by step: the global batch of step
    ``s`` is ``order[s*dp*spr : (s+1)*dp*spr]``, DP rank ``d`` reads its ``d``-th block."""
    spr, dp = settings.samples_per_rank, settings.dp
    for step in range(settings.total_steps):
        start = (step * dp + dp_rank) * spr
        yield from (int(i) for i in order[start : start + spr])


def padded_microbatches(
    samples: Sequence[dict], settings: DemoSettings, sample_ids: Sequence[int]
) -> list[PackedBatch]:
    """The no-packing baseline: fixed microbatches of ``b = capacity // max_seq_len``
    sequences (the most that always fits), each sequence padded to the longest of its
    microbatch. Pads are computed as if real (``cu_seqlens = cu_seqlens_padded``), as a
    padded BSHD batch would be; they carry no loss."""
    from seqpack.thd import pack_sequences

    capacity = settings.max_tokens_per_rank * settings.cp
    per_mb = max(1, capacity // settings.max_seq_len)
    multiple = 2 * settings.cp if settings.cp > 1 else 1
    batches = []
    for start in range(0, len(samples), per_mb):
        group = samples[start : start + per_mb]
        longest = max(int(s["input_ids"].numel()) for s in group)
        longest = -(-longest // multiple) * multiple
        batch = pack_sequences(group, pad_multiple=longest, sample_ids=sample_ids[start : start + per_mb])
        batches.append(dataclasses.replace(batch, cu_seqlens=batch.cu_seqlens_padded))
    return batches
