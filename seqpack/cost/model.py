"""CostModel (what a microbatch costs, from its lengths; terms: :mod:`seqpack.cost.terms`,
on a CP group: :mod:`seqpack.cost.ring`) and ModelSpec (a dense or hybrid model's shape,
vision encoder and exact training FLOPs). The two build each other, so they share this module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.cost.fit import check_timings, nnls_fit, robust_weights_fit
from seqpack.cost.flops import (
    TRAIN,
    attention_projection_forward,
    attention_score_forward,
    logits_forward,
    mamba2_forward_per_token,
    mlp_forward,
    parameter_count,
)
from seqpack.cost.interconnect import DEFAULT_INTERCONNECT, Interconnect, get_interconnect
from seqpack.cost.ring import GroupTerms
from seqpack.cost.shapes import ShapeOptions, check_layer_pattern, preset_shape
from seqpack.cost.terms import as_lengths, exact_sums, feature_names, window_feature, window_ratio
from seqpack.cost.vision_encoder import VisionSpec
from seqpack.cost.vision_language import model_fields_from_hf
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_bool, check_int, check_number, check_positive_int, check_window

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CostModel", "ModelSpec", "check_cost_model"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense transformer or a Mamba2/attention hybrid (and ``vision`` encoder), for FLOPs and cost.

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
        hybrid_layer_pattern: One letter per layer (:data:`~seqpack.cost.shapes.LAYER_TYPES`:
            ``M`` Mamba2, ``*`` attention, ``-`` MLP, ``W`` sliding-window attention); a dense
            model with mixed windows is a pattern too (``"W-*-"``).
        mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads, mamba_expand:
            Mamba2 mixer shape (``nheads`` defaults to ``expand*h/headdim``).
        name: A label for tables.
        window_size: Sliding-window attention's left window ``W`` (TE's ``window_size=(W,
            0)``), ``0 <= W <= 2**31 - 1``: every attention layer without a pattern, the
            ``W`` layers with one.
        vision: The vision encoder (:class:`~seqpack.cost.VisionSpec`); ``None`` for a
            text-only model. Keyword-only.
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
    window_size: int | None = None
    vision: VisionSpec | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.vision is not None and not isinstance(self.vision, VisionSpec):
            raise SeqpackTypeError(f"ModelSpec.vision must be a VisionSpec or None, got {type(self.vision).__name__}")
        # Stored as Python ints: numpy ints (np.int32(4096)) would overflow the FLOPs products.
        for field in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_expand"):
            object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        for field in ("num_query_groups", "vocab_size", "kv_channels", "mamba_num_heads"):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, check_int(field, getattr(self, field), minimum=1))
        if self.window_size is not None:
            object.__setattr__(self, "window_size", check_window("window_size", self.window_size))
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
        pattern = self.hybrid_layer_pattern
        if pattern is not None:
            check_layer_pattern(pattern, self.num_layers, self.window_size)
            if "M" in pattern and self.mamba_inner % self.mamba_head_dim and self.mamba_num_heads is None:
                raise ConfigError(
                    f"mamba_expand*hidden_size={self.mamba_inner} is not divisible by "
                    f"mamba_head_dim={self.mamba_head_dim}; pass mamba_num_heads"
                )

    @classmethod
    def from_hf(cls, config: Any) -> ModelSpec:
        """The spec of a Hugging Face config object (or of a model, read for its ``config``), with
        the fields (and the errors) of :func:`~seqpack.cost.vision_language.model_fields_from_hf`."""
        return cls(**model_fields_from_hf(config))

    @property
    def query_groups(self) -> int:
        return self.num_attention_heads if self.num_query_groups is None else self.num_query_groups

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def attention_kinds(self) -> tuple[int, int]:
        """``(full, windowed)`` attention layer counts."""
        p = self.hybrid_layer_pattern
        if p is not None:
            return p.count("*"), p.count("W")
        return (self.num_layers, 0) if self.window_size is None else (0, self.num_layers)

    @property
    def layer_counts(self) -> tuple[int, int, int]:
        """``(attention, mlp, mamba)`` layer counts (attention: full and windowed)."""
        if self.hybrid_layer_pattern is None:
            return self.num_layers, self.num_layers, 0
        p = self.hybrid_layer_pattern
        return p.count("*") + p.count("W"), p.count("-"), p.count("M")

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
        """Training FLOPs per ``s**2`` of the full attention layers."""
        full, _ = self.attention_kinds
        return TRAIN * full * attention_score_forward(self.query_width, self.causal)

    @property
    def windowed_flops(self) -> int:
        """Training FLOPs per unit of :func:`~seqpack.cost.terms.window_feature` of the
        sliding-window layers (per unit the same as a full layer per ``s**2``)."""
        _, windowed = self.attention_kinds
        return TRAIN * windowed * attention_score_forward(self.query_width, self.causal)

    def flops(self, seqlen_sum: int, seqlen_sq_sum: int, seqlen_window_sum: int | None = None) -> int:
        """Training FLOPs (forward + backward) of sequences with these length sums.

        Args:
            seqlen_sum: ``sum(s_i)`` over the sequences.
            seqlen_sq_sum: ``sum(s_i**2)``.
            seqlen_window_sum: ``sum(window_feature(s_i, window_size))``; needed when the
                model has sliding-window layers (:meth:`sequence_flops` takes lengths).

        Returns:
            Exact FLOPs (Python int).

        Raises:
            ConfigError: Sliding-window layers and no ``seqlen_window_sum``.
        """
        seqlen_sum = check_int("seqlen_sum", seqlen_sum, minimum=0)
        seqlen_sq_sum = check_int("seqlen_sq_sum", seqlen_sq_sum, minimum=0)
        total = self.linear_flops * seqlen_sum + self.quadratic_flops * seqlen_sq_sum
        if self.attention_kinds[1]:
            if seqlen_window_sum is None:
                raise ConfigError(
                    f"{self.name or 'this model'} has sliding-window layers: pass seqlen_window_sum "
                    "(or call sequence_flops(lengths))"
                )
            total += self.windowed_flops * check_int("seqlen_window_sum", seqlen_window_sum, minimum=0)
        return total

    def sequence_flops(self, lengths: Sequence[int] | np.ndarray) -> int:
        """Exact training FLOPs of sequences of these ``lengths`` (every term)."""
        return self.flops(*exact_sums(lengths, self.window_size, "lengths"))

    def sample_flops(self, length: int, image_grid_thw: Any = None, video_grid_thw: Any = None) -> int:
        """Exact training FLOPs of one sample: the language model over its ``length`` tokens
        (placeholders included) plus the vision encoder over its images and videos.

        Raises:
            ConfigError: Grids given to a model without a vision encoder.
        """
        text = self.sequence_flops([check_int("length", length, minimum=0)])
        if self.vision is not None:
            return text + self.vision.flops(image_grid_thw, video_grid_thw)
        if any(grid is not None and len(grid) for grid in (image_grid_thw, video_grid_thw)):
            raise ConfigError(f"{self.name or 'this model'} has no vision encoder (ModelSpec.vision) to cost images")
        return text

    def cost_model(self, constant: float = 0.0) -> CostModel:
        """A :class:`CostModel` in training FLOPs (the windowed term with sliding-window layers)."""
        # A window_size means sliding-window layers (check_layer_pattern): windowed is 0 without.
        terms = (float(self.linear_flops), float(self.quadratic_flops), constant, float(self.windowed_flops))
        return CostModel(*terms, window=self.window_size)

    def num_parameters(self) -> int:
        """Parameter count (bias-free linears, RMSNorm weights, untied embedding and output),
        a check against published model sizes."""
        return parameter_count(self)


@dataclasses.dataclass(frozen=True, repr=False)
class CostModel(GroupTerms):
    """``cost(s) = linear*s + quadratic*s**2 (+ windowed*w(s, window))``; a microbatch adds
    ``constant`` once, and on a CP group of ``c`` ranks the ring's terms (:mod:`seqpack.cost.ring`).

    Units are the coefficients': training FLOPs for :meth:`from_transformer`, tokens for
    ``CostModel(1, 0)``, seconds for :meth:`fit`. ``CostModel(0, 0, constant > 0)`` is valid
    (every microbatch costs the same). ``windowed`` needs a ``window`` ``W`` (per sequence
    :func:`~seqpack.cost.terms.window_feature`). At the ring fields' defaults the model costs,
    prints and compares exactly as ``CostModel(linear, quadratic, constant)``.

    The CP group's fields:

    * ``ring_step``: cost per ring step of a microbatch, times ``c - 1``.
    * ``ring_token``: cost per token per ring step within a node, times ``(c-1) S/c``;
      ``ring_token_inter`` the same for a group spanning nodes (``None``: ``ring_token``).
    * ``ranks_per_node``: DP x CP ranks on one node.
    * ``reference_size``: the group size the compute terms are the cost on (1: one rank
      alone); ``None``: the plan's static CP group.
    """

    linear: float
    quadratic: float
    constant: float = 0.0
    windowed: float = 0.0
    window: int | None = None
    ring_step: float = 0.0
    ring_token: float = 0.0
    ring_token_inter: float | None = None
    ranks_per_node: int = 8
    reference_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic", "constant", "windowed"):  # checked, kept as given (repr, eq)
            check_number(f"CostModel.{name}", getattr(self, name), minimum=0.0)
        if self.window is not None:
            object.__setattr__(self, "window", check_window("CostModel.window", self.window))
        elif self.windowed != 0:
            raise ConfigError(f"CostModel.windowed={self.windowed!r} needs a window (window=W tokens)")
        if self.linear == 0 and self.quadratic == 0 and self.constant == 0 and self.windowed == 0:
            which = "all three" if self.window is None else "all four (with windowed)"
            raise ConfigError(f"CostModel needs linear > 0 or quadratic > 0, or constant > 0 (got {which} 0)")
        for name in ("ring_step", "ring_token"):
            object.__setattr__(self, name, check_number(f"CostModel.{name}", getattr(self, name), minimum=0.0))
        inter = self.ring_token if self.ring_token_inter is None else self.ring_token_inter
        object.__setattr__(self, "ring_token_inter", check_number("CostModel.ring_token_inter", inter, minimum=0.0))
        object.__setattr__(self, "ranks_per_node", check_positive_int("ranks_per_node", self.ranks_per_node))
        if self.reference_size is not None:
            object.__setattr__(self, "reference_size", check_positive_int("reference_size", self.reference_size))

    def __repr__(self) -> str:
        text = f"CostModel(linear={self.linear!r}, quadratic={self.quadratic!r}, constant={self.constant!r}"
        if self.window is not None:
            text += f", windowed={self.windowed!r}, window={self.window!r}"
        defaults: dict[str, object] = {"ring_step": 0.0, "ring_token": 0.0, "ring_token_inter": self.ring_token}
        defaults.update(ranks_per_node=8, reference_size=None)
        ring = (f", {name}={getattr(self, name)!r}" for name, d in defaults.items() if getattr(self, name) != d)
        return text + "".join(ring) + ")"

    @property
    def terms(self) -> tuple[str, ...]:
        """The model's terms in feature order: ``("constant", "linear", "quadratic")``, and
        ``"windowed"`` with a window."""
        return feature_names(self.window)

    @property
    def coefficients(self) -> tuple[float, ...]:
        """The coefficients of :attr:`terms`, in that order."""
        return tuple(float(getattr(self, name)) for name in self.terms)

    def cost(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Cost of each sequence (float64, same shape as ``lengths``; no ``constant``)."""
        s = as_lengths(lengths)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.window is None:
                out = s * (self.linear + self.quadratic * s)
            else:  # w(s, W) = s * window_ratio: exactly quadratic*s**2's form below the window
                out = s * (self.linear + self.quadratic * s + self.windowed * window_ratio(s, self.window))
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
        """Fraction of one ``length``-token sequence's cost in its quadratic and windowed terms."""
        q = self.quadratic * float(length) ** 2
        if self.window is not None:
            q += self.windowed * float(window_feature(int(length), self.window))
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
        """:meth:`ModelSpec.cost_model` of this shape (the arguments and ``**options`` are
        :class:`ModelSpec` fields): coefficients in training FLOPs, ``constant`` the
        per-microbatch overhead in FLOPs."""
        shape = (hidden_size, num_layers, num_attention_heads, ffn_hidden_size, num_query_groups, vocab_size)
        return ModelSpec(*shape, causal=causal, **options).cost_model(constant)

    @classmethod
    def fit(
        cls,
        microbatches: Sequence[Sequence[int] | np.ndarray],
        seconds: Sequence[float] | np.ndarray,
        *,
        robust: bool = False,
        window: int | None = None,
    ) -> CostModel:
        """A measured cost model: ``seconds ~ constant + linear*S + quadratic*SS (+
        windowed*SW with a window)`` over microbatches, every coefficient >= 0.

        The fit is exact, scale-invariant non-negative least squares (:func:`nnls_fit`), so it
        never fails on finite positive timings: timings that do not grow with length give
        ``CostModel(0, 0, constant)``.

        Args:
            microbatches: Per microbatch, the (padded) lengths of its sequences.
            seconds: Measured time of each microbatch (real numbers).
            robust: Resist outlier timings (a first-step compile, a GC pause):
                :func:`robust_weights_fit`.
            window: Fit the windowed term too, for sliding-window attention of this window.

        Raises:
            SeqpackTypeError: A timing that is no real number (a string, a bool), named by
                index.
            ConfigError: Fewer than 3 microbatches, mismatched inputs, a timing that is NaN,
                infinite or <= 0 (named by index), or timings more than ~1e150 apart.
        """
        check_bool("robust", robust)
        window = None if window is None else check_window("window", window)
        features, y = check_timings(microbatches, seconds, window)
        coef = robust_weights_fit(features, y)[0] if robust else nnls_fit(features, y)
        return cls.from_coefficients(coef, window=window)

    @classmethod
    def from_coefficients(cls, coefficients: Sequence[float] | np.ndarray, *, window: int | None = None) -> CostModel:
        """``CostModel`` from the coefficients of its :attr:`terms` as :func:`nnls_fit`
        returns them (tiny negative rounding clipped to 0)."""
        values = [max(float(c), 0.0) for c in coefficients]
        names = feature_names(window)
        if len(values) != len(names):
            raise ConfigError(f"{len(names)} coefficients {names} expected, got {len(values)}")
        constant, linear, quadratic = values[:3]
        if window is None:
            return cls(linear, quadratic, constant)
        return cls(linear, quadratic, constant, windowed=values[3], window=window)

    def predict_sums(self, sums: np.ndarray) -> np.ndarray:
        """float64 cost of microbatches from their sums ``[..., len(terms) - 1]`` (the
        features of the terms after the constant: :func:`~seqpack.cost.terms.exact_sums`).

        Raises:
            ConfigError: The last axis does not hold one sum per term after the constant.
        """
        sums = np.asarray(sums)
        if sums.shape[-1:] != (len(self.terms) - 1,):
            raise ConfigError(f"{self!r} needs sums of {self.terms[1:]} in the last axis, got shape {sums.shape}")
        out = self.constant + self.linear * sums[..., 0] + self.quadratic * sums[..., 1]
        if self.window is not None:
            out = out + self.windowed * sums[..., 2]
        return np.asarray(out, dtype=np.float64)

    @classmethod
    def from_preset(cls, name: str, constant: float = 0.0) -> CostModel:
        """The cost model of a :data:`~seqpack.cost.MODEL_PRESETS` entry (e.g. ``"llama3-8b"``)."""
        return ModelSpec(**preset_shape(name), name=name).cost_model(constant)  # type: ignore[arg-type]

    @classmethod
    def from_model(
        cls, spec: ModelSpec, interconnect: str | Interconnect = DEFAULT_INTERCONNECT, *, dtype_bytes: int = 2
    ) -> CostModel:
        """A dynamic-CP prior in training FLOPs: ``spec``'s FLOPs cost model on one rank plus
        :meth:`from_te_p2p`'s ring over a named interconnect, in FLOPs at its ``device_flops``.

        Raises:
            ConfigError: ``spec`` has no attention layer (Mamba's CP exchange is not a
                ring: give its ring figures on the CostModel), or an unknown interconnect.
        """
        if not isinstance(spec, ModelSpec):
            raise SeqpackTypeError(f"spec must be a seqpack.cost.ModelSpec, got {type(spec).__name__}")
        links = get_interconnect(interconnect)
        if spec.layer_counts[0] == 0:
            raise ConfigError(
                f"model {spec.name or spec!r} has no attention layer, so its CP communication is not a ring: "
                "pass cost=seqpack.CostModel(..., ring_step=..., ring_token=...) with its figures"
            )
        seconds = cls.from_te_p2p(
            spec.cost_model(),
            attention_layers=spec.layer_counts[0],
            num_query_groups=spec.query_groups,
            head_dim=spec.head_dim,
            intra_node_bandwidth=links.intra_node_bandwidth,
            inter_node_bandwidth=links.inter_node_bandwidth,
            step_latency=links.step_latency,
            dtype_bytes=dtype_bytes,
            ranks_per_node=links.ranks_per_node,
        )
        return seconds.scaled_ring(links.device_flops)


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
