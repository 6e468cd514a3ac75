"""Every option enum and numeric limit of seqpack: a leaf that imports nothing of seqpack.

Each option is a ``StrEnum``: every member is also its string (``DataOwner.TP0 == "tp0"``),
so callers may pass either; :func:`seqpack.validation.check_choice` turns a string into the
member and names the valid values when it is not one.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

__all__ = [
    "AXES",
    "INT32_MAX",
    "INT64_MAX",
    "DEFAULT_PREFETCH_BYTES",
    "LABEL_COPY_FRACTION",
    "LABEL_COPY_MIN_TOKENS",
    "MAX_PREFETCH",
    "MAX_TOKENS",
    "SAMPLE_BYTES_PER_TOKEN",
    "AttentionBackend",
    "Axis",
    "CpCommType",
    "CpLayout",
    "DataOwner",
    "GroupSizes",
    "LabelFormat",
    "MambaBackend",
    "OnOversize",
    "Order",
    "Sync",
    "TailPadding",
    "fingerprint_text",
]

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
MAX_TOKENS = 1 << 53
"""Most padded tokens one microbatch may hold (``max_tokens_per_rank * cp_size``): float64
holds every integer up to 2**53, so the schedulers' token sums stay exact below it."""
MAX_PREFETCH = 16
"""Most steps the wrapper prepares ahead of the training loop (``prefetch``)."""
DEFAULT_PREFETCH_BYTES = 1 << 30
"""Tensor bytes of prepared steps past which the prefetch thread waits (``prefetch_bytes``)."""

SAMPLE_BYTES_PER_TOKEN = 20
"""Bytes one token of a plain SFT sample carries through the exchange: ``input_ids`` and
``labels`` (int64) and ``loss_mask`` (float32). RL and multimodal samples carry more (pass
``bytes_per_token``)."""

LABEL_COPY_FRACTION = 0.9
"""Labels are refused as aligned the other way than ``label_format`` says when at least this
fraction of a sample's checked tokens (supervised, and not fitting both alignments) carry the
other alignment's target ..."""
LABEL_COPY_MIN_TOKENS = 8
"""... and the sample has at least this many checked tokens (a short answer that matches the
other alignment by chance is never refused)."""


class _Option(StrEnum):
    """A StrEnum whose ``repr`` is its string's, so messages read ``'cp'``, not ``<Axis.CP: 'cp'>``."""

    def __repr__(self) -> str:
        return repr(self.value)


class Axis(_Option):
    """Parallelism axes, in the order seqpack walks them."""

    DP = "dp"  # data-parallel replicas (one CP lane)
    CP = "cp"  # context-parallel ranks of one replica
    TP = "tp"  # tensor-parallel ranks
    PP = "pp"  # pipeline stages


AXES: tuple[Axis, ...] = tuple(Axis)


class DataOwner(_Option):
    """Which ranks read data in the wrapper."""

    TP0 = "tp0"  # Megatron: TP rank 0 of the first and last stage reads; broadcast the rest
    ALL = "all"  # every rank reads identical data for its DP rank; nothing is broadcast


class LabelFormat(_Option):
    """What a sample's ``labels`` are aligned with."""

    SHIFTED = "shifted"  # next-token targets: labels[t] is predicted at token t (Megatron, NeMo; seqpack's own)
    UNSHIFTED = "unshifted"  # aligned with input_ids: labels[t] is token t's own id; the model shifts (HF, TRL)
    # Used as given like "shifted" but never refused for equalling input_ids (a model trained
    # on purpose to predict the token at its own position).
    POSITION_ALIGNED = "position_aligned"


class OnOversize(_Option):
    """What happens to a sequence longer than one microbatch holds."""

    ERROR = "error"  # raise, naming the sample and the limits
    TRUNCATE = "truncate"  # cut to capacity; counted in the stats
    DROP = "drop"  # leave out; counted in the stats


class Order(_Option):
    """Order in which a replica runs its microbatches."""

    HEAVY_FIRST = "heavy_first"  # a memory peak shows up at the first microbatch
    PIPELINE = "pipeline"  # light at both ends, heavy in the middle: shorter bubbles
    AS_PLANNED = "as_planned"  # the planner's own round order


class Sync(_Option):
    """How replicas synchronise within a step, hence what a step waits for."""

    LOCKSTEP = "lockstep"  # FSDP / pipeline: every microbatch round waits for its slowest replica
    REPLICA = "replica"  # DDP / ZeRO-1: the step waits for the slowest replica's total


class AttentionBackend(_Option):
    AUTO = "auto"
    TE = "te"
    TORCH = "torch"


class MambaBackend(_Option):
    AUTO = "auto"
    MAMBA_SSM = "mamba_ssm"
    TORCH = "torch"


class CpCommType(_Option):
    """Transformer Engine's context-parallel communication types."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    A2A = "a2a"
    A2A_P2P = "a2a+p2p"


class CpLayout(_Option):
    """How a context-parallel rank's tokens are cut from every packed sequence."""

    DUALCHUNK = "dualchunk"  # 2*cp chunks, rank r holds r and 2cp-1-r (TE's DualChunkSwap)
    CONTIGUOUS = "contiguous"  # cp chunks, rank r holds chunk r (local or linear attention, Mamba)


class TailPadding(_Option):
    """Where a fixed-shape pack's tail (bucket minus the pack's padded tokens) lives
    (:class:`seqpack.thd.StaticShapes`; Megatron-LM's ``thd_tail_padding_policy``)."""

    APPEND_DUMMY_SEQ = "append_dummy_seq"  # one more sequence slot: real length 0, padded length the tail
    EXTEND_LAST = "extend_last"  # more padding at the end of the last real sequence


class GroupSizes(_Option):
    """The CP groups a plan's microbatches run on (:class:`seqpack.schedulers.Schedule`);
    ``pow2`` and ``any`` are dynamic CP: per microbatch round the DP x CP ranks form groups."""

    STATIC = "static"  # group (m, d) is replica d's CP block in every round m
    POW2 = "pow2"  # powers of two on aligned blocks (start % size == 0), and the whole R
    ANY = "any"  # any size 1..R on any contiguous block (Megatron-LM PR #7097)


def fingerprint_text(text: str) -> int:
    """A 63-bit blake2b hash of ``text`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
