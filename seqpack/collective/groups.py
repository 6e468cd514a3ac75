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
    "all_gather",
    "all_gather_objects",
    "all_gather_rows",
    "all_to_all",
    "collective",
    "comm_device",
    "destroy_groups",
    "global_rank",
    "group_rank",
    "group_size",
    "new_axis_groups",
    "new_group",
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

    Why: a daemon thread blocked inside a torch collective that returns while the interpreter
    shuts down aborts the process; a thread that only polls can always be stopped first.
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


def all_gather(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Every rank's ``tensor`` (one shape on every rank), stacked in group-rank order on the CPU."""
    mine = tensor.to(comm_device(group))
    parts = [torch.empty_like(mine) for _ in range(group_size(group))]
    collective(dist.all_gather, parts, mine, group=group)
    return torch.stack(parts).cpu()


def all_gather_rows(rows: torch.Tensor, counts: list[int], group: ProcessGroup | None) -> torch.Tensor:
    """Every rank's ``rows`` (``counts[r]`` rows on group rank ``r``, one trailing shape),
    concatenated in group-rank order on the CPU: one all-gather of the rows padded to the
    largest count, none when every count is 0."""
    width = max(counts, default=0)
    if width == 0:
        return rows.new_zeros((0, *rows.shape[1:])).cpu()
    padded = rows.new_zeros((width, *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    table = all_gather(padded, group)  # [R, width, ...]
    return torch.cat([table[r, :n] for r, n in enumerate(counts)])


def all_to_all(
    send: torch.Tensor, send_split: list[int], recv_split: list[int], group: ProcessGroup | None
) -> torch.Tensor:
    """Rows of ``send`` (dim 0) to each group rank by ``send_split``; what arrives
    (``recv_split[r]`` rows from rank ``r``), in rank order on ``send``'s device."""
    device = comm_device(group)
    out = torch.empty((sum(recv_split), *send.shape[1:]), dtype=send.dtype, device=device)
    collective(
        dist.all_to_all_single,
        out,
        send.contiguous().to(device),
        output_split_sizes=recv_split,
        input_split_sizes=send_split,
        group=group,
    )
    return out.to(send.device)


def all_gather_objects(obj: Any, group: ProcessGroup | None) -> list[Any]:
    """Every rank's ``obj`` in group-rank order (pickled; use off the hot path only).

    Two :func:`collective` all-gathers (sizes, then the padded bytes) rather than
    ``dist.all_gather_object``, so that a producer thread can abandon it too.
    """
    if group is None or group_size(group) == 1:
        return [obj]
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    counts = all_gather(torch.tensor([data.numel()], dtype=torch.int64), group)[:, 0].tolist()
    parts = torch.split(all_gather_rows(data, counts, group), counts)
    return [pickle.loads(part.numpy().tobytes()) for part in parts]


def new_group(ranks: list[int], backend: str | None, timeout: datetime.timedelta | None) -> Any:
    """``dist.new_group`` over ``ranks`` in their given order (collective over the default group)."""
    # new_group sorts the ranks unless told not to; ask only when it matters (older torch).
    order: dict[str, Any] = {} if ranks == sorted(ranks) else {"sort_ranks": False}
    return dist.new_group(ranks, timeout=timeout, backend=backend, **order)


def new_axis_groups(
    topology: Topology,
    *,
    backend: str = "gloo",
    timeout: datetime.timedelta | None = None,
    axes: Iterable[str] | None = None,
) -> dict[str, Any]:
    """New process groups over the same ranks, in the same group-rank order, as the axis
    groups of ``topology`` (axes of size 1, and those not in ``axes``, get ``None``).

    Collective over the whole default group, like ``torch.distributed.new_group``: every
    rank calls ``new_group`` for every group of every axis (the world-wide counter names
    groups alike on every rank) and keeps the ones it belongs to.

    Args:
        topology: The grid; it must span the whole default group.
        backend: Backend of the new groups (``"gloo"``: CPU tensors, also when the model
            trains on NCCL).
        timeout: How long a collective on the new groups waits for its peers before
            failing (``None``: torch's default for the backend).
        axes: The axes to create groups for (``None``: every axis); every rank passes the same.

    Raises:
        ConfigError: ``torch.distributed`` is not initialised or the topology spans fewer
            ranks than the default group.
    """
    names = [axis.value for axis in AXES]
    wanted = names if axes is None else [str(axis) for axis in axes]
    made = [axis for axis in names if axis in wanted and topology.size(axis) > 1]
    if not made:
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
    mine = [(topology.global_ranks(axis)[0], topology.rank(axis)) for axis in made]
    everyone = all_gather_objects(mine, dist.group.WORLD)
    out: dict[str, Any] = dict.fromkeys(names)
    me = dist.get_rank()
    for i, axis in enumerate(made):
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
            group = new_group(ranks, backend, timeout)  # in the axis group's order: pipeline stages are ordered
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
