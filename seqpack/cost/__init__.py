"""Per-sequence cost and model FLOPs: what a microbatch costs to run, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``
(plus a windowed term for sliding-window attention and, on CP groups, the CP ring's terms):
:class:`CostModel`, the one cost type. :class:`ModelSpec` gives a model's exact training
FLOPs and its FLOPs cost model.

Modules, lowest first: ``terms``, ``shapes``, ``flops``, ``fit``, ``interconnect``, ``ring``,
``vision_encoder``, ``vision_language``, ``model``, ``presets``; each imports only modules
before it, and nothing here imports the schedulers, the calibrator or the loader.
"""

from __future__ import annotations

from seqpack.cost.fit import nnls_fit, robust_weights_fit
from seqpack.cost.flops import mamba2_flops
from seqpack.cost.interconnect import DEFAULT_INTERCONNECT, INTERCONNECTS, Interconnect, get_interconnect
from seqpack.cost.model import CostModel, ModelSpec, check_cost_model
from seqpack.cost.presets import DEFAULT_MODEL, MODEL_PRESETS, default_cost_model, model_preset, transformer_flops
from seqpack.cost.ring import FEATURES, group_features, spans_nodes
from seqpack.cost.terms import length_features, window_feature
from seqpack.cost.vision_encoder import VisionSpec

__all__ = [
    "DEFAULT_INTERCONNECT",
    "DEFAULT_MODEL",
    "INTERCONNECTS",
    "Interconnect",
    "get_interconnect",
    "FEATURES",
    "group_features",
    "spans_nodes",
    "MODEL_PRESETS",
    "CostModel",
    "ModelSpec",
    "check_cost_model",
    "default_cost_model",
    "length_features",
    "mamba2_flops",
    "model_preset",
    "nnls_fit",
    "robust_weights_fit",
    "transformer_flops",
    "VisionSpec",
    "window_feature",
]
