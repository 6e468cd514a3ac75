"""TP and PP broadcast of one step in the wire format (:mod:`seqpack.collective.wire`).

:func:`broadcast_tp` sends TP rank 0's microbatches (tokens and layout) to the other TP
ranks; :func:`broadcast_pp` sends the first pipeline stage's layout to the other stages.
The source's global rank is read from the group's membership, never computed.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from seqpack.collective.groups import collective, comm_device, global_rank, group_rank, group_size
from seqpack.collective.wire import (
    PREFIX_WORDS,
    Kind,
    StepError,
    StepMessage,
    WireBuffers,
    decode_prefix,
    decode_step,
    encode_step,
)
from seqpack.errors import ConfigError

__all__ = ["broadcast_pp", "broadcast_step", "broadcast_tp"]


def broadcast_step(
    msg: StepMessage | None,
    group: ProcessGroup | None,
    *,
    kind: int = Kind.BATCH,
    src: int = 0,
    decode: bool = True,
    timings: dict[str, float] | None = None,
) -> StepMessage | None:
    """Broadcast one step from group rank ``src`` to the rest of ``group``; all ranks call it.

    The source passes its message and gets it back unchanged; receivers pass ``None`` and
    get the decoded message (``None`` with ``decode=False``). ``timings``, when given,
    accumulates ``"wait"``: seconds a receiver spent waiting for the source.
    """
    if group_size(group) == 1:
        if msg is None:
            raise ConfigError("a single-rank broadcast needs the message")
        return msg
    me = group_rank(group)
    src_global = global_rank(group, src)
    device = comm_device(group)
    if me == src:
        if msg is None:
            raise ConfigError(f"group rank {src} is the broadcast source and must pass the message")
        try:
            wire = encode_step(msg, kind=kind)
        except Exception as exc:  # the receivers wait in the broadcast: send them the failure instead
            what = f"{type(exc).__name__}: {exc}"
            msg = StepError(
                msg.step, f"step {msg.step}: broadcast failed on global rank {src_global}: {what}", src_global
            )
            wire = encode_step(msg, kind=kind)
        for buffer in (wire.prefix, wire.ints, wire.floats, wire.message):  # the header makes ints non-empty
            if buffer.numel():
                collective(dist.broadcast, buffer.to(device), src_global, group=group)
        return msg
    prefix = torch.empty(PREFIX_WORDS, dtype=torch.int64, device=device)
    tick = time.perf_counter()
    collective(dist.broadcast, prefix, src_global, group=group)
    if timings is not None:
        timings["wait"] = timings.get("wait", 0.0) + time.perf_counter() - tick
    p = decode_prefix(prefix)
    ints = torch.empty(p.ints_len, dtype=torch.int64, device=device)
    floats = torch.empty(p.float_words, dtype=torch.float32, device=device)
    message = torch.empty(p.message_bytes, dtype=torch.uint8, device=device)
    for buffer in (ints, floats, message):
        if buffer.numel():
            collective(dist.broadcast, buffer, src_global, group=group)
    if not decode:
        return None
    return decode_step(WireBuffers(prefix.cpu(), ints.cpu(), floats.cpu(), message.cpu()))


def broadcast_tp(
    msg: StepMessage | None, group: ProcessGroup | None, *, timings: dict[str, float] | None = None
) -> StepMessage:
    """TP broadcast: TP rank 0's microbatches (tokens and layout) to the other TP ranks."""
    out = broadcast_step(msg, group, kind=Kind.BATCH, src=0, timings=timings)
    assert out is not None  # decode=True always returns the message
    return out


def broadcast_pp(
    msg: StepMessage | None,
    group: ProcessGroup | None,
    *,
    decode: bool = True,
    timings: dict[str, float] | None = None,
) -> StepMessage | None:
    """PP broadcast: the first stage's layout to the other stages (receivers get batches
    whose ``input_ids``, ``labels`` and ``loss_mask`` are ``None``; the last stage, which
    reads its own data, passes ``decode=False``)."""
    return broadcast_step(msg, group, kind=Kind.LAYOUT, src=0, decode=decode, timings=timings)
