"""Per-sequence cost and model FLOPs: what a microbatch costs to run, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``:
dense layers (projections, MLP, logits, Mamba mixers) scale with tokens, attention scores
and values with the square of each sequence's length. The schedulers balance these costs.

Modules:

* :mod:`~seqpack.cost.model`: :class:`CostModel` (the coefficients, per-sequence costs, the
  fit to measured times) and :class:`ModelSpec` (a model's shape, its exact training FLOPs
  and FLOPs cost model), the presets and :func:`check_cost_model`.
* :mod:`~seqpack.cost.flops`: the FLOPs formulas per layer kind (exact ints) and
  :func:`mamba2_flops`.
* :mod:`~seqpack.cost.fit`: :func:`length_features` and the exact, reproducible NNLS fits.
* :mod:`~seqpack.cost.presets`: published model shapes as data.

Layering: ``presets``, ``flops`` and ``fit`` import no other cost module; ``model`` imports
them; nothing here imports the schedulers, the calibrator or the loader.
"""

from __future__ import annotations

from seqpack.cost.fit import length_features, nnls_fit, robust_nnls_fit, robust_weights_fit
from seqpack.cost.flops import mamba2_flops
from seqpack.cost.model import (
    DEFAULT_MODEL,
    MODEL_PRESETS,
    CostModel,
    ModelSpec,
    check_cost_model,
    default_cost_model,
    model_preset,
    transformer_flops,
)

__all__ = [
    "DEFAULT_MODEL",
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
]
