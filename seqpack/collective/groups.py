"""Process-group helpers every collective of seqpack uses.

A group of ``None`` stands for a single rank: every helper answers for it without touching
``torch.distributed``, so the same code runs in one process and on many.

:func:`new_axis_groups` creates groups for the wrapper alone (its background producer runs
its collectives there, never on the groups the model uses); :func:`destroy_groups` frees
them. :func:`collective` runs one collective; inside :func:`abandonable` (the producer
thread) it polls the collective instead of blocking in it, so that the thread can leave a
collective a dead or hung peer never completes.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from seqpack.errors import ConfigError
from seqpack.options import AXES

if TYPE_CHECKING:
    from seqpack.topology import Topology

__all__ = [
    "CollectiveAbandoned",
    "abandonable",
    "all_gather_objects",
    "collective",
    "comm_device",
    "destroy_groups",
    "global_rank",
    "group_rank",
    "group_size",
    "new_axis_groups",
    "this_rank",
]

logger = logging.getLogger(__name__)

_THREAD = threading.local()


class CollectiveAbandoned(RuntimeError):
    """A thread left a collective that had not completed because it was asked to stop."""


@contextlib.contextmanager
def abandonable(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Within it, this thread's :func:`collective` calls poll their work and raise
    :class:`CollectiveAbandoned` once ``should_stop()`` is true.

    Why: a daemon thread blocked inside a torch collective returns into Python when a peer
    finally exits; if that happens while the interpreter shuts down, CPython ends the thread
    from inside pybind11's GIL guard and the process aborts ("terminate called without an
    active exception"). A thread that only polls can always be stopped before shutdown.
    """
    previous = getattr(_THREAD, "should_stop", None)
    _THREAD.should_stop = should_stop
    try:
        yield
    finally:
        _THREAD.should_stop = previous


def collective(call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)`` (a ``torch.distributed`` collective), blocking; inside
    :func:`abandonable` it runs with ``async_op=True`` and is polled (sleeps growing from
    10 us to 1 ms: a producer thread's latency is off the critical path)."""
    should_stop = getattr(_THREAD, "should_stop", None)
    if should_stop is None:
        call(*args, **kwargs)
        return
    work = call(*args, async_op=True, **kwargs)
    pause = 1e-5
    while not work.is_completed():
        if should_stop():
            raise CollectiveAbandoned(f"{getattr(call, '__name__', 'a collective')} left unfinished: the thread stops")
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    work.wait()  # raises what the collective raised


def group_size(group: ProcessGroup | None) -> int:
    """Ranks in ``group`` (1 for ``None``)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: ProcessGroup | None) -> int:
    """This rank's index in ``group`` (0 for ``None``)."""
    return 0 if group is None else dist.get_rank(group)


def global_rank(group: ProcessGroup | None, rank_in_group: int) -> int:
    """Global rank of ``rank_in_group``, read from the group's membership, never computed."""
    if group is None:
        return this_rank()
    return dist.get_global_rank(group, rank_in_group)


def this_rank() -> int:
    """This process's global rank (0 without ``torch.distributed``)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def comm_device(group: ProcessGroup | None) -> torch.device:
    """Device collectives on ``group`` need: CUDA for NCCL, CPU otherwise."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_objects(obj: Any, group: ProcessGroup | None) -> list[Any]:
    """Every rank's ``obj`` in group-rank order (pickled; use off the hot path only).

    Two :func:`collective` all-gathers (sizes, then the padded bytes) rather than
    ``dist.all_gather_object``, so that a producer thread can abandon it too.
    """
    size = group_size(group)
    if group is None or size == 1:
        return [obj]
    data = pickle.dumps(obj)
    device = comm_device(group)
    mine = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(mine) for _ in range(size)]
    collective(dist.all_gather, sizes, mine, group=group)
    counts = [int(t) for t in sizes]
    buffer = torch.zeros(max(counts), dtype=torch.uint8)
    buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffer = buffer.to(device)
    parts = [torch.empty_like(buffer) for _ in range(size)]
    collective(dist.all_gather, parts, buffer, group=group)
    return [pickle.loads(part[:count].cpu().numpy().tobytes()) for part, count in zip(parts, counts, strict=True)]


def new_axis_groups(
    topology: Topology, *, backend: str = "gloo", timeout: datetime.timedelta | None = None
) -> dict[str, Any]:
    """New process groups over the same ranks, in the same group-rank order, as the axis
    groups of ``topology`` (axes of size 1 get ``None``).

    Collective over the whole default group, like ``torch.distributed.new_group``: every
    rank calls it, in the same order relative to its other group creations. One
    ``all_gather_objects`` of two integers per axis and rank tells every rank the members of
    every group; then every rank calls ``new_group`` for every group of every axis (the
    world-wide counter names groups alike on every rank, which the hashed names of
    ``use_local_synchronization`` do not guarantee) and keeps the ones it belongs to.

    Args:
        topology: The grid; it must span the whole default group.
        backend: Backend of the new groups (``"gloo"``: CPU tensors, also when the model
            trains on NCCL).
        timeout: How long a collective on the new groups waits for its peers before
            failing (``None``: torch's default for the backend).

    Raises:
        ConfigError: ``torch.distributed`` is not initialised or the topology spans fewer
            ranks than the default group.
    """
    names = [axis.value for axis in AXES]
    axes = [axis for axis in names if topology.size(axis) > 1]
    if not axes:
        return dict.fromkeys(names)
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("new_axis_groups needs torch.distributed to be initialised")
    world = dist.get_world_size()
    if topology.world_size != world:
        raise ConfigError(
            f"the wrapper's own process groups are created over the whole default group ({world} ranks) but this "
            f"topology spans {topology.world_size}: pass wrapper_groups=... (groups over the topology's ranks) or "
            "prefetch=0"
        )
    # Per axis, the global rank of this rank's group leader (group rank 0) and this rank's
    # group rank: every group of the axis, with its members in order, follows.
    mine = [(topology.global_ranks(axis)[0], topology.rank(axis)) for axis in axes]
    everyone = all_gather_objects(mine, dist.group.WORLD)
    out: dict[str, Any] = dict.fromkeys(names)
    me = dist.get_rank()
    for i, axis in enumerate(axes):
        members: dict[int, dict[int, int]] = {}
        for rank, entries in enumerate(everyone):
            leader, position = entries[i]
            members.setdefault(int(leader), {})[int(position)] = rank
        for leader in sorted(members):
            ranks = [members[leader][p] for p in sorted(members[leader])]
            if len(ranks) != topology.size(axis):
                raise ConfigError(
                    f"the {axis} groups do not form a grid: the group led by rank {leader} has ranks {ranks}, "
                    f"not {topology.size(axis)}"
                )
            # new_group sorts the ranks unless told not to; keep the axis group's order
            # (pipeline stages are ordered), and ask only when it matters (older torch).
            order: dict[str, Any] = {} if ranks == sorted(ranks) else {"sort_ranks": False}
            group = dist.new_group(ranks, timeout=timeout, backend=backend, **order)
            if me in ranks:
                out[axis] = group
    return out


def destroy_groups(groups: Iterable[Any]) -> None:
    """Destroy process groups, skipping ``None`` and groups already gone (for example
    after ``destroy_process_group()`` of the whole world); never raises."""
    for group in groups:
        if group is None:
            continue
        try:
            dist.destroy_process_group(group)
        except Exception as exc:  # already destroyed, or torch.distributed torn down
            logger.debug("could not destroy a process group: %s", exc)
