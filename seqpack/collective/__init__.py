"""Every collective the wrapper uses, one module per job, each callable on its own.

- ``groups``: group size / rank / device helpers (``None`` = one rank); ``cp_groups``: the
  CP process groups (dynamic CP: one per block a plan can use, created once).
- ``agree``: ranks settle on one status and compare fingerprints, in one small all-reduce.
- ``length_gather``: every DP rank's lengths, a rank's bad input raised on every rank.
- ``exchange``: every rank of a sequence's CP group gets its shard (a pure plan, then one
  all-to-all per dtype); ``payloads``: per-sample bytes beside the tokens.
- ``wire`` (with ``wire_plan``, ``wire_minibatches``): the int64 wire format of a step;
  ``broadcast``: the TP / PP broadcast in that format.
"""

from __future__ import annotations

from seqpack.collective.agree import (
    Agreement,
    Status,
    agree,
    agree_axes,
)
from seqpack.collective.broadcast import broadcast_pp, broadcast_step, broadcast_tp
from seqpack.collective.exchange import Exchanged, ExchangePlan, exchange_shards, plan_shard_exchange
from seqpack.collective.length_gather import GatheredLengths, gather_lengths
from seqpack.collective.wire import (
    FORMAT_VERSION,
    Kind,
    StepEnd,
    StepError,
    StepMessage,
    StepOk,
    WireBuffers,
    decode_prefix,
    decode_step,
    encode_step,
)

__all__ = [
    "FORMAT_VERSION",
    "Agreement",
    "ExchangePlan",
    "Exchanged",
    "GatheredLengths",
    "Kind",
    "Status",
    "StepEnd",
    "StepError",
    "StepMessage",
    "StepOk",
    "WireBuffers",
    "agree",
    "agree_axes",
    "broadcast_pp",
    "broadcast_step",
    "broadcast_tp",
    "decode_prefix",
    "decode_step",
    "encode_step",
    "exchange_shards",
    "gather_lengths",
    "plan_shard_exchange",
]
