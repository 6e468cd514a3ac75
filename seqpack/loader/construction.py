"""What the wrapper checks at construction besides the configuration: who must hold a data
iterator, the words the construction agreement reduces (who prefetches, who passed
``wrapper_groups``), and the warning for a one-rank topology among several initialised ranks."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch.distributed as dist

from seqpack._logging import warn_once
from seqpack.collective.groups import this_rank
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.config import PackingConfig
from seqpack.options import MAX_PREFETCH, DataOwner
from seqpack.topology import Topology

__all__ = ["check_ownership", "construction_words", "warn_if_alone"]

logger = logging.getLogger(__name__)


def construction_words(prefetch: Any, has_groups: bool) -> np.ndarray:
    """The int64 words the construction agreement reduces by MAX: this rank's prefetch,
    whether it passed ``wrapper_groups`` and whether it did not (both set after the MAX: the
    ranks differ)."""
    depth = prefetch if isinstance(prefetch, int) and 0 <= prefetch <= MAX_PREFETCH else 0
    return np.array([depth, int(has_groups), int(not has_groups)], dtype=np.int64)


def warn_if_alone(topology: Topology) -> bool:
    """Warn (once per process) when ``topology`` has one rank while a process group of
    several is initialised: each rank would schedule its own data alone, with microbatch
    counts that differ between ranks (an FSDP/DDP loop goes out of step). Not when the
    topology was built with ``Topology.single(allow_distributed=True)``. True when it warned."""
    if topology.world_size != 1 or topology.alone_on_purpose:
        return False
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return False
    return warn_once(
        logger,
        "alone",
        "wrap_data_iterator got a one-rank topology on rank %d of %d initialised ranks: every rank packs its own "
        "data alone, and microbatch counts differ between ranks (a DDP/FSDP loop goes out of step). Build the "
        "topology from your mesh (Topology.from_device_mesh) or groups (Topology.from_groups), or use "
        "Topology.single(allow_distributed=True) if each rank really trains alone",
        dist.get_rank(),
        dist.get_world_size(),
    )


def check_ownership(topology: Topology, config: PackingConfig, reads: bool, data_iterator: Any) -> None:
    """Refuse a data iterator on a rank that must not read, or none on one that must."""
    who = f"rank {this_rank()} ({topology.describe()})"
    rule = (
        "data_owner='all': every rank reads"
        if config.data_owner == DataOwner.ALL
        else "data_owner='tp0': only TP rank 0 of the first and last pipeline stages reads"
    )
    if reads and data_iterator is None:
        raise ConfigError(f"{who} got data_iterator=None but must read data ({rule})")
    if data_iterator is not None:
        kind = type(data_iterator)
        iterable = hasattr(kind, "__iter__") or (hasattr(kind, "__getitem__") and hasattr(kind, "__len__"))
        if not iterable or getattr(data_iterator, "ndim", 1) == 0:  # a 0-d tensor has __iter__, no items
            raise SeqpackTypeError(f"{who}: data_iterator must be an iterable of samples, got {kind.__name__}")
    if not reads and data_iterator is not None:
        raise ConfigError(f"{who} got a data_iterator but must not read data ({rule}); pass data_iterator=None")
