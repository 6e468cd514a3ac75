"""Fixed shapes for compiled training: token buckets and a fixed number of sequence slots.

Under :class:`StaticShapes` every pack (:func:`seqpack.thd.pack_sequences` with
``static_shapes=``) has a token count from ``token_buckets``; ``cu_seqlens`` /
``cu_seqlens_padded`` of exactly ``max_sequences + 1`` entries (the real sequences, then the
tail's slot under ``"append_dummy_seq"``, then unused slots as zero-length sequences, as
Megatron-LM pads them for THD CUDA graphs); ``max_seqlen`` equal to the bucket; and
``sample_ids`` of ``max_sequences`` entries, -1 for the tail's slot and unused slots.

The tail always belongs to a sequence: FlashAttention leaves the output rows of tokens
outside every sequence unwritten, and TE's CP partition maps them onto the last sequence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX, TailPadding
from seqpack.validation import check_choice, check_fits_memory, check_int, check_optional_int, check_positive_int

__all__ = ["CAPACITY", "StaticShapes", "as_static_shapes"]

CAPACITY: Literal["capacity"] = "capacity"
"""``token_buckets="capacity"``: one bucket, the microbatch's token capacity (Megatron's
``--pad-packed-seq-alignment max``)."""

# Bytes at the peak of one pack (pack_sequences), lower estimates: per token, per slot, per bucket.
_BYTES_PER_TOKEN = 40
_BYTES_PER_SLOT = 40
_BYTES_PER_BUCKET = 48


@dataclasses.dataclass(frozen=True, kw_only=True)
class StaticShapes:
    """The fixed shapes of every pack: token buckets and sequence slots.

    Attributes:
        token_buckets: Token counts a pack may have, strictly ascending positive ints (a
            pack takes the smallest that holds its padded tokens), or ``"capacity"``: one
            bucket, the capacity the packer is given (``pad_to`` of ``pack_sequences``).
            Every bucket must be a multiple of the packer's ``pad_multiple``.
        max_sequences: Sequence slots of every pack: ``cu_seqlens`` has ``max_sequences + 1``
            entries. Under ``"append_dummy_seq"`` one slot is the tail's
            (:attr:`max_real_sequences`), as Megatron-LM's ``thd_max_packed_sequences`` counts.
        tail_padding: Where the tail lives (:class:`~seqpack.options.TailPadding`, Megatron-LM's
            ``thd_tail_padding_policy``): ``"append_dummy_seq"`` (default), a slot of its own
            after the real sequences (real length 0); ``"extend_last"``, padding at the end of
            the last real sequence.

    The tail's tokens carry label -100, loss mask 0 and ``padding_mask`` True. For a CUDA
    graph pass ``batch.te_kwargs(padded_as_real=True)`` so that ``pad_between_seqs`` does not
    change between replays.

    Raises:
        SeqpackTypeError: ``token_buckets`` neither ``"capacity"`` nor a sequence of ints.
        ConfigError: An empty, unsorted or repeated bucket list, a bucket that is not a
            positive int32, ``max_sequences`` below 1 (below 2 under ``"append_dummy_seq"``),
            an unknown ``tail_padding``, or shapes whose largest pack (its tokens and
            ``max_sequences + 1`` slots) needs more memory than this machine has.
    """

    token_buckets: tuple[int, ...] | Literal["capacity"] = CAPACITY
    max_sequences: int
    tail_padding: TailPadding = TailPadding.APPEND_DUMMY_SEQ

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_buckets", _check_buckets(self.token_buckets))
        tail = check_choice("tail_padding", self.tail_padding, TailPadding)
        object.__setattr__(self, "tail_padding", tail)
        fewest = 2 if tail == TailPadding.APPEND_DUMMY_SEQ else 1
        slots = _check_slots(self.max_sequences)
        if slots < fewest:
            raise ConfigError(
                f"max_sequences={slots} leaves no slot for a real sequence: under "
                f"tail_padding='append_dummy_seq' one slot is the tail's (use max_sequences >= 2, "
                "or tail_padding='extend_last')"
            )
        object.__setattr__(self, "max_sequences", slots)
        _check_fits(self.token_buckets if isinstance(self.token_buckets, tuple) else (), slots)  # "capacity": in layout

    @classmethod
    def multiples_of(
        cls,
        step: int,
        capacity: int,
        *,
        max_sequences: int,
        tail_padding: TailPadding | str = TailPadding.APPEND_DUMMY_SEQ,
    ) -> StaticShapes:
        """Buckets ``step, 2*step, ..., capacity`` (Megatron's ``--pad-packed-seq-alignment
        step``, with the capacity the top); ``capacity`` must be a multiple of ``step``."""
        step = check_positive_int("step", step, maximum=INT32_MAX)
        capacity = check_positive_int("capacity", capacity, maximum=INT32_MAX)
        if capacity % step:
            raise ConfigError(f"capacity={capacity} is not a multiple of step={step}")
        buckets = range(step, capacity + 1, step)
        _check_fits(buckets, _check_slots(max_sequences))  # before the tuple is built
        return cls(token_buckets=tuple(buckets), max_sequences=max_sequences, tail_padding=TailPadding(tail_padding))

    @property
    def max_real_sequences(self) -> int:
        """Most real sequences one pack may hold (a hard limit, like the token capacity)."""
        dummy = self.tail_padding == TailPadding.APPEND_DUMMY_SEQ
        return self.max_sequences - 1 if dummy else self.max_sequences

    def buckets(self, capacity: int | None = None) -> tuple[int, ...]:
        """The buckets, ``"capacity"`` resolved to ``(capacity,)``.

        Raises:
            ConfigError: ``"capacity"`` without a ``capacity``.
        """
        capacity = check_optional_int("capacity", capacity, minimum=1, maximum=INT32_MAX)
        if isinstance(self.token_buckets, tuple):
            return self.token_buckets
        if capacity is None:
            raise ConfigError(
                "token_buckets='capacity' needs the microbatch's capacity: pass pad_to=<capacity> "
                "to pack_sequences, or give token_buckets as a tuple of token counts"
            )
        return (capacity,)

    def bucket_for(self, num_tokens: int, capacity: int | None = None) -> int:
        """The smallest bucket that holds ``num_tokens`` padded tokens.

        Raises:
            ConfigError: ``num_tokens`` above the largest bucket (named with it), or
                ``"capacity"`` without a ``capacity``.
        """
        num_tokens = check_int("num_tokens", num_tokens, minimum=0)
        buckets = self.buckets(capacity)
        index = int(np.searchsorted(np.asarray(buckets, dtype=np.int64), num_tokens))
        if index == len(buckets):
            which = (
                f"the capacity {buckets[-1]} (token_buckets='capacity')"
                if self.token_buckets == CAPACITY
                else f"the largest token bucket {buckets[-1]} (token_buckets={_shown(buckets)})"
            )
            raise ConfigError(
                f"a pack of num_tokens={num_tokens} padded tokens is larger than {which}: "
                "pack fewer tokens or add a larger bucket"
            )
        return buckets[index]

    def check_pad_multiple(self, pad_multiple: int, capacity: int | None = None) -> None:
        """Refuse a bucket that is not a multiple of ``pad_multiple`` (``2*cp_size`` and more
        under CP: :func:`~seqpack.thd.pad_multiple_for`).

        Raises:
            ConfigError: The first such bucket, named with the nearest valid sizes.
        """
        pad_multiple = check_positive_int("pad_multiple", pad_multiple, maximum=INT32_MAX)
        for bucket in self.buckets(capacity):
            if bucket % pad_multiple:
                low = bucket // pad_multiple * pad_multiple
                raise ConfigError(
                    f"token bucket {bucket} is not a multiple of pad_multiple={pad_multiple} "
                    f"(token_buckets={_shown(self.buckets(capacity))}); every bucket must be, so that each "
                    f"sequence and the tail keep the multiple (under CP each shard has bucket / cp_size "
                    f"tokens): use {low or pad_multiple} or {low + pad_multiple}"
                )

    def check_sequences(self, num_sequences: int) -> None:
        """Refuse a pack of more real sequences than :attr:`max_real_sequences`.

        Raises:
            ConfigError: Named with the count and the limit.
        """
        if num_sequences > self.max_real_sequences:
            dummy = " (one of them is the tail's, tail_padding='append_dummy_seq')"
            raise ConfigError(
                f"a pack of {num_sequences} sequences does not fit max_sequences={self.max_sequences} slots"
                f"{dummy if self.tail_padding == TailPadding.APPEND_DUMMY_SEQ else ''}: at most "
                f"{self.max_real_sequences} real sequences per pack; pack fewer or raise max_sequences"
            )

    def layout(
        self, lengths: np.ndarray, pad_multiple: int, capacity: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """``(cu_seqlens, cu_seqlens_padded, bucket)`` of a pack of real ``lengths`` (int64,
        each sequence padded to ``pad_multiple``): the smallest bucket that holds it, which is
        also its ``max_seqlen``.

        Raises:
            ConfigError: More real sequences than :attr:`max_real_sequences`, a pack above
                the largest bucket, or under ``"capacity"`` a pack larger than memory.
        """
        self.check_sequences(lengths.shape[0])
        padded = -(-lengths // pad_multiple) * pad_multiple
        bucket = self.bucket_for(int(padded.sum()), capacity)
        if self.token_buckets == CAPACITY:  # the one bucket construction could not size
            _check_fits((bucket,), self.max_sequences)
        cu_real, cu_padded = self.offsets(lengths, padded, bucket)
        return cu_real, cu_padded, bucket

    def offsets(self, lengths: np.ndarray, padded: np.ndarray, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """``(cu_seqlens, cu_seqlens_padded)`` (int64, ``max_sequences + 1`` entries each) of a
        pack of real ``lengths`` in slots of ``padded`` lengths (already checked), its tail
        filling ``bucket``."""
        n, slots = lengths.shape[0], self.max_sequences
        assert 0 < n <= self.max_real_sequences and int(padded.sum()) <= bucket, (n, int(padded.sum()), bucket)
        cu_real = np.zeros(slots + 1, dtype=np.int64)
        cu_padded = np.zeros(slots + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu_real[1 : n + 1])
        np.cumsum(padded, out=cu_padded[1 : n + 1])
        cu_real[n + 1 :] = cu_real[n]
        first_at_bucket = n + 1 if self.tail_padding == TailPadding.APPEND_DUMMY_SEQ else n
        cu_padded[first_at_bucket:] = bucket
        return cu_real, cu_padded


def as_static_shapes(value: object) -> StaticShapes | None:
    """``value`` when a :class:`StaticShapes` or None (what every ``static_shapes=`` takes).

    Raises:
        SeqpackTypeError: Anything else.
    """
    if value is None or isinstance(value, StaticShapes):
        return value
    raise SeqpackTypeError(f"static_shapes must be a seqpack.StaticShapes or None, got {type(value).__name__}")


def _check_slots(max_sequences: object) -> int:
    return check_int("max_sequences", max_sequences, minimum=1, maximum=INT32_MAX)


def _check_fits(buckets: Sequence[int], max_sequences: int) -> None:
    """Refuse shapes whose largest pack (the largest bucket's tokens, ``max_sequences + 1``
    slots), with the bucket list, needs more memory than this machine has."""
    largest = buckets[-1] if buckets else 0
    what = f"a pack of max_sequences={max_sequences} slots"
    if buckets:
        what += f" and {largest} tokens (the largest token bucket{f' of {len(buckets):,}' if len(buckets) > 1 else ''})"
    slots = max_sequences + 1
    check_fits_memory(what, _BYTES_PER_TOKEN * largest + _BYTES_PER_SLOT * slots + _BYTES_PER_BUCKET * len(buckets))


def _check_buckets(value: object) -> tuple[int, ...] | Literal["capacity"]:
    if isinstance(value, str):
        if value != CAPACITY:
            raise ConfigError(f"token_buckets must be 'capacity' or a tuple of token counts, got {value!r}")
        return CAPACITY
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, (Sequence, np.ndarray)):
        raise SeqpackTypeError(
            f"token_buckets must be 'capacity' or a tuple of token counts, got {type(value).__name__}"
        )
    buckets = tuple(check_positive_int(f"token_buckets[{i}]", b, maximum=INT32_MAX) for i, b in enumerate(value))
    if not buckets:
        raise ConfigError("token_buckets is empty: give at least one token count, or 'capacity'")
    for i in range(1, len(buckets)):
        if buckets[i] <= buckets[i - 1]:
            raise ConfigError(
                f"token_buckets must be strictly ascending, got {_shown(buckets)} "
                f"(token_buckets[{i}]={buckets[i]} after {buckets[i - 1]}); "
                f"sorted and without repeats: {_shown(tuple(sorted(set(buckets))))}"
            )
    return buckets


def _shown(buckets: tuple[int, ...]) -> str:
    return str(buckets) if len(buckets) <= 8 else f"({', '.join(map(str, buckets[:8]))}, ...)"
