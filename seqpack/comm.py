"""Old import path of the wrapper's collectives; they live in :mod:`seqpack.collective` now."""

from __future__ import annotations

from seqpack._compat import warn_moved
from seqpack.collective import (
    FORMAT_VERSION,
    STATUS_END,
    STATUS_ERROR,
    STATUS_OK,
    Exchanged,
    ExchangePlan,
    GatheredLengths,
    StepEnd,
    StepError,
    StepMessage,
    StepOk,
    WireBuffers,
    agree_status,
    broadcast_pp,
    broadcast_step,
    broadcast_tp,
    decode_prefix,
    decode_step,
    encode_step,
    exchange_samples,
    gather_lengths,
    plan_exchange,
)
from seqpack.collective.wire import PREFIX_WORDS, Kind
from seqpack.thd import batch_from_layout

KIND_BATCH = Kind.BATCH
KIND_LAYOUT = Kind.LAYOUT

warn_moved(__name__, "seqpack.collective", stacklevel=2)

__all__ = [
    "FORMAT_VERSION",
    "KIND_BATCH",
    "KIND_LAYOUT",
    "PREFIX_WORDS",
    "STATUS_END",
    "STATUS_ERROR",
    "STATUS_OK",
    "ExchangePlan",
    "Exchanged",
    "GatheredLengths",
    "StepEnd",
    "StepError",
    "StepMessage",
    "StepOk",
    "WireBuffers",
    "agree_status",
    "batch_from_layout",
    "broadcast_pp",
    "broadcast_step",
    "broadcast_tp",
    "decode_prefix",
    "decode_step",
    "encode_step",
    "exchange_samples",
    "gather_lengths",
    "plan_exchange",
]
