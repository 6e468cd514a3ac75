"""seqpack: sequence packing and FLOPs-aware load balancing for distributed LLM training.

Between a framework's dataloader and its model, seqpack gathers each step's sequence
lengths, computes one deterministic schedule over DP replicas and microbatches, moves samples
with an all-to-all, packs THD microbatches, cuts them for context parallelism, and broadcasts
them over tensor and pipeline parallel ranks.
"""

from __future__ import annotations

__version__ = "0.1.0"

from seqpack.cost import CostModel
from seqpack.cp import partition_indices, shard_for_cp, unshard_from_cp
from seqpack.schedulers import Schedule, Scheduler, get_scheduler
from seqpack.stats import StepStats
from seqpack.thd import (
    PackedBatch,
    pack_sequences,
    pad_multiple_for,
    process_input_for_thd,
    split_batch_into_thd_chunks,
)

__all__ = [
    "__version__",
    "CostModel",
    "PackedBatch",
    "Schedule",
    "Scheduler",
    "StepStats",
    "get_scheduler",
    "pack_sequences",
    "pad_multiple_for",
    "partition_indices",
    "process_input_for_thd",
    "shard_for_cp",
    "split_batch_into_thd_chunks",
    "unshard_from_cp",
]
