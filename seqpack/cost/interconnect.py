"""Named interconnects: the links a CP ring runs over, as priors for a dynamic-CP cost
(:meth:`CostModel.from_model <seqpack.cost.CostModel.from_model>`). The figures are vendor peak
rates, so the prior is optimistic about the links; calibration refits every coefficient.
"""

from __future__ import annotations

import dataclasses

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_number, check_positive_int

__all__ = ["ASSUMED_MFU", "DEFAULT_INTERCONNECT", "INTERCONNECTS", "Interconnect", "get_interconnect"]

ASSUMED_MFU = 0.4
"""Fraction of dense bf16 peak a training step sustains (the presets' ``device_flops``)."""


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The links of one cluster kind and its GPUs' sustained rate.

    * ``intra_node_bandwidth``, ``inter_node_bandwidth``: bytes per second one GPU sends to
      its ring neighbour inside a node (NVLink: half the bidirectional figure), and across
      nodes (one NIC per GPU).
    * ``step_latency``: seconds of fixed cost per ring transfer.
    * ``device_flops``: training FLOPs per second one GPU sustains (dense bf16 peak times
      :data:`ASSUMED_MFU`), which turns the ring's seconds into FLOPs.
    """

    name: str
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    step_latency: float
    device_flops: float
    ranks_per_node: int = 8

    def __post_init__(self) -> None:
        for field in ("intra_node_bandwidth", "inter_node_bandwidth", "device_flops"):
            value = check_number(f"Interconnect.{field}", getattr(self, field), minimum=0.0, allow_zero=False)
            object.__setattr__(self, field, value)
        latency = check_number("Interconnect.step_latency", self.step_latency, minimum=0.0)
        object.__setattr__(self, "step_latency", latency)
        object.__setattr__(self, "ranks_per_node", check_positive_int("ranks_per_node", self.ranks_per_node))


# NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU; NVLink 3 (A100 SXM): 600 GB/s.
# InfiniBand NDR 400 Gb/s = 50 GB/s per GPU's NIC, HDR 200 Gb/s = 25 GB/s. Dense bf16 peak:
# H100/H200 SXM 989 TFLOPS, A100 312 TFLOPS. 20 us per ring transfer (kernel launch and
# the send/receive handshake of a P2P exchange).
INTERCONNECTS: dict[str, Interconnect] = {
    spec.name: spec
    for spec in (
        Interconnect("h100-nvlink-ib400", 450e9, 50e9, 20e-6, ASSUMED_MFU * 989e12),
        Interconnect("h200-nvlink-ib400", 450e9, 50e9, 20e-6, ASSUMED_MFU * 989e12),
        Interconnect("a100-nvlink-ib200", 300e9, 25e9, 20e-6, ASSUMED_MFU * 312e12),
    )
}
"""The named presets, by name."""

DEFAULT_INTERCONNECT = "h100-nvlink-ib400"
"""What ``PackingConfig(dynamic_cp=True)`` assumes when given no ring figures."""


def get_interconnect(interconnect: str | Interconnect) -> Interconnect:
    """An :class:`Interconnect` by name (:data:`INTERCONNECTS`), or the one given.

    Raises:
        ConfigError: An unknown name (the valid ones are listed).
        SeqpackTypeError: Neither a name nor an ``Interconnect``.
    """
    if isinstance(interconnect, Interconnect):
        return interconnect
    if not isinstance(interconnect, str):
        raise SeqpackTypeError(
            f"interconnect must be a name or a seqpack.cost.Interconnect, got {type(interconnect).__name__}"
        )
    try:
        return INTERCONNECTS[interconnect]
    except KeyError:
        raise ConfigError(
            f"unknown interconnect {interconnect!r}; valid: {', '.join(INTERCONNECTS)} "
            "(or a seqpack.cost.Interconnect with your own figures)"
        ) from None
