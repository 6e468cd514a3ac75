"""Mock workloads: sequence-length generators, length files, and ``MockSFTDataset``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqpack._lazy import lazy_exports

if TYPE_CHECKING:
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

# Each name is imported from its module on first use (seqpack._lazy.lazy_exports).
_HOMES = {
    "lengths_from_file": "seqpack.mock_data.io",
    "write_lengths": "seqpack.mock_data.io",
    "DISTRIBUTIONS": "seqpack.mock_data.lengths",
    "bimodal_lengths": "seqpack.mock_data.lengths",
    "constant_lengths": "seqpack.mock_data.lengths",
    "generate_lengths": "seqpack.mock_data.lengths",
    "lengths_from_config": "seqpack.mock_data.lengths",
    "lognormal_lengths": "seqpack.mock_data.lengths",
    "pareto_lengths": "seqpack.mock_data.lengths",
    "uniform_lengths": "seqpack.mock_data.lengths",
    "MockSFTDataset": "seqpack.mock_data.sft",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

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
