"""Mock workloads: sequence-length generators, length files, and ``MockSFTDataset``."""

from __future__ import annotations

from seqpack.mock_data.io import lengths_from_file, write_lengths
from seqpack.mock_data.lengths import (
    DISTRIBUTIONS,
    bimodal_lengths,
    constant_lengths,
    generate_lengths,
    lengths_from_config,
    lognormal_lengths,
    pareto_lengths,
    uniform_lengths,
)
from seqpack.mock_data.sft import MockSFTDataset

__all__ = [
    "DISTRIBUTIONS",
    "MockSFTDataset",
    "bimodal_lengths",
    "constant_lengths",
    "generate_lengths",
    "lengths_from_config",
    "lengths_from_file",
    "lognormal_lengths",
    "pareto_lengths",
    "uniform_lengths",
    "write_lengths",
]
