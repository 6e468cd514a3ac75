"""``MockSFTDataset``: deterministic random-token samples of given lengths."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

__all__ = ["IGNORE_INDEX", "MockSFTDataset"]

IGNORE_INDEX = -100


class MockSFTDataset(torch.utils.data.Dataset):
    """A map-style dataset of random token sequences with the given lengths.

    Sample ``i`` depends only on ``(seed, i)``: any worker, rank or process that builds the
    dataset with the same arguments reads the same tokens, in any order. Token ids are drawn
    from ``[1, vocab_size)`` (0 stays free for padding).

    Each sample is ``{"input_ids", "labels", "loss_mask"}`` (1-D tensors of equal length):
    ``labels`` are next-token targets with ``-100`` on the last token and on the prompt
    (the first ``prompt_fraction`` of the tokens), where ``loss_mask`` is 0.

    Args:
        lengths: Length of every sample (each >= 1).
        vocab_size: Token ids are below this.
        seed: Dataset seed.
        prompt_fraction: Share of each sequence treated as an unsupervised prompt.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        vocab_size: int = 32000,
        seed: int = 0,
        *,
        prompt_fraction: float = 0.0,
    ) -> None:
        arr = np.asarray(lengths)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"lengths must be a 1-D integer array, got dtype {arr.dtype} shape {arr.shape}")
        if arr.size and arr.min() < 1:
            i = int(np.argmin(arr))
            raise ValueError(f"sample {i} has length {int(arr[i])}; lengths must be >= 1")
        if not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, bool) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not 0.0 <= float(prompt_fraction) < 1.0:
            raise ValueError(f"prompt_fraction must be in [0, 1), got {prompt_fraction!r}")
        self.lengths = np.ascontiguousarray(arr, dtype=np.int64)
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)
        self.prompt_fraction = float(prompt_fraction)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def tokens(self, index: int) -> np.ndarray:
        """Token ids of sample ``index`` (int64 numpy), from a generator seeded by (seed, index)."""
        n = len(self)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"index must be an integer, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} samples")
        index = int(index) % n
        rng = np.random.default_rng([self.seed, index])
        return rng.integers(1, self.vocab_size, int(self.lengths[index]), dtype=np.int64)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens(index)
        length = ids.shape[0]
        labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
        labels[:-1] = ids[1:]
        prompt = int(length * self.prompt_fraction)
        labels[: max(prompt - 1, 0)] = IGNORE_INDEX
        loss_mask = (labels != IGNORE_INDEX).astype(np.float32)
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask),
        }

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(len(self)):
            yield self[i]

    def write_parquet(self, path: str | os.PathLike, *, rows_per_group: int = 4096, progress: bool = False) -> None:
        """Write ``length`` (int64) and ``input_ids`` (list of int32 or int64) per sample.

        Streams ``rows_per_group`` samples at a time, so datasets larger than memory work.
        ``lengths_from_file(path)`` reads the lengths back.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from seqpack.progress import Progress

        token_type = pa.int32() if self.vocab_size <= 2**31 else pa.int64()
        schema = pa.schema([("length", pa.int64()), ("input_ids", pa.list_(token_type))])
        n = len(self)
        with pq.ParquetWriter(os.fspath(path), schema) as writer, Progress(
            n, "write", enabled=progress
        ) as bar:
            for start in range(0, max(n, 1), rows_per_group):
                stop = min(start + rows_per_group, n)
                chunks = [self.tokens(i) for i in range(start, stop)]
                offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
                np.cumsum([c.shape[0] for c in chunks], out=offsets[1:])
                if offsets[-1] >= 2**31:  # list offsets are int32: never let them wrap
                    raise ValueError(
                        f"samples {start}..{stop - 1} hold {int(offsets[-1])} tokens, more than one Parquet list "
                        f"column chunk addresses (2**31 - 1); lower rows_per_group={rows_per_group}"
                    )
                flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
                values = pa.array(flat.astype(np.int32 if token_type == pa.int32() else np.int64))
                ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
                writer.write_table(pa.table({"length": pa.array(self.lengths[start:stop]), "input_ids": ids}, schema=schema))
                bar.update(stop - start)

    def __repr__(self) -> str:
        return f"MockSFTDataset({len(self)} samples, vocab_size={self.vocab_size}, seed={self.seed})"
