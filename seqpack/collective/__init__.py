"""Every collective the wrapper uses, one module per job, each callable on its own.

- :mod:`~seqpack.collective.groups`: group size / rank / device helpers (``None`` = one rank).
- :mod:`~seqpack.collective.agree`: :func:`agree`: ranks settle on one
  status (ok / end / error, with the failing rank's message) and compare fingerprints, in
  one small all-reduce.
- :mod:`~seqpack.collective.length_gather`: :func:`gather_lengths`: every DP rank's lengths, with a
  per-rank header that turns one rank's bad input into an error on every rank.
- :mod:`~seqpack.collective.exchange`: the exchange (every rank of a sequence's CP group
  gets its shard, whole samples without CP; a pure plan, :func:`plan_shard_exchange`, and one
  all-to-all per dtype, :func:`exchange_shards`) for static and dynamic CP;
  :mod:`~seqpack.collective.cp_groups`: the CP process groups (dynamic CP: one per block a
  plan can use, created once).
- :mod:`~seqpack.collective.wire`: the int64 wire format of a step (:class:`StepOk`,
  :class:`StepEnd`, :class:`StepError`; header declared once), as pure functions;
  :mod:`~seqpack.collective.wire_plan` the plan it carries (static or dynamic CP).
- :mod:`~seqpack.collective.broadcast`: :func:`broadcast_tp` / :func:`broadcast_pp` in that format.
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
