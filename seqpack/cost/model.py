"""CostModel: what a microbatch costs to run on its CP group, from its lengths.

A microbatch of sequences ``s_i`` costs ``constant + sum(linear*s_i + quadratic*s_i**2)``,
plus ``windowed * sum(w(s_i, W))`` for sliding-window attention (the terms:
:mod:`seqpack.cost.terms`): dense layers (projections, MLP, logits, Mamba mixers) scale with
tokens, full attention with the square of each sequence's length, windowed attention with
``s**2`` up to the window and linearly beyond. On a CP group of ``c`` ranks the compute is
split ``c`` ways and the CP ring adds its terms (``ring_step``, ``ring_token``,
``ring_token_inter``; zero by default, so a static plan's figures are the compute terms'
own): :mod:`seqpack.cost.ring`. :class:`~seqpack.cost.ModelSpec` (a model's shape) gives
the FLOPs model (:meth:`CostModel.from_transformer`, :meth:`CostModel.from_model`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from seqpack.cost.fit import check_timings, nnls_fit, robust_nnls_fit
from seqpack.cost.interconnect import DEFAULT_INTERCONNECT, Interconnect, get_interconnect
from seqpack.cost.ring import TE_P2P_TRANSFERS, group_features
from seqpack.cost.shapes import ShapeOptions, preset_shape
from seqpack.cost.spec import ModelSpec
from seqpack.cost.terms import as_lengths, feature_names, window_feature, window_ratio
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.validation import check_bool, check_number, check_positive_int, check_window

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CostModel", "check_cost_model"]


@dataclasses.dataclass(frozen=True, repr=False)
class CostModel:
    """``cost(s) = linear*s + quadratic*s**2 (+ windowed*w(s, window))``; a microbatch adds
    ``constant`` once, and on a CP group of ``c`` ranks the CP ring's terms
    (:mod:`seqpack.cost.ring`).

    Units are whatever the coefficients are in: training FLOPs for
    :meth:`from_transformer`, tokens for ``CostModel(1, 0)``, seconds for :meth:`fit`.
    ``CostModel(0, 0, constant)`` with ``constant > 0`` is valid: every microbatch costs the
    same whatever it holds (a launch-bound GPU).

    ``windowed`` with ``window=W`` is sliding-window attention: per sequence
    ``w(s, W)`` (:func:`~seqpack.cost.terms.window_feature`), which is ``s**2`` up to
    ``s = W + 1`` and grows linearly beyond (``0 <= W <= 2**31 - 1``,
    :data:`seqpack.validation.MAX_WINDOW`). A model without a window (``window=None``,
    ``windowed=0``) has the three terms ``(constant, linear, quadratic)``.

    The ring fields price a microbatch on CP groups of varying size (dynamic CP):

    * ``ring_step``: cost per ring step of a microbatch (all attention layers, forward and
      backward), times ``c - 1``.
    * ``ring_token``: cost per token per ring step within a node, times ``(c-1) S/c``;
      ``ring_token_inter`` the same for a group spanning nodes (``None``: ``ring_token``).
    * ``ranks_per_node``: DP x CP ranks on one node (8 GPUs per node / TP size).
    * ``reference_size``: the group size the compute terms are the cost on (1: one rank
      alone); ``None``: the plan's static CP group (``cp_size`` ranks).

    With them at their defaults the model costs, prints and compares exactly as
    ``CostModel(linear, quadratic, constant)``: a static plan's figures are its own.
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
        for name in ("linear", "quadratic", "constant", "windowed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise SeqpackTypeError(f"CostModel.{name} must be a number, got {value!r}")
            try:
                number = float(value)
            except OverflowError:  # an int past float64
                number = math.inf
            if not math.isfinite(number) or number < 0:
                raise ConfigError(f"CostModel.{name} must be finite and >= 0, got {value!r}")
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
        for field in dataclasses.fields(self)[5:]:
            value = getattr(self, field.name)
            if value != (self.ring_token if field.name == "ring_token_inter" else field.default):
                text += f", {field.name}={value!r}"
        return text + ")"

    @property
    def terms(self) -> tuple[str, ...]:
        """The model's terms in feature order: ``("constant", "linear", "quadratic")``, and
        ``"windowed"`` with a window (:mod:`seqpack.cost.terms`)."""
        return feature_names(self.window)

    @property
    def coefficients(self) -> tuple[float, ...]:
        """The coefficients of :attr:`terms`, in that order (what :meth:`from_coefficients`
        takes back)."""
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
        """Fraction of one ``length``-token sequence's cost spent in attention (the quadratic
        and windowed terms)."""
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
        """Coefficients from a transformer's training FLOPs (GQA aware; causal halves the
        attention scores and values; ``window_size`` gives the windowed term).

        Args:
            hidden_size, num_layers, num_attention_heads, ffn_hidden_size,
                num_query_groups, vocab_size, causal: Model shape (see :class:`ModelSpec`).
            constant: Per-microbatch overhead in FLOPs.
            **options: Further :class:`ModelSpec` fields.

        Returns:
            :meth:`ModelSpec.cost_model`: ``linear`` = FLOPs per token, ``quadratic`` = FLOPs
            per ``s**2``, ``windowed`` = FLOPs per ``w(s, W)``, and ``constant``.
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
        window: int | None = None,
    ) -> CostModel:
        """A measured cost model: ``seconds ~ constant + linear*S + quadratic*SS`` over
        microbatches (``S``/``SS``: sum of lengths / of squared lengths), every coefficient
        >= 0; with a ``window``, ``+ windowed*SW`` (``SW``: sum of ``w(s, window)``).

        The fit is exact non-negative least squares (:func:`nnls_fit`: every support of the
        coefficients is solved and the best feasible one kept), so it never fails on
        finite positive timings: timings that do not grow with length give a
        constant-only model, ``CostModel(0, 0, constant)`` ("every microbatch costs the
        same"). It is scale-invariant: times in any unit, even around 1e-200 or 1e200, fit
        the same model scaled.

        Useful when kernels are not equally efficient: on CPU, attention runs far below GEMM
        speed, so its real cost is more quadratic than its FLOPs say; on a launch-bound GPU
        a microbatch costs a large constant.

        Args:
            microbatches: Per microbatch, the (padded) lengths of its sequences.
            seconds: Measured time of each microbatch (real numbers).
            robust: Resist outlier timings (a first-step compile, a GC pause): fit relative
                errors (``(seconds - model) / model``), downweighting points far from the
                rest (iteratively reweighted NNLS, Huber then Tukey's bisquare on a MAD
                scale; :func:`robust_nnls_fit`).
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
        coef = robust_nnls_fit(features, y) if robust else nnls_fit(features, y)
        return cls.from_coefficients(coef, window=window)

    @classmethod
    def from_coefficients(cls, coefficients: Sequence[float] | np.ndarray, *, window: int | None = None) -> CostModel:
        """``CostModel`` from the coefficients of its :attr:`terms` (``(constant, linear,
        quadratic)``, and ``windowed`` with a ``window``) as :func:`nnls_fit` returns them
        (tiny negative rounding clipped to 0)."""
        values = [max(float(c), 0.0) for c in coefficients]
        names = feature_names(window)
        if len(values) != len(names):
            raise ConfigError(f"{len(names)} coefficients {names} expected, got {len(values)}")
        constant, linear, quadratic = values[:3]
        if window is None:
            return cls(linear, quadratic, constant)
        return cls(linear, quadratic, constant, windowed=values[3], window=window)

    def predict(self, seqlen_sum: float, seqlen_sq_sum: float, seqlen_window_sum: float | None = None) -> float:
        """Cost of one microbatch from its length sums ``S``, ``SS`` and, with a window,
        ``SW`` (:func:`~seqpack.cost.terms.exact_sums`)."""
        total = self.constant + self.linear * seqlen_sum + self.quadratic * seqlen_sq_sum
        if self.window is not None:
            if seqlen_window_sum is None:
                raise ConfigError(f"{self!r} has a windowed term: pass seqlen_window_sum")
            total += self.windowed * seqlen_window_sum
        return float(total)

    def predict_sums(self, sums: np.ndarray) -> np.ndarray:
        """float64 cost of microbatches from their sums ``[..., len(terms) - 1]`` (``S``,
        ``SS`` and, with a window, ``SW``: the terms after the constant, in order)."""
        sums = np.asarray(sums)
        if sums.shape[-1:] != (len(self.terms) - 1,):
            raise ConfigError(f"{self!r} needs sums of {self.terms[1:]} in the last axis, got shape {sums.shape}")
        out = self.constant + self.linear * sums[..., 0] + self.quadratic * sums[..., 1]
        if self.window is not None:
            out = out + self.windowed * sums[..., 2]
        return np.asarray(out, dtype=np.float64)

    # -- CP groups: the compute split over a group of c ranks, plus the CP ring -------------
    @property
    def has_ring(self) -> bool:
        """Whether any ring coefficient is positive (else every CP group looks free)."""
        return bool(self.ring_step > 0 or self.ring_token > 0 or (self.ring_token_inter or 0.0) > 0)

    def _reference(self, cp_size: int) -> int:
        return cp_size if self.reference_size is None else self.reference_size

    def compute_scale(self, group_size: np.ndarray | int, cp_size: int) -> np.ndarray:
        """float64: what the compute terms are multiplied by on a group of each size
        (``reference_size / c``, a model without one on a plan of ``cp_size``: exactly 1 at
        the reference size)."""
        r = self._reference(cp_size)
        c = np.asarray(group_size, dtype=np.float64)
        return np.where(c == r, 1.0, r / c)

    def group_coefficients(self, cp_size: int) -> np.ndarray:
        """float64 ``[6]`` in :data:`~seqpack.cost.ring.FEATURES` order: the compute on one
        rank (``linear`` and ``quadratic`` times the reference size, :meth:`compute_scale`)
        and the ring; a windowed term is not among them."""
        r = self._reference(cp_size)
        ring = (self.ring_step, self.ring_token, self.ring_token_inter)
        return np.array((self.constant, self.linear * r, self.quadratic * r, *ring), dtype=np.float64)

    @classmethod
    def from_group_coefficients(cls, coefficients: np.ndarray, ranks_per_node: int = 8) -> CostModel:
        """The model whose :meth:`group_coefficients` are ``coefficients`` (a fit of
        :func:`~seqpack.cost.ring.group_features` against measured seconds): compute on one
        rank (``reference_size=1``)."""
        k, a, b, step, token, inter = (float(v) for v in np.asarray(coefficients, dtype=np.float64))
        return cls(a, b, k, ring_step=step, ring_token=token, ring_token_inter=inter, ranks_per_node=ranks_per_node,
                   reference_size=1)  # fmt: skip

    def scaled_ring(self, factor: float) -> CostModel:
        """The same model with every ring coefficient times ``factor`` (sensitivity runs)."""
        factor = check_number("factor", factor, minimum=0.0)
        inter = float(self.ring_token_inter or 0.0) * factor
        return dataclasses.replace(
            self, ring_step=self.ring_step * factor, ring_token=self.ring_token * factor, ring_token_inter=inter
        )

    def at(self, group_size: int, *, spans: bool | None = None) -> CostModel:
        """The ring-free model of every microbatch on a CP group of ``group_size`` ranks
        (static CP): what ``balanced`` balances when each replica is such a group. A model
        without a ``reference_size`` is the cost on that group already (plus its ring).

        ``spans`` defaults to ``group_size > ranks_per_node`` (aligned blocks).
        """
        c = check_positive_int("group_size", group_size)
        r = self._reference(c)
        if c == r and (c == 1 or not self.has_ring):
            return CostModel(self.linear, self.quadratic, self.constant, self.windowed, self.window)
        spans = c > self.ranks_per_node if spans is None else spans
        token = float(self.ring_token_inter if spans else self.ring_token)  # type: ignore[arg-type]
        return CostModel(
            linear=(self.linear * r + (c - 1) * token) / c,
            quadratic=self.quadratic * r / c,
            constant=self.constant + (c - 1) * self.ring_step,
            windowed=self.windowed * r / c,
            window=self.window,
        )

    def ring(self, group_size: np.ndarray, seqlen_sum: np.ndarray, spans: np.ndarray) -> np.ndarray:
        """float64: the CP ring's cost of microbatches on groups of ``group_size`` ranks
        holding ``seqlen_sum`` padded tokens (0 alone)."""
        c = np.asarray(group_size, dtype=np.float64)
        ring = np.maximum(c - 1.0, 0.0)
        token = np.where(np.asarray(spans, dtype=bool), float(self.ring_token_inter or 0.0), self.ring_token)
        return ring * self.ring_step + token * (ring * np.asarray(seqlen_sum, dtype=np.float64) / c)

    def predict_group_sums(self, sums: np.ndarray, cp_size: int) -> np.ndarray:
        """float64 ``[...]``: the cost of microbatches given as ``(size, S, SS, spans)``
        integers in the last axis (:func:`~seqpack.schedulers.step_time.group_sums`) on a
        plan of ``cp_size``."""
        a = np.asarray(sums, dtype=np.int64)
        flat = a.reshape(-1, 4)
        features = group_features(flat[:, 0], flat[:, 1], flat[:, 2], flat[:, 3] != 0)
        return (features @ self.group_coefficients(cp_size)).reshape(a.shape[:-1])

    @classmethod
    def from_te_p2p(
        cls,
        compute: CostModel,
        *,
        attention_layers: int,
        num_query_groups: int,
        head_dim: int,
        intra_node_bandwidth: float,
        inter_node_bandwidth: float,
        step_latency: float,
        dtype_bytes: int = 2,
        ranks_per_node: int = 8,
    ) -> CostModel:
        """``compute`` (seconds of a microbatch on one rank) with the ring coefficients of
        Transformer Engine's ``p2p`` CP, from the model's shape and the links.

        Args:
            compute: Seconds of a microbatch on one rank (``reference_size=1``).
            attention_layers: Attention layers of the model (of this pipeline stage).
            num_query_groups, head_dim: K/V heads and their width.
            intra_node_bandwidth, inter_node_bandwidth: Bytes per second one rank sends to
                its ring neighbour within a node and across nodes.
            step_latency: Seconds of fixed cost per ring transfer (launch, handshake).
            dtype_bytes: Bytes per K/V element (2 for bf16).
            ranks_per_node: DP x CP ranks per node.
        """
        if not isinstance(compute, CostModel):
            raise SeqpackTypeError(f"compute must be a seqpack CostModel, got {type(compute).__name__}")
        kv_bytes = (
            2
            * check_positive_int("num_query_groups", num_query_groups)
            * check_positive_int("head_dim", head_dim)
            * check_positive_int("dtype_bytes", dtype_bytes)
        )
        transfers = TE_P2P_TRANSFERS * check_positive_int("attention_layers", attention_layers)
        intra = check_number("intra_node_bandwidth", intra_node_bandwidth, minimum=0.0, allow_zero=False)
        inter = check_number("inter_node_bandwidth", inter_node_bandwidth, minimum=0.0, allow_zero=False)
        return dataclasses.replace(
            compute,
            ring_step=transfers * check_number("step_latency", step_latency, minimum=0.0),
            ring_token=transfers * kv_bytes / intra,
            ring_token_inter=transfers * kv_bytes / inter,
            ranks_per_node=ranks_per_node,
            reference_size=1,
        )

    @classmethod
    def from_model(
        cls, spec: ModelSpec, interconnect: str | Interconnect = DEFAULT_INTERCONNECT, *, dtype_bytes: int = 2
    ) -> CostModel:
        """A dynamic-CP prior in training FLOPs: ``spec``'s FLOPs cost model on one rank plus
        Transformer Engine's ``p2p`` ring (:meth:`from_te_p2p`) over a named interconnect,
        its seconds expressed in FLOPs at the interconnect's ``device_flops``
        (:mod:`seqpack.cost.interconnect`). Calibration refits every coefficient.

        Raises:
            ConfigError: ``spec`` has no attention layer (Mamba's CP exchange is not a
                ring: give its ring figures on the CostModel), or an unknown interconnect.
        """
        if not isinstance(spec, ModelSpec):
            raise SeqpackTypeError(f"spec must be a seqpack.cost.ModelSpec, got {type(spec).__name__}")
        links = get_interconnect(interconnect)
        attention_layers = spec.layer_counts[0]
        if attention_layers == 0:
            raise ConfigError(
                f"model {spec.name or spec!r} has no attention layer, so its CP communication is not a ring: "
                "pass cost=seqpack.CostModel(..., ring_step=..., ring_token=...) with its figures"
            )
        seconds = cls.from_te_p2p(
            spec.cost_model(),
            attention_layers=attention_layers,
            num_query_groups=spec.num_query_groups or spec.num_attention_heads,
            head_dim=spec.kv_channels or spec.hidden_size // spec.num_attention_heads,
            intra_node_bandwidth=links.intra_node_bandwidth,
            inter_node_bandwidth=links.inter_node_bandwidth,
            step_latency=links.step_latency,
            dtype_bytes=dtype_bytes,
            ranks_per_node=links.ranks_per_node,
        )
        return seconds.scaled_ring(links.device_flops)

    @classmethod
    def from_preset(cls, name: str, constant: float = 0.0) -> CostModel:
        """The cost model of a :data:`~seqpack.cost.MODEL_PRESETS` entry (e.g. ``"llama3-8b"``)."""
        return ModelSpec(**preset_shape(name), name=name).cost_model(constant)  # type: ignore[arg-type]


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
