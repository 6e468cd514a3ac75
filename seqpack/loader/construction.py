"""What the wrapper checks and agrees on at construction besides the configuration: iterator
ownership, a topology over part of the job, the settings compared under
``validate_ranks=False``, the construction agreement's words, a one-rank topology."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch.distributed as dist

from seqpack._logging import warn_once
from seqpack.collective.groups import this_rank
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.config import PackingConfig
from seqpack.options import AXES, DataOwner, fingerprint_text
from seqpack.schedulers import Scheduler
from seqpack.topology import Topology

__all__ = ["check_covers_job", "check_ownership", "compared_settings", "construction_words", "warn_if_alone"]

logger = logging.getLogger(__name__)


def construction_words(prefetch: int, has_groups: bool) -> np.ndarray:
    """The int64 words the construction agreement reduces by MAX: this rank's (validated)
    prefetch, whether it passed ``wrapper_groups`` and whether it did not (both set after the
    MAX: the ranks differ)."""
    return np.array([prefetch, int(has_groups), int(not has_groups)], dtype=np.int64)


def check_covers_job(topology: Topology, config: PackingConfig, has_groups: bool) -> None:
    """Refuse a topology over part of the initialised job, unless built with ``partial=True``
    (and then one that would need groups created over the whole job). A one-rank topology is
    :func:`warn_if_alone`'s."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    world, spans = dist.get_world_size(), topology.world_size or 1  # set by __post_init__
    if spans == world or spans == 1:
        return
    if spans > world:
        raise ConfigError(
            f"the topology spans {spans} ranks ({topology.describe()}) but {world} are initialised: build it from "
            "the mesh or the process groups of this job"
        )
    grid = f"the topology spans {spans} of the {world} initialised ranks ({topology.describe()})"
    if not topology.partial:
        instead = topology.mesh_hint or "the mesh of the whole job (or groups of every axis: Topology.from_groups)"
        raise ConfigError(
            f"{grid}: the ranks outside it pack their own copy, so data keyed by DP rank is delivered once per "
            f"copy and an axis it leaves out gets batches not cut for it; build it from {instead}, or pass "
            "partial=True (Topology.from_device_mesh(mesh, partial=True), Topology.from_groups(..., partial=True)) "
            "if each part should pack alone (one wrapper per pipeline stage, say)"
        )
    if config.prefetch > 0 and not has_groups:
        raise ConfigError(
            f"{grid} (partial=True): prefetch={config.prefetch} runs on process groups the wrapper creates over "
            "the whole job; pass wrapper_groups=... (groups over the topology's ranks, or the topology) or prefetch=0"
        )
    if config.dynamic_cp:
        raise ConfigError(f"{grid} (partial=True): dynamic_cp creates its process groups over the whole job")


def compared_settings(topology: Topology, config: PackingConfig, scheduler: Scheduler) -> tuple[int, dict[str, str]]:
    """The fingerprint and fields (what a mismatch names) the construction agreement compares:
    every field of the config's summary, the axis sizes and ``validate_ranks`` (``scheduler``:
    the config's :meth:`~seqpack.loader.config.PackingConfig.build_scheduler`). Under
    ``validate_ranks=False``, only the settings every rank's plan and collectives are computed
    from, as plain values (not ``samples_per_rank``, nor the scheduler's options, cost model or
    calibrator, whose text may differ on equal settings).
    """
    sizes = {f"{axis}_size": str(topology.size(axis)) for axis in AXES} | {"validate_ranks": str(config.validate_ranks)}
    if config.validate_ranks:
        fingerprint = fingerprint_text(repr((config.fingerprint(scheduler), sorted(sizes.items()))))
        return fingerprint, {**config.summary(scheduler), **sizes}
    kept = {name: value for name, value in config.summary(scheduler).items() if name not in _NOT_COMPARED}
    kept["scheduler"] = scheduler.name or type(scheduler).__qualname__
    kept["calibrate"] = str(config.calibrate is not False)
    details = {**kept, **sizes}
    return fingerprint_text(repr(sorted(details.items()))), details


_NOT_COMPARED = frozenset({"samples_per_rank", "scheduler", "cost", "calibrate"})


def warn_if_alone(topology: Topology) -> bool:
    """Warn (once per process) when ``topology`` has one rank while a process group of
    several is initialised, unless it was built with ``allow_distributed=True`` (or
    ``partial=True``). True when it warned."""
    if topology.world_size != 1 or topology.partial:
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
