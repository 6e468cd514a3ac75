"""seqpack: sequence packing and FLOPs-aware load balancing for distributed LLM training.

Between a framework's dataloader and its model, seqpack gathers each step's sequence
lengths, computes one deterministic schedule over DP replicas and microbatches, moves samples
with an all-to-all, packs THD microbatches, cuts them for context parallelism, and broadcasts
them over tensor and pipeline parallel ranks.
"""

from __future__ import annotations

__version__ = "0.1.0"

from seqpack.calibrate import CostCalibrator
from seqpack.collective import broadcast_pp, broadcast_tp, exchange_samples, gather_lengths
from seqpack.compute.attention import ThdAttention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.cost import CostModel, ModelSpec, mamba2_flops, model_preset, transformer_flops
from seqpack.cp import partition_indices, shard_for_cp, unshard_from_cp
from seqpack.errors import ConfigError, SampleError, SeqpackError, SeqpackTypeError, StepFailed
from seqpack.loader.config import PackingConfig
from seqpack.loader.iterator import PackingIterator, Step, wrap_data_iterator
from seqpack.mock_data import MockSFTDataset, lengths_from_config, lengths_from_file, lognormal_lengths
from seqpack.options import DataOwner, OnOversize, Sync
from seqpack.schedulers import Schedule, Scheduler, available_schedulers, get_scheduler, predicted_step_time
from seqpack.stats import StepStats
from seqpack.thd import (
    PackedBatch,
    pack_sequences,
    pad_multiple_for,
    process_input_for_thd,
    split_batch_into_thd_chunks,
)
from seqpack.timing import MicrobatchTimer
from seqpack.topology import Topology

__all__ = [
    "__version__",
    "ConfigError",
    "DataOwner",
    "OnOversize",
    "PackingConfig",
    "SampleError",
    "SeqpackError",
    "SeqpackTypeError",
    "StepFailed",
    "Sync",
    "CostCalibrator",
    "CostModel",
    "Mamba2Mixer",
    "MicrobatchTimer",
    "MockSFTDataset",
    "ModelSpec",
    "PackedBatch",
    "PackingIterator",
    "Schedule",
    "Scheduler",
    "Step",
    "StepStats",
    "ThdAttention",
    "Topology",
    "available_schedulers",
    "broadcast_pp",
    "broadcast_tp",
    "exchange_samples",
    "gather_lengths",
    "get_scheduler",
    "lengths_from_config",
    "lengths_from_file",
    "lognormal_lengths",
    "mamba2_flops",
    "model_preset",
    "pack_sequences",
    "pad_multiple_for",
    "partition_indices",
    "predicted_step_time",
    "process_input_for_thd",
    "shard_for_cp",
    "split_batch_into_thd_chunks",
    "transformer_flops",
    "unshard_from_cp",
    "wrap_data_iterator",
]
