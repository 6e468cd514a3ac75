"""Per-sequence cost and model FLOPs: what a microbatch costs to run, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``,
plus ``windowed * sum(w(s_i, W))`` for sliding-window attention: dense layers (projections,
MLP, logits, Mamba mixers) scale with tokens, full attention with the square of each
sequence's length, windowed attention with it up to the window and linearly beyond. The
schedulers balance these costs (per sequence, from :meth:`CostModel.cost`).

Modules, lowest first:

* :mod:`~seqpack.cost.terms`: the terms of a cost model and their exact features
  (``S``, ``SS``, the window feature ``SW``), :func:`length_features`; how to add a term.
* :mod:`~seqpack.cost.shapes`: published model shapes as data, the hybrid pattern's letters.
* :mod:`~seqpack.cost.flops`: FLOPs formulas per layer kind (exact ints), :func:`mamba2_flops`.
* :mod:`~seqpack.cost.fit`: the exact, reproducible, scale-invariant NNLS fits.
* :mod:`~seqpack.cost.interconnect`: named interconnects (:data:`INTERCONNECTS`), the links
  a dynamic-CP ring prior is derived from.
* :mod:`~seqpack.cost.ring`: what a microbatch costs on a CP group of ``c`` ranks (its
  compute split over the group plus the CP ring), :func:`group_features`, :func:`spans_nodes`.
* :mod:`~seqpack.cost.vision_encoder`: :class:`VisionSpec`, a vision encoder's shape and its
  training FLOPs per image, video and sample.
* :mod:`~seqpack.cost.vision_language`: :class:`ModelSpec`'s vision-language half (its
  ``vision`` field, :meth:`ModelSpec.from_hf` for HF configs, :meth:`ModelSpec.sample_flops`).
* :mod:`~seqpack.cost.model`: :class:`CostModel`, the one cost type (coefficients,
  per-sequence costs, the fit to measured times, the CP ring's terms: zero for static CP,
  :meth:`CostModel.from_model` for a dynamic-CP prior), and :class:`ModelSpec` (a model's
  shape, exact training FLOPs, FLOPs cost model), which build each other;
  :func:`check_cost_model`.
* :mod:`~seqpack.cost.presets`: :data:`MODEL_PRESETS`, :func:`default_cost_model`,
  :func:`transformer_flops`.

Each module imports only modules listed before it; nothing here imports the schedulers,
the calibrator or the loader.
"""

from __future__ import annotations

from seqpack.cost.fit import nnls_fit, robust_nnls_fit, robust_weights_fit
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
    "robust_nnls_fit",
    "robust_weights_fit",
    "transformer_flops",
    "VisionSpec",
    "window_feature",
]
