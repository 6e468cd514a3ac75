"""Typed options: one ``StrEnum`` per option set, and the wrapper's :class:`PackingConfig`.

Every enum member is also its string (``DataOwner.TP0 == "tp0"``), so callers may pass
either; :func:`seqpack.validation.check_choice` turns a string into the member and names the
valid values when it is not one.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AttentionBackend",
    "Axis",
    "AXES",
    "CpCommType",
    "DataOwner",
    "MambaBackend",
    "Objective",
    "OnOversize",
    "Order",
    "Sync",
]


class Axis(StrEnum):
    """Parallelism axes, in the order seqpack walks them."""

    DP = "dp"  # data-parallel replicas (one CP lane)
    CP = "cp"  # context-parallel ranks of one replica
    TP = "tp"  # tensor-parallel ranks
    PP = "pp"  # pipeline stages


AXES: tuple[Axis, ...] = tuple(Axis)


class DataOwner(StrEnum):
    """Which ranks read data in the wrapper."""

    TP0 = "tp0"  # Megatron: TP rank 0 of the first and last stage reads; broadcast the rest
    ALL = "all"  # every rank reads identical data for its DP rank; nothing is broadcast


class OnOversize(StrEnum):
    """What happens to a sequence longer than one microbatch holds."""

    ERROR = "error"  # raise, naming the sample and the limits
    TRUNCATE = "truncate"  # cut to capacity; counted in the stats
    DROP = "drop"  # leave out; counted in the stats


class Order(StrEnum):
    """Order in which a replica runs its microbatches."""

    HEAVY_FIRST = "heavy_first"  # a memory peak shows up at the first microbatch
    PIPELINE = "pipeline"  # light at both ends, heavy in the middle: shorter bubbles


class Objective(StrEnum):
    """What ``balanced``'s repair trades when replica and round balance conflict."""

    BOTH = "both"
    ROUNDS = "rounds"
    REPLICAS = "replicas"


class Sync(StrEnum):
    """How replicas synchronise within a step, hence what a step waits for."""

    LOCKSTEP = "lockstep"  # FSDP / pipeline: every microbatch round waits for its slowest replica
    REPLICA = "replica"  # DDP / ZeRO-1: the step waits for the slowest replica's total


class AttentionBackend(StrEnum):
    AUTO = "auto"
    TE = "te"
    TORCH = "torch"


class MambaBackend(StrEnum):
    AUTO = "auto"
    MAMBA_SSM = "mamba_ssm"
    TORCH = "torch"


class CpCommType(StrEnum):
    """Transformer Engine's context-parallel communication types."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    A2A = "a2a"
    A2A_P2P = "a2a+p2p"
