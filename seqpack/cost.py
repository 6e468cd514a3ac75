"""Per-sequence cost and model FLOPs: what a microbatch costs to run, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``:
dense layers (projections, MLP, logits, Mamba mixers) scale with tokens, attention scores
and values with the square of each sequence's length.

:class:`ModelSpec` describes a dense or hybrid (Mamba2 + attention) model and gives its
training FLOPs (forward + backward = 3x forward, 2 FLOPs per multiply-add) from
``seqlen_sum = sum(s_i)`` and ``seqlen_sq_sum = sum(s_i**2)``. The terms follow
Megatron-LM's ``num_floating_point_operations``: causal attention counts half of the
``QK^T`` and ``(QK^T)V`` products, Mamba2 layers count in/out projections and a ``7*d_inner*d_state``
scan per token. FLOPs are exact Python ints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.validation import check_bool, check_int

__all__ = [
    "CostModel",
    "DEFAULT_MODEL",
    "MODEL_PRESETS",
    "ModelSpec",
    "default_cost_model",
    "length_features",
    "mamba2_flops",
    "model_preset",
    "nnls_fit",
    "robust_nnls_fit",
    "robust_weights_fit",
    "transformer_flops",
]

# Training = forward + backward (backward costs two forwards); a multiply-add is 2 FLOPs.
_TRAIN = 3
_FMA = 2


def _mamba2_forward_per_token(hidden: int, d_inner: int, state: int, groups: int, heads: int) -> int:
    """Forward FLOPs per token of one Mamba2 mixer: in_proj, SSD scan, out_proj."""
    in_proj = _FMA * hidden * (2 * d_inner + 2 * groups * state + heads)
    scan = 7 * d_inner * state
    out_proj = _FMA * d_inner * hidden
    return in_proj + scan + out_proj


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    return check_int(name, value, minimum=minimum)


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
            object.__setattr__(self, field, _check_int(field, getattr(self, field)))
        for field in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_expand"):
            object.__setattr__(self, field, _check_int(field, getattr(self, field)))
        for field in ("num_query_groups", "vocab_size", "kv_channels", "mamba_num_heads"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, _check_int(field, getattr(self, field)))
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

    # -- forward FLOPs per token (linear) and per squared length (quadratic) ---------------
    def _attention_linear(self) -> int:
        """Forward FLOPs per token of one attention layer's Q, K, V and output projections."""
        q = self.num_attention_heads * self.head_dim
        kv = self.query_groups * self.head_dim
        return _FMA * self.hidden_size * (q + 2 * kv) + _FMA * q * self.hidden_size

    def _attention_quadratic(self) -> int:
        """Forward FLOPs per ``s**2`` of one attention layer (``QK^T`` and ``(QK^T)V``)."""
        q = self.num_attention_heads * self.head_dim
        full = 2 * _FMA * q  # two s x s x (heads*head_dim) products
        return full // 2 if self.causal else full

    def _mlp_linear(self) -> int:
        projections = 3 if self.gated_linear_unit else 2
        return _FMA * projections * self.hidden_size * self.ffn_hidden_size

    def _mamba_linear(self) -> int:
        return _mamba2_forward_per_token(
            self.hidden_size, self.mamba_inner, self.mamba_state_dim, self.mamba_num_groups, self.mamba_heads
        )

    def _logits_linear(self) -> int:
        return 0 if self.vocab_size is None else _FMA * self.hidden_size * self.vocab_size

    @property
    def linear_flops(self) -> int:
        """Training FLOPs per token (everything that scales with ``seqlen_sum``)."""
        attention, mlp, mamba = self.layer_counts
        forward = (
            attention * self._attention_linear()
            + mlp * self._mlp_linear()
            + mamba * self._mamba_linear()
            + self._logits_linear()
        )
        return _TRAIN * forward

    @property
    def quadratic_flops(self) -> int:
        """Training FLOPs per squared sequence length (scales with ``seqlen_sq_sum``)."""
        attention, _, _ = self.layer_counts
        return _TRAIN * attention * self._attention_quadratic()

    def flops(self, seqlen_sum: int, seqlen_sq_sum: int) -> int:
        """Training FLOPs (forward + backward) of sequences with these length sums.

        Args:
            seqlen_sum: ``sum(s_i)`` over the sequences (real lengths for exact accounting;
                Megatron feeds padded ones).
            seqlen_sq_sum: ``sum(s_i**2)``.

        Returns:
            Exact FLOPs as a Python int.
        """
        seqlen_sum = _check_int("seqlen_sum", seqlen_sum, 0)
        seqlen_sq_sum = _check_int("seqlen_sq_sum", seqlen_sq_sum, 0)
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
    "llama3-8b": ModelSpec(4096, 32, 32, 14336, num_query_groups=8, vocab_size=128256, name="llama3-8b"),
    "llama3-70b": ModelSpec(8192, 80, 64, 28672, num_query_groups=8, vocab_size=128256, name="llama3-70b"),
    "llama3-405b": ModelSpec(16384, 126, 128, 53248, num_query_groups=8, vocab_size=128256, name="llama3-405b"),
    "qwen2.5-7b": ModelSpec(3584, 28, 28, 18944, num_query_groups=4, vocab_size=152064, name="qwen2.5-7b"),
    "nemotron-h-8b": ModelSpec(
        4096,
        52,
        32,
        21504,
        num_query_groups=8,
        vocab_size=131072,
        kv_channels=128,
        gated_linear_unit=False,
        hybrid_layer_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        mamba_state_dim=128,
        mamba_head_dim=64,
        mamba_num_groups=8,
        mamba_num_heads=128,
        name="nemotron-h-8b",
    ),
}
"""Published shapes: Llama 3 (8B/70B/405B), Qwen2.5-7B and Nemotron-H-8B (hybrid)."""

DEFAULT_MODEL = "llama3-8b"
"""The model whose FLOPs ``balanced`` balances when no cost model is given."""


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
    **options,
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


def mamba2_flops(
    seqlen_sum: int,
    *,
    hidden_size: int,
    num_layers: int = 1,
    state_dim: int = 128,
    head_dim: int = 64,
    num_groups: int = 8,
    num_heads: int | None = None,
    expand: int = 2,
) -> int:
    """Training FLOPs of ``num_layers`` Mamba2 mixers over ``seqlen_sum`` tokens.

    Linear in tokens: in_proj ``2h(2*d_inner + 2*groups*state + heads)``, the SSD scan
    ``7*d_inner*state`` and out_proj ``2*d_inner*h`` per token, times 3 for training.
    """
    seqlen_sum = _check_int("seqlen_sum", seqlen_sum, 0)
    # Python ints: numpy ints would overflow the products below.
    hidden_size, num_layers = _check_int("hidden_size", hidden_size), _check_int("num_layers", num_layers)
    state_dim, head_dim = _check_int("state_dim", state_dim), _check_int("head_dim", head_dim)
    num_groups, expand = _check_int("num_groups", num_groups), _check_int("expand", expand)
    d_inner = expand * hidden_size
    if num_heads is None:
        if d_inner % head_dim:
            raise ConfigError(f"expand*hidden_size={d_inner} is not divisible by head_dim={head_dim}; pass num_heads")
        num_heads = d_inner // head_dim
    per_token = _mamba2_forward_per_token(
        hidden_size, d_inner, state_dim, num_groups, _check_int("num_heads", num_heads)
    )
    return _TRAIN * num_layers * per_token * seqlen_sum


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
        **options,
    ) -> CostModel:
        """Coefficients from a transformer's training FLOPs (GQA aware; causal halves the
        attention scores and values).

        Args:
            hidden_size, num_layers, num_attention_heads, ffn_hidden_size,
                num_query_groups, vocab_size, causal: Model shape (see :class:`ModelSpec`).
            **options: Further :class:`ModelSpec` fields, and ``constant`` (per-microbatch
                overhead in FLOPs, default 0).

        Returns:
            ``CostModel(linear=FLOPs per token, quadratic=FLOPs per s**2, constant)``.
        """
        constant = options.pop("constant", 0.0)
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


# -- fitting ------------------------------------------------------------------------------

# Every support (non-empty subset of the three coefficients) an NNLS solution can have.
# Smallest first: a larger support must beat a smaller one by more than rounding to win.
_SUPPORTS: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
_TIE = 1e-12  # residual improvements below this fraction of |y|^2 are rounding
_HUBER = 1.345  # Huber's constant (95% efficiency under Gaussian noise)
_BISQUARE = 4.685  # Tukey's bisquare constant (95% efficiency)
_MIN_SCALE = 0.1  # relative-residual scale floor (see robust_nnls_fit)
_IRLS_STEPS = 20  # per weight rule


def length_features(microbatches: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    """float64 ``[n, 3]``: ``(1, S, SS)`` per microbatch (``S`` / ``SS`` summed as exact ints)."""
    rows = np.empty((len(microbatches), 3), dtype=np.float64)
    for i, mb in enumerate(microbatches):
        lengths = np.asarray(mb).reshape(-1)
        if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
            if not (np.all(np.isfinite(lengths)) and np.all(lengths == np.round(lengths))):
                raise SeqpackTypeError(f"microbatch {i} lengths must be integers, got {lengths.dtype}")
        values = [int(v) for v in lengths.tolist()]
        if any(v < 0 for v in values):
            raise ConfigError(f"microbatch {i} has a negative length: {min(values)}")
        rows[i] = (1.0, float(sum(values)), float(sum(v * v for v in values)))
    return rows


def nnls_fit(features: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Exact non-negative least squares of ``y ~ features @ coef`` with ``coef >= 0``.

    With three unknowns every support is solved by unconstrained least squares (columns
    scaled to 1) and the feasible solution with the smallest (weighted) residual kept: the
    NNLS optimum is the least-squares solution on its own support, so this is exact. Of
    solutions equally good up to rounding, the one with fewer coefficients wins (flat
    timings give exactly ``(constant, 0, 0)``).

    Bit-for-bit reproducible on any machine: the normal equations are summed with
    ``math.fsum`` (correctly rounded, whatever the order) and solved in Python floats, so
    ranks that fit the same data get the same model (no BLAS, whose summation order
    depends on the CPU).

    Args:
        features: ``[n, k]`` (k <= 3; :func:`length_features`).
        y: ``[n]`` targets.
        weights: Optional ``[n]`` non-negative row weights (weighted least squares).

    Returns:
        float64 ``[k]`` coefficients, all >= 0.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    k = x.shape[1]
    scale = np.abs(x).max(axis=0) if x.size else np.ones(k)
    scale[scale == 0] = 1.0
    xs = [x[:, j] / scale[j] for j in range(k)]
    gram = [[math.fsum(w * xs[i] * xs[j]) for j in range(k)] for i in range(k)]
    rhs = [math.fsum(w * xs[i] * y) for i in range(k)]
    total = math.fsum(w * y * y)
    best, best_residual = [0.0] * k, total
    for support in _SUPPORTS:
        if max(support) >= k:
            continue
        sol = _solve([[gram[i][j] for j in support] for i in support], [rhs[i] for i in support])
        if sol is None or any(v < 0 or not math.isfinite(v) for v in sol):
            continue
        # |y - X c|^2 = y'y - 2 c'X'y + c'X'X c, from the sums already taken.
        fit = math.fsum(c * rhs[i] for c, i in zip(sol, support, strict=True))
        quad = math.fsum(sol[a] * sol[b] * gram[i][j] for a, i in enumerate(support) for b, j in enumerate(support))
        value = total - 2.0 * fit + quad
        if value < best_residual - _TIE * total:
            best, best_residual = [0.0] * k, value
            for c, i in zip(sol, support, strict=True):
                best[i] = c
    return np.array(best, dtype=np.float64) / scale


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting in Python floats; None when singular."""
    n = len(b)
    a = [row[:] + [b[i]] for i, row in enumerate(a)]
    largest = max(abs(a[i][i]) for i in range(n))
    if largest == 0:
        return None
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-13 * largest:
            return None  # collinear columns (e.g. every microbatch holds the same tokens)
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - math.fsum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out


def robust_nnls_fit(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Outlier-resistant NNLS on relative errors ``r = (y - pred) / y``.

    Rows are weighted ``w(r/s) / y**2`` (relative least squares: a 5% miss counts the same on
    a 10 ms and a 100 ms microbatch) with robust weights ``w`` from the median absolute
    deviation ``s`` of ``r`` (times 1.4826, at least 10%: a model that cannot follow every
    bump of a real clock must not reject its points): Huber's first (convex, so the start
    does not matter), then Tukey's bisquare, which gives weight 0 to points more than
    4.685 scales off (at least ~47%: a 3x-slow compile step or GC pause has ``r = 0.67``).
    Outliers are ignored as long as they are fewer than the rest.
    """
    return robust_weights_fit(features, y)[0]


def robust_weights_fit(features: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`robust_nnls_fit`'s coefficients and its final robust weights ``w`` (0 for
    rejected points; the row weights were ``w / y**2``)."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    base = 1.0 / (y * y)
    coef = nnls_fit(x, y, base)
    weights = np.ones_like(y)
    for rule in ("huber", "bisquare"):
        for _ in range(_IRLS_STEPS):
            r = (y - _predict(x, coef)) / y
            s = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), _MIN_SCALE)
            u = np.abs(r) / s
            if rule == "huber":
                w = np.minimum(1.0, _HUBER / np.maximum(u, _HUBER))
            else:
                w = np.where(u < _BISQUARE, (1 - (u / _BISQUARE) ** 2) ** 2, 0.0)
            if np.count_nonzero(w) < x.shape[1]:
                return coef, weights
            new = nnls_fit(x, y, w * base)
            done = np.allclose(new, coef, rtol=1e-9, atol=1e-300)
            coef, weights = new, w
            if done:
                break
    return coef, weights


def _predict(x: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``x @ coef`` column by column (no BLAS: the same bits on every CPU)."""
    out = np.zeros(x.shape[0], dtype=np.float64)
    for j in range(x.shape[1]):
        out = out + x[:, j] * coef[j]
    return out
