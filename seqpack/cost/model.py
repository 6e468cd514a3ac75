"""CostModel and ModelSpec: what a microbatch costs to run, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``
(:class:`CostModel`): dense layers (projections, MLP, logits, Mamba mixers) scale with
tokens, attention scores and values with the square of each sequence's length.

:class:`ModelSpec` describes a dense or hybrid (Mamba2 + attention) model and gives its
training FLOPs from ``seqlen_sum = sum(s_i)`` and ``seqlen_sq_sum = sum(s_i**2)`` (formulas:
:mod:`seqpack.cost.flops`) and its FLOPs cost model. The two types build each other
(:meth:`ModelSpec.cost_model`, :meth:`CostModel.from_transformer`, :meth:`CostModel.from_preset`),
so they share this module; :data:`MODEL_PRESETS` holds the published shapes of
:mod:`seqpack.cost.presets`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from seqpack.cost.fit import length_features, nnls_fit, robust_nnls_fit
from seqpack.cost.flops import (
    TRAIN,
    attention_projection_forward,
    attention_score_forward,
    logits_forward,
    mamba2_forward_per_token,
    mlp_forward,
)
from seqpack.cost.presets import DEFAULT_MODEL, PRESET_SHAPES
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.validation import check_bool, check_int

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_PRESETS",
    "CostModel",
    "ModelSpec",
    "check_cost_model",
    "default_cost_model",
    "model_preset",
    "transformer_flops",
]


class ShapeOptions(TypedDict, total=False):
    """The optional :class:`ModelSpec` fields (besides ``causal``), as keyword arguments."""

    kv_channels: int | None
    gated_linear_unit: bool
    hybrid_layer_pattern: str | None
    mamba_state_dim: int
    mamba_head_dim: int
    mamba_num_groups: int
    mamba_num_heads: int | None
    mamba_expand: int
    name: str


class FlopsOptions(ShapeOptions, total=False):
    """Keyword arguments of :func:`transformer_flops` beyond the shape it names."""

    causal: bool


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense transformer or a Mamba2/attention hybrid, for FLOPs and cost.

    Attributes:
        hidden_size: Model width ``h``.
        num_layers: Transformer layers (each attention + MLP), or, with
            ``hybrid_layer_pattern``, the pattern's length.
        num_attention_heads: Query heads.
        ffn_hidden_size: MLP inner width (per projection; ``intermediate_size`` in HF).
        num_query_groups: Key/value heads (GQA); ``None`` means multi-head attention.
        vocab_size: Output vocabulary; ``None`` leaves the logits layer out.
        kv_channels: Head dimension; default ``hidden_size // num_attention_heads``.
        gated_linear_unit: SwiGLU-style MLP with three projections (default, as in Llama,
            Qwen, Mistral); ``False`` for two (GELU, squared ReLU).
        causal: Causal attention computes half of the score and value products.
        hybrid_layer_pattern: Megatron's hybrid pattern: ``M`` Mamba2, ``*`` attention,
            ``-`` MLP layer, one character per layer.
        mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads, mamba_expand:
            Mamba2 mixer shape (``d_state``, ``headdim``, ``ngroups``, ``nheads`` (default
            ``expand*h/headdim``), ``expand``).
        name: A label for tables.
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    num_query_groups: int | None = None
    vocab_size: int | None = None
    kv_channels: int | None = None
    gated_linear_unit: bool = True
    causal: bool = True
    hybrid_layer_pattern: str | None = None
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None
    mamba_expand: int = 2
    name: str = ""

    def __post_init__(self) -> None:
        # Stored as Python ints: numpy ints (np.int32(4096)) would overflow the FLOPs products.
        for field in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_expand"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("num_query_groups", "vocab_size", "kv_channels", "mamba_num_heads"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("gated_linear_unit", "causal"):
            check_bool(field, getattr(self, field))
        groups = self.query_groups
        if self.num_attention_heads % groups:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_query_groups={groups}"
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "pass kv_channels"
            )
        if self.hybrid_layer_pattern is not None:
            bad = sorted(set(self.hybrid_layer_pattern) - set("M*-"))
            if bad:
                raise ConfigError(
                    f"hybrid_layer_pattern {self.hybrid_layer_pattern!r} has unknown layer types {bad}; "
                    "use M (Mamba2), * (attention), - (MLP)"
                )
            if len(self.hybrid_layer_pattern) != self.num_layers:
                raise ConfigError(
                    f"hybrid_layer_pattern has {len(self.hybrid_layer_pattern)} layers but num_layers={self.num_layers}"
                )
            if (self.mamba_expand * self.hidden_size) % self.mamba_head_dim and self.mamba_num_heads is None:
                raise ConfigError(
                    f"mamba_expand*hidden_size={self.mamba_expand * self.hidden_size} is not divisible by "
                    f"mamba_head_dim={self.mamba_head_dim}; pass mamba_num_heads"
                )

    # -- shape helpers -------------------------------------------------------------------
    @property
    def query_groups(self) -> int:
        return self.num_attention_heads if self.num_query_groups is None else self.num_query_groups

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def layer_counts(self) -> tuple[int, int, int]:
        """``(attention, mlp, mamba)`` layer counts."""
        if self.hybrid_layer_pattern is None:
            return self.num_layers, self.num_layers, 0
        p = self.hybrid_layer_pattern
        return p.count("*"), p.count("-"), p.count("M")

    @property
    def mamba_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    @property
    def mamba_heads(self) -> int:
        if self.mamba_num_heads is not None:
            return self.mamba_num_heads
        return self.mamba_inner // self.mamba_head_dim

    @property
    def query_width(self) -> int:
        """``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    @property
    def linear_flops(self) -> int:
        """Training FLOPs per token (everything that scales with ``seqlen_sum``)."""
        attention, mlp, mamba = self.layer_counts
        kv_width = self.query_groups * self.head_dim
        forward = (
            attention * attention_projection_forward(self.hidden_size, self.query_width, kv_width)
            + mlp * mlp_forward(self.hidden_size, self.ffn_hidden_size, self.gated_linear_unit)
            + mamba
            * mamba2_forward_per_token(
                self.hidden_size, self.mamba_inner, self.mamba_state_dim, self.mamba_num_groups, self.mamba_heads
            )
            + logits_forward(self.hidden_size, self.vocab_size)
        )
        return TRAIN * forward

    @property
    def quadratic_flops(self) -> int:
        """Training FLOPs per squared sequence length (scales with ``seqlen_sq_sum``)."""
        attention, _, _ = self.layer_counts
        return TRAIN * attention * attention_score_forward(self.query_width, self.causal)

    def flops(self, seqlen_sum: int, seqlen_sq_sum: int) -> int:
        """Training FLOPs (forward + backward) of sequences with these length sums.

        Args:
            seqlen_sum: ``sum(s_i)`` over the sequences (real lengths for exact accounting;
                Megatron feeds padded ones).
            seqlen_sq_sum: ``sum(s_i**2)``.

        Returns:
            Exact FLOPs as a Python int.
        """
        seqlen_sum = check_int("seqlen_sum", seqlen_sum, minimum=0)
        seqlen_sq_sum = check_int("seqlen_sq_sum", seqlen_sq_sum, minimum=0)
        return self.linear_flops * seqlen_sum + self.quadratic_flops * seqlen_sq_sum

    def cost_model(self, constant: float = 0.0) -> CostModel:
        """A :class:`CostModel` in training FLOPs: ``linear`` per token, ``quadratic`` per s**2."""
        return CostModel(float(self.linear_flops), float(self.quadratic_flops), constant)

    def num_parameters(self) -> int:
        """Parameter count (bias-free linears, RMSNorm weights, untied embedding and output).

        A check against published model sizes; FLOPs do not depend on it.
        """
        h = self.hidden_size
        q = self.num_attention_heads * self.head_dim
        kv = self.query_groups * self.head_dim
        attention_layer = h * (q + 2 * kv) + q * h + h
        mlp_layer = (3 if self.gated_linear_unit else 2) * h * self.ffn_hidden_size + h
        d_in, g, n, heads = self.mamba_inner, self.mamba_num_groups, self.mamba_state_dim, self.mamba_heads
        conv_channels = d_in + 2 * g * n
        mamba_layer = (
            h * (2 * d_in + 2 * g * n + heads)  # in_proj
            + conv_channels * 5  # depthwise conv1d (kernel 4) + bias
            + 3 * heads  # dt_bias, A_log, D
            + d_in  # gated RMSNorm
            + d_in * h  # out_proj
            + h  # pre-norm
        )
        attention, mlp, mamba = self.layer_counts
        vocab = 0 if self.vocab_size is None else 2 * self.vocab_size * h
        return attention * attention_layer + mlp * mlp_layer + mamba * mamba_layer + vocab + h


MODEL_PRESETS: dict[str, ModelSpec] = {
    name: ModelSpec(**shape, name=name)  # type: ignore[arg-type]
    for name, shape in PRESET_SHAPES.items()
}
"""Published shapes (:data:`seqpack.cost.presets.PRESET_SHAPES`): Llama 3 (8B/70B/405B),
Qwen2.5-7B and Nemotron-H-8B (Mamba2/attention hybrid)."""


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered as ``name`` in :data:`MODEL_PRESETS`.

    Raises:
        ValueError: Unknown name (the message lists the known ones).
    """
    try:
        return MODEL_PRESETS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        raise ConfigError(f"unknown model preset {name!r}; available: {', '.join(sorted(MODEL_PRESETS))}") from None


def default_cost_model() -> CostModel:
    """Training FLOPs of :data:`DEFAULT_MODEL` (Llama-3-8B shaped): what ``balanced`` uses
    when ``cost=None``. Attention is 12.5% of an 8K-token sequence's cost under it."""
    return MODEL_PRESETS[DEFAULT_MODEL].cost_model()


def transformer_flops(
    hidden_size: int,
    num_layers: int,
    num_attention_heads: int,
    ffn_hidden_size: int,
    num_query_groups: int | None = None,
    vocab_size: int | None = None,
    *,
    seqlen_sum: int,
    seqlen_sq_sum: int,
    **options: Unpack[FlopsOptions],
) -> int:
    """Training FLOPs (forward + backward) of a transformer over packed sequences.

    Args:
        hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups,
            vocab_size: Model shape (see :class:`ModelSpec`).
        seqlen_sum: ``sum(s_i)``.
        seqlen_sq_sum: ``sum(s_i**2)``.
        **options: Further :class:`ModelSpec` fields (``causal``, ``gated_linear_unit``,
            ``kv_channels``, ``hybrid_layer_pattern`` and the ``mamba_*`` shape).

    Returns:
        Exact FLOPs (Python int).
    """
    spec = ModelSpec(
        hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups, vocab_size, **options
    )
    return spec.flops(seqlen_sum, seqlen_sq_sum)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """``cost(s) = linear*s + quadratic*s**2``; a microbatch adds ``constant`` once.

    Units are whatever the coefficients are in: training FLOPs for
    :meth:`from_transformer`, tokens for ``CostModel(1, 0)``, seconds for :meth:`fit`.
    ``CostModel(0, 0, constant)`` with ``constant > 0`` is valid: every microbatch costs the
    same whatever it holds (a launch-bound GPU).
    """

    linear: float
    quadratic: float
    constant: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic", "constant"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise SeqpackTypeError(f"CostModel.{name} must be a number, got {value!r}")
            try:
                number = float(value)
            except OverflowError:  # an int past float64
                number = math.inf
            if not math.isfinite(number) or number < 0:
                raise ConfigError(f"CostModel.{name} must be finite and >= 0, got {value!r}")
        if self.linear == 0 and self.quadratic == 0 and self.constant == 0:
            raise ConfigError("CostModel needs linear > 0 or quadratic > 0, or constant > 0 (got all three 0)")

    def cost(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Cost of each sequence (float64, same shape as ``lengths``; no ``constant``)."""
        s = np.asarray(lengths)
        if s.dtype.kind not in "iuf":  # strings, bools, complex, objects that are no numbers
            numbers = None
            try:
                numbers = np.asarray(lengths, dtype=np.float64) if s.dtype.kind == "O" else None
            except (TypeError, ValueError, OverflowError):
                pass
            if numbers is None:
                raise SeqpackTypeError(f"lengths must be numbers, got {lengths!r:.60}")
            s = numbers
        if s.dtype.kind == "f" and s.size and not (np.all(np.isfinite(s)) and np.abs(s).max() < 2.0**63):
            raise ConfigError(f"lengths must be finite and within int64, got {lengths!r:.60}")
        s = s.astype(np.float64, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            out = s * (self.linear + self.quadratic * s)
        if out.size and not np.all(np.isfinite(out)):
            worst = float(np.abs(s).max())
            raise ConfigError(
                f"the cost of a {worst:.6g}-token sequence under {self!r} is past float64: "
                "scale the coefficients down (only their ratios matter to a scheduler)"
            )
        return out

    def microbatch_cost(self, lengths: Sequence[int] | np.ndarray) -> float:
        """Cost of one microbatch holding sequences of ``lengths``."""
        with np.errstate(over="ignore"):
            total = float(self.constant + self.cost(lengths).sum())
        if not math.isfinite(total):
            raise ConfigError(f"a microbatch's cost under {self!r} is past float64: scale the coefficients down")
        return total

    def quadratic_share(self, length: int) -> float:
        """Fraction of one ``length``-token sequence's cost spent in the quadratic term."""
        q = self.quadratic * float(length) ** 2
        total = self.linear * float(length) + q
        return q / total if total > 0 else 0.0

    @classmethod
    def tokens(cls) -> CostModel:
        """Cost = tokens: balances token counts, ignoring attention's quadratic term."""
        return cls(1.0, 0.0)

    @classmethod
    def from_transformer(
        cls,
        hidden_size: int,
        num_layers: int,
        num_attention_heads: int,
        ffn_hidden_size: int,
        num_query_groups: int | None = None,
        vocab_size: int | None = None,
        causal: bool = True,
        *,
        constant: float = 0.0,
        **options: Unpack[ShapeOptions],
    ) -> CostModel:
        """Coefficients from a transformer's training FLOPs (GQA aware; causal halves the
        attention scores and values).

        Args:
            hidden_size, num_layers, num_attention_heads, ffn_hidden_size,
                num_query_groups, vocab_size, causal: Model shape (see :class:`ModelSpec`).
            constant: Per-microbatch overhead in FLOPs.
            **options: Further :class:`ModelSpec` fields.

        Returns:
            ``CostModel(linear=FLOPs per token, quadratic=FLOPs per s**2, constant)``.
        """
        spec = ModelSpec(
            hidden_size,
            num_layers,
            num_attention_heads,
            ffn_hidden_size,
            num_query_groups,
            vocab_size,
            causal=causal,
            **options,
        )
        return spec.cost_model(constant)

    @classmethod
    def fit(
        cls,
        microbatches: Sequence[Sequence[int] | np.ndarray],
        seconds: Sequence[float] | np.ndarray,
        *,
        robust: bool = False,
    ) -> CostModel:
        """A measured cost model: ``seconds ~ constant + linear*S + quadratic*SS`` over
        microbatches (``S``/``SS``: sum of lengths / of squared lengths), every coefficient
        >= 0.

        The fit is exact non-negative least squares (:func:`nnls_fit`: every support of the
        three coefficients is solved and the best feasible one kept), so it never fails on
        finite positive timings: timings that do not grow with length give a
        constant-only model, ``CostModel(0, 0, constant)`` ("every microbatch costs the
        same").

        Useful when kernels are not equally efficient: on CPU, attention runs far below GEMM
        speed, so its real cost is more quadratic than its FLOPs say; on a launch-bound GPU
        a microbatch costs a large constant.

        Args:
            microbatches: Per microbatch, the (padded) lengths of its sequences.
            seconds: Measured time of each microbatch.
            robust: Resist outlier timings (a first-step compile, a GC pause): fit relative
                errors (``(seconds - model) / model``), downweighting points far from the
                rest (iteratively reweighted NNLS, Huber then Tukey's bisquare on a MAD
                scale; :func:`robust_nnls_fit`).

        Raises:
            ConfigError: Fewer than 3 microbatches, mismatched inputs, or a timing that is
                NaN, infinite or <= 0 (named by index).
        """
        check_bool("robust", robust)
        for name, value in (("microbatches", microbatches), ("seconds", seconds)):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or getattr(value, "ndim", 1) == 0:
                raise SeqpackTypeError(f"{name} must be a list (one entry per microbatch), got {type(value).__name__}")
        if len(microbatches) != len(seconds):
            raise ConfigError(f"{len(microbatches)} microbatches but {len(seconds)} timings (seconds)")
        if len(microbatches) < 3:
            raise ConfigError(f"fitting 3 coefficients needs at least 3 timed microbatches, got {len(microbatches)}")
        try:
            y = np.asarray(seconds, dtype=np.float64).reshape(len(seconds))
        except (TypeError, ValueError):
            raise SeqpackTypeError(f"seconds must hold one number per microbatch, got {seconds!r:.60}") from None
        bad = np.flatnonzero(~np.isfinite(y) | (y <= 0))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(
                f"timings must be finite and > 0: seconds[{i}]={float(y[i])!r} ({bad.size} bad timing(s))"
            )
        try:
            features = length_features(microbatches)
        except SeqpackError:
            raise
        except (TypeError, ValueError):
            raise SeqpackTypeError(f"microbatches must hold lists of lengths, got {microbatches!r:.60}") from None
        coef = robust_nnls_fit(features, y) if robust else nnls_fit(features, y)
        return cls.from_coefficients(coef)

    @classmethod
    def from_coefficients(cls, coefficients: Sequence[float] | np.ndarray) -> CostModel:
        """``CostModel`` from ``(constant, linear, quadratic)`` as :func:`nnls_fit` returns
        them (tiny negative rounding clipped to 0)."""
        constant, linear, quadratic = (max(float(c), 0.0) for c in coefficients)
        return cls(linear, quadratic, constant)

    def predict(self, seqlen_sum: float, seqlen_sq_sum: float) -> float:
        """Cost of one microbatch from its length sums ``S`` and ``SS``."""
        return float(self.constant + self.linear * seqlen_sum + self.quadratic * seqlen_sq_sum)

    @classmethod
    def from_preset(cls, name: str, constant: float = 0.0) -> CostModel:
        """The cost model of a :data:`MODEL_PRESETS` entry (e.g. ``"llama3-8b"``)."""
        return model_preset(name).cost_model(constant)


def check_cost_model(name: str, value: object) -> CostModel | None:
    """``value`` if it is ``None`` or a :class:`CostModel`.

    Raises:
        SeqpackTypeError: Anything else; a :class:`ModelSpec` gets the hint to call its
            ``cost_model()``.
    """
    if value is not None and not isinstance(value, CostModel):
        hint = " (ModelSpec.cost_model() gives one)" if hasattr(value, "cost_model") else ""
        raise SeqpackTypeError(f"{name} must be a seqpack.CostModel or None, got {type(value).__name__}{hint}")
    return value
