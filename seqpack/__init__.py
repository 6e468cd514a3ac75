"""seqpack: sequence packing and FLOPs-aware load balancing for distributed LLM training.

Between a framework's dataloader and its model, seqpack gathers each step's sequence
lengths, computes one deterministic schedule over DP replicas and microbatches, moves samples
with an all-to-all, packs THD microbatches, cuts them for context parallelism, and broadcasts
them over tensor and pipeline parallel ranks.

This module exports the main flow only; everything else lives in its subpackage. The
subpackages form layers; each imports only layers below its own (every import counts,
function-level ones too; ``tests/test_package_layout.py`` checks this list):

    1. errors, options, _logging, _lazy, _version
    2. validation
    3. topology, thd
    4. cost, mock_data, packing
    5. compute, schedulers
    6. stats
    7. calibrate
    8. collective
    9. loader
    10. interop
    11. cli
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack._lazy import lazy_exports
from seqpack._version import __version__

if TYPE_CHECKING:
    from seqpack.calibrate import CostCalibrator, MicrobatchTimer
    from seqpack.compute.attention import ThdAttention
    from seqpack.compute.mamba import Mamba2Mixer
    from seqpack.cost import CostModel, ModelSpec
    from seqpack.errors import ConfigError, SampleError, SeqpackError, StepFailed
    from seqpack.loader import PackingConfig, PackingIterator, Step, wrap_data_iterator
    from seqpack.packing import pack_dataset
    from seqpack.schedulers import Schedule, Scheduler, get_scheduler, predicted_step_time
    from seqpack.stats import StepStats
    from seqpack.thd import PackedBatch, StaticShapes, pack_sequences, pad_multiple_for, shard_for_cp, unshard_from_cp
    from seqpack.topology import Topology

# Each name is imported from its module on first use (seqpack._lazy.lazy_exports).
_HOMES = {
    "CostCalibrator": "seqpack.calibrate",
    "MicrobatchTimer": "seqpack.calibrate",
    "ThdAttention": "seqpack.compute.attention",
    "Mamba2Mixer": "seqpack.compute.mamba",
    "CostModel": "seqpack.cost",
    "ModelSpec": "seqpack.cost",
    "ConfigError": "seqpack.errors",
    "SampleError": "seqpack.errors",
    "SeqpackError": "seqpack.errors",
    "StepFailed": "seqpack.errors",
    "PackingConfig": "seqpack.loader",
    "PackingIterator": "seqpack.loader",
    "Step": "seqpack.loader",
    "wrap_data_iterator": "seqpack.loader",
    "pack_dataset": "seqpack.packing",
    "Schedule": "seqpack.schedulers",
    "Scheduler": "seqpack.schedulers",
    "get_scheduler": "seqpack.schedulers",
    "predicted_step_time": "seqpack.schedulers",
    "StepStats": "seqpack.stats",
    "PackedBatch": "seqpack.thd",
    "StaticShapes": "seqpack.thd",
    "pack_sequences": "seqpack.thd",
    "pad_multiple_for": "seqpack.thd",
    "shard_for_cp": "seqpack.thd",
    "unshard_from_cp": "seqpack.thd",
    "Topology": "seqpack.topology",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "__version__",
    "ConfigError",
    "CostCalibrator",
    "CostModel",
    "Mamba2Mixer",
    "MicrobatchTimer",
    "ModelSpec",
    "PackedBatch",
    "PackingConfig",
    "PackingIterator",
    "SampleError",
    "Schedule",
    "Scheduler",
    "SeqpackError",
    "StaticShapes",
    "Step",
    "StepFailed",
    "StepStats",
    "ThdAttention",
    "Topology",
    "get_scheduler",
    "pack_dataset",
    "pack_sequences",
    "pad_multiple_for",
    "predicted_step_time",
    "shard_for_cp",
    "unshard_from_cp",
    "wrap_data_iterator",
]
