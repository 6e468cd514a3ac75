"""Per-sample byte payloads through the exchange: what a sample carries beside its tokens (a
vision-language sample's, :mod:`seqpack.loader.vision_payload`) goes to the rank that runs it,
in one ``all_to_all_single`` of bytes whose split sizes every rank already knows."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.distributed import ProcessGroup

from seqpack.collective.groups import all_to_all
from seqpack.errors import ConfigError

__all__ = ["exchange_payloads"]


def exchange_payloads(
    encode: Callable[[int], torch.Tensor],
    sizes: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    group: ProcessGroup | None,
    *,
    rank: int,
    num_ranks: int,
) -> tuple[dict[int, torch.Tensor], int, int]:
    """Send every payload from the rank that holds it to the rank that runs it; every rank of
    the group calls it with the same ``sizes``, ``src`` and ``dst``.

    Args:
        encode: A payload's bytes (uint8 ``[sizes[gid]]``) by global id, on its ``src`` rank.
        sizes: int64 ``[N]`` bytes of every id's payload (0: none).
        src, dst: int64 ``[N]`` group rank holding and running each id (``dst`` -1: not
            run). Ids with ``src == dst`` or no payload do not move.
        group: The group (``None`` when it is one rank); ``rank`` and ``num_ranks`` in it.

    Returns:
        The payloads this rank received (global id to uint8 tensor, ascending per source),
        and the bytes it sent and received. The all-to-all is skipped on every rank when
        nothing moves.

    Raises:
        ConfigError: An encoded payload whose size is not its ``sizes`` entry (after the
            all-to-all, which then carries zeros: no peer is left waiting).
    """
    sizes, src, dst = (np.asarray(a, dtype=np.int64) for a in (sizes, src, dst))
    moving = (sizes > 0) & (dst >= 0) & (src != dst)
    if not moving.any():
        return {}, 0, 0
    out_ids = np.flatnonzero(moving & (src == rank))
    out_ids = out_ids[np.lexsort((out_ids, dst[out_ids]))]  # by destination, then id
    in_ids = np.flatnonzero(moving & (dst == rank))
    in_ids = in_ids[np.lexsort((in_ids, src[in_ids]))]
    send_split = np.bincount(dst[out_ids], weights=sizes[out_ids], minlength=num_ranks).astype(np.int64)
    recv_split = np.bincount(src[in_ids], weights=sizes[in_ids], minlength=num_ranks).astype(np.int64)
    failure: Exception | None = None
    parts = []
    for gid in out_ids.tolist():
        data = encode(gid)
        if data.dtype != torch.uint8 or data.numel() != sizes[gid]:
            failure = ConfigError(
                f"the payload of global sample {gid} encodes to {data.numel()} bytes ({data.dtype}) but the length "
                f"gather announced {int(sizes[gid])}"
            )
            break
        parts.append(data)
    total = int(send_split.sum())
    send = torch.cat(parts) if parts and failure is None else torch.zeros(total, dtype=torch.uint8)
    received = all_to_all(send, send_split.tolist(), recv_split.tolist(), group)
    if failure is not None:
        raise failure
    pieces = torch.split(received, sizes[in_ids].tolist())
    return dict(zip(in_ids.tolist(), pieces, strict=True)), total, int(received.numel())
