"""``PackingConfig(encoder_rebalance=)``'s values and where they can run (docs/multimodal.md,
"Encoder rebalancing"). The route itself is the model's:
:func:`seqpack.interop.hf_encoder.rebalance_encoder`."""

from __future__ import annotations

from typing import Literal

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.thd.mrope import MRopeSpec
from seqpack.topology import Topology

__all__ = ["EncoderRebalanceMode", "check_encoder_rebalance", "encoder_rebalance_mode"]

EncoderRebalanceMode = Literal["auto"] | bool
"""``"auto"``: route a round's images where the round time saved (the route puts a barrier between
the encoder and the language model) pays for the exchange;
``True``: wherever the plan moves an image; ``False``: every image encoded where its sequence runs."""


def encoder_rebalance_mode(value: object) -> EncoderRebalanceMode:
    """``value`` as a mode.

    Raises:
        SeqpackTypeError: Neither a string nor a bool.
        ConfigError: Another string.
    """
    if value is True or value is False:
        return value
    if not isinstance(value, str):
        raise SeqpackTypeError(
            f"encoder_rebalance must be 'auto', True or False, got {type(value).__name__} {value!r:.60}"
        )
    if value != "auto":
        raise ConfigError(f"encoder_rebalance must be 'auto', True or False, got {value!r:.60}")
    return "auto"


def check_encoder_rebalance(
    value: object, *, mrope: MRopeSpec | None, topology: Topology | None = None
) -> EncoderRebalanceMode:
    """A config's ``value`` checked (and, with ``topology``, checked against it).

    Raises:
        ConfigError: A value other than ``"auto"``, ``True``, ``False``; ``True`` without
            ``mrope`` (no images to move), or on a topology the route does not run on: one DP
            rank, CP > 1 or pipeline parallelism (``"auto"`` there is simply off).
    """
    mode = encoder_rebalance_mode(value)
    if mode is not True:
        return mode
    if mrope is None:
        raise ConfigError("encoder_rebalance=True needs mrope=MRopeSpec.from_hf(config): text samples have no images")
    if topology is None:
        return True
    where = f"encoder_rebalance=True on {topology.describe()}"
    if topology.dp_size < 2:
        raise ConfigError(f"{where}: one DP rank has no other rank to encode on; use 'auto' or False")
    if topology.cp_size > 1 or topology.pp_size > 1:
        raise ConfigError(
            f"{where}: the route runs over the DP ranks of a round without CP or pipeline stages; use cp_size=1 and "
            "pp_size=1, or 'auto' / False"
        )
    return True
