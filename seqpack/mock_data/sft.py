"""``MockSFTDataset``: deterministic random-token samples of given lengths."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.mock_data import io
from seqpack.options import INT64_MAX
from seqpack.thd.sample import IGNORE_INDEX
from seqpack.validation import check_fits_memory, check_int, check_number, check_path, int64_array

__all__ = ["IGNORE_INDEX", "MIN_VOCAB_SIZE", "MockSFTDataset"]

logger = logging.getLogger(__name__)

MIN_VOCAB_SIZE = 2  # token 0 stays free for padding: ids are drawn from [1, vocab_size)


class MockSFTDataset(torch.utils.data.Dataset):
    """A map-style dataset of random token sequences with the given lengths.

    Sample ``i`` depends only on ``(seed, i)``: any worker, rank or process that builds the
    dataset with the same arguments reads the same tokens, in any order. Token ids are drawn
    from ``[1, vocab_size)`` (0 stays free for padding).

    Each sample (``lengths``: each >= 1) is ``{"input_ids", "labels", "loss_mask"}`` (1-D
    tensors of equal length): ``labels`` are next-token targets with ``-100`` on the last token
    and on the prompt (the first ``prompt_fraction`` of the tokens), where ``loss_mask`` is 0.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        vocab_size: int = 32000,
        seed: int = 0,
        *,
        prompt_fraction: float = 0.0,
    ) -> None:
        arr = int64_array("lengths", lengths, too_large=SampleError, element="sample {index} has length")
        if arr.ndim != 1:
            raise SeqpackTypeError(f"lengths must be a 1-D integer array, got shape {arr.shape}")
        if arr.size and arr.min() < 1:
            i = int(np.argmin(arr))
            raise SampleError(f"sample {i} has length {int(arr[i])}; lengths must be >= 1")
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=MIN_VOCAB_SIZE, maximum=INT64_MAX)
        self.seed = check_int("seed", seed, minimum=0)
        self.prompt_fraction = check_number("prompt_fraction", prompt_fraction, minimum=0.0)
        if self.prompt_fraction >= 1.0:
            raise ConfigError(f"prompt_fraction must be in [0, 1), got {prompt_fraction!r}")
        self.lengths = arr

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def tokens(self, index: int) -> np.ndarray:
        """Token ids of sample ``index`` (int64 numpy), from a generator seeded by (seed, index)."""
        n = len(self)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise SeqpackTypeError(f"index must be an integer, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} samples")
        index = int(index) % n
        # A sample is three arrays: int64 ids and labels, a float32 loss mask.
        check_fits_memory(f"sample {index} of {int(self.lengths[index])} tokens", 20 * int(self.lengths[index]))
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

    def write_parquet(
        self,
        path: str | os.PathLike,
        *,
        rows_per_group: int = 4096,
        progress: bool | Callable[[int], object] = False,
    ) -> None:
        """Write ``length`` (int64) and ``input_ids`` (list of int32 or int64) per sample, a row
        group of ``rows_per_group`` samples at a time (datasets larger than memory work);
        ``lengths_from_file(path)`` reads the lengths back. ``input_ids`` is a ``large_list``
        (int64 offsets) when a row group holds 2**31 tokens or more.

        Args:
            progress: A callable, called with the number of samples after each row group
                (e.g. a progress bar's ``update``); ``True`` logs each row group at INFO.

        Raises:
            IsADirectoryError: ``path`` is a directory.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = check_path("path", path)
        rows_per_group = check_int("rows_per_group", rows_per_group, minimum=1, maximum=INT64_MAX)
        if not (callable(progress) or isinstance(progress, (bool, np.bool_))):
            raise SeqpackTypeError(f"progress must be True, False or a callable, got {progress!r:.40}")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path}: is a directory; give a file name")
        n = len(self)
        if callable(progress):
            report = progress
        else:
            written = 0

            def report(rows: int) -> None:
                nonlocal written
                written += rows
                if progress:
                    logger.info("%s: wrote %d of %d samples", path, written, n)

        token_type = pa.int32() if self.vocab_size <= 2**31 else pa.int64()
        starts = np.arange(0, max(n, 1), rows_per_group)
        group_tokens = np.add.reduceat(self.lengths, starts) if n else np.zeros(1, np.int64)
        large = int(group_tokens.max()) > io.LIST_MAX_VALUES  # int32 list offsets would wrap
        list_type, list_array = (pa.large_list, pa.LargeListArray) if large else (pa.list_, pa.ListArray)
        offset_type = np.int64 if large else np.int32
        schema = pa.schema([("length", pa.int64()), ("input_ids", list_type(token_type))])
        with pq.ParquetWriter(path, schema) as writer:
            for start in starts.tolist():
                stop = min(start + rows_per_group, n)
                chunks = [self.tokens(i) for i in range(start, stop)]
                offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
                np.cumsum([c.shape[0] for c in chunks], out=offsets[1:])
                flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
                values = pa.array(flat.astype(np.int32 if token_type == pa.int32() else np.int64))
                ids = list_array.from_arrays(pa.array(offsets.astype(offset_type)), values)
                writer.write_table(
                    pa.table({"length": pa.array(self.lengths[start:stop]), "input_ids": ids}, schema=schema)
                )
                report(stop - start)

    def __repr__(self) -> str:
        return f"MockSFTDataset({len(self)} samples, vocab_size={self.vocab_size}, seed={self.seed})"
