"""Encoder rebalancing for a Hugging Face Qwen2-VL-family model, with no change to its code.

:func:`rebalance_encoder` hooks the model (transformers 5.24's Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3-VL-MoE) so that every forward is a microbatch round of the DP group: a pre-hook on the
module owning the vision tower gathers every rank's grids, plans where each image is encoded
and routes patches and embeddings (differentiably); the tower's ``forward`` serves the routed
embeddings; a pre-hook on the language model ties them into its ``inputs_embeds`` so every
rank's backward reaches the route. Every rank of the group must run the same forwards and
backwards, in the same order. :func:`rebalance_for_steps` and :func:`rebalance_for_config`
hook a model as a wrapper's config asks. docs/multimodal.md, "Encoder rebalancing".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from seqpack.collective.encoder_route import RoutePlan, gather_grids, move_patches, plan_route, route_back
from seqpack.collective.groups import group_rank, group_size, new_axis_groups
from seqpack.cost import CostModel, ModelSpec
from seqpack.cost.vision_encoder import VisionSpec
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader.encoder_option import EncoderRebalanceMode, check_encoder_rebalance, encoder_rebalance_mode
from seqpack.schedulers.balanced.locality import LINK_BYTES_PER_SECOND
from seqpack.schedulers.encoder_plan import DEFAULT_SECONDS_PER_FLOP, EncoderPlan, plan_encoders, rebalance_pays
from seqpack.thd.sample import MEDIA_FIELDS
from seqpack.topology import Topology

if TYPE_CHECKING:
    from seqpack.calibrate import CostCalibrator
    from seqpack.loader.config import PackingConfig
    from seqpack.loader.iterator import PackingIterator

__all__ = [
    "EncoderRebalance",
    "RoundRecord",
    "calibrated_seconds_per_flop",
    "rebalance_encoder",
    "rebalance_for_config",
    "rebalance_for_steps",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    """What the last round decided (the same on every rank).

    Attributes:
        plan: The plan (``None``: no image in the round).
        routed: Whether images moved (``False``: every image encoded where its sequence runs).
    """

    plan: EncoderPlan | None
    routed: bool


class _Tie(torch.autograd.Function):
    """``embeds`` unchanged; ``routed`` gets a zero gradient (it joins the loss's graph)."""

    @staticmethod
    def forward(ctx: Any, embeds: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        ctx.routed_shape, ctx.routed_dtype = routed.shape, routed.dtype
        return embeds.view_as(embeds)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.new_zeros(ctx.routed_shape, dtype=ctx.routed_dtype)


def _owner(model: nn.Module) -> nn.Module:
    for candidate in (model, getattr(model, "model", None)):
        if isinstance(candidate, nn.Module) and isinstance(getattr(candidate, "visual", None), nn.Module):
            if isinstance(getattr(candidate, "language_model", None), nn.Module):
                return candidate
    raise SeqpackTypeError(
        f"rebalance_encoder needs a Qwen2-VL-family model (a module with .visual and .language_model, or its "
        f".model), got {type(model).__name__}"
    )


class EncoderRebalance:
    """The hooks :func:`rebalance_encoder` installs; :meth:`remove` takes them off.

    Attributes:
        last: The last round's :class:`RoundRecord`.
        rounds, routed_rounds, moved_images: Counts over the rounds so far.
        group: The DP group the route runs on.
    """

    def __init__(
        self,
        model: nn.Module,
        group: ProcessGroup | None,
        mode: EncoderRebalanceMode,
        spec: VisionSpec | None,
        *,
        seconds_per_flop: Callable[[], float],
        bytes_per_second: float,
        language: CostModel | None = None,
    ) -> None:
        self.owner = _owner(model)
        self.tower = self.owner.get_submodule("visual")
        spec = VisionSpec.from_hf(self.owner.config) if spec is None else spec  # None: the model's own
        self.group, self.mode, self.spec = group, mode, spec
        if language is None and mode == "auto":  # the language model's FLOPs per microbatch
            language = ModelSpec.from_hf(self.owner.config).cost_model()
        self.language = language
        self._seconds_per_flop, self._bytes_per_second = seconds_per_flop, bytes_per_second
        self.num_ranks, self.rank = group_size(group), group_rank(group)
        self.deepstack = len(getattr(self.tower, "deepstack_visual_indexes", ()) or ())
        self.width = spec.out_hidden_size * (1 + self.deepstack)  # an embedding row, deepstack features included
        self.pixel_dim = spec.in_channels * spec.temporal_patch_size * spec.patch_size**2
        module = sys.modules[type(self.tower).__module__]
        self.output_type = (
            getattr(module, "BaseModelOutputWithDeepstackFeatures", None) or module.BaseModelOutputWithPooling
        )
        self.last: RoundRecord | None = None
        self.rounds = self.routed_rounds = self.moved_images = 0
        self._served: list[tuple[torch.Tensor, torch.Tensor]] = []  # (grid, embeddings) per modality
        self._pending: torch.Tensor | None = None
        self._original = self.tower.forward
        # An instance attribute, not a new module: parameter names and the state dict stay.
        self.tower.forward = self._tower_forward
        self._handles = [
            self.owner.register_forward_pre_hook(self._before, with_kwargs=True),
            self.owner.get_submodule("language_model").register_forward_pre_hook(self._tie, with_kwargs=True),
        ]

    def remove(self) -> None:
        """Restore the model."""
        for handle in self._handles:
            handle.remove()
        del self.tower.forward
        self._handles = []

    # -- a round ---------------------------------------------------------------------------
    def _before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._served, self._pending = [], None
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (pixels, grid) of images, then videos
        for name, grid_name in MEDIA_FIELDS:
            pixels, grid = kwargs.get(name), kwargs.get(grid_name)
            if pixels is not None and grid is not None:
                parts.append((pixels, grid.reshape(-1, 3)))
        local = torch.cat([grid.cpu().long() for _, grid in parts]) if parts else torch.zeros(0, 3, dtype=torch.long)
        price, work = (self._seconds_per_flop(), self._work(kwargs)) if self.mode == "auto" else (0.0, 0.0)
        gathered = gather_grids(local, self.group, self.num_ranks, price, work)  # the first rank's price
        grids, home = gathered.grids, gathered.home
        self.rounds += 1
        if grids.shape[0] == 0:
            self.last = RoundRecord(plan=None, routed=False)
            return
        plan = self._plan(grids, home, gathered.price, gathered.work)
        self.last = RoundRecord(plan=plan, routed=bool(plan.moved.any()))
        if not self.last.routed:
            return
        self.routed_rounds += 1
        self.moved_images += int(plan.moved.sum())
        route = plan_route(grids, home, plan.encoder, self.rank, self.num_ranks, self.spec.spatial_merge_size)
        embeds = self._encode(parts, route)
        self._pending = embeds
        start = 0
        for _, grid in parts:
            rows = int(grid.prod(dim=1).sum()) // self.spec.spatial_merge_size**2
            self._served.append((grid, embeds[start : start + rows]))
            start += rows

    def _work(self, kwargs: dict) -> float:
        """This rank's language-model FLOPs in the round (its sequences from ``cu_seq_lens_q``;
        else each row one sequence)."""
        assert self.language is not None
        cu = kwargs.get("cu_seq_lens_q")
        if isinstance(cu, torch.Tensor) and cu.numel() > 1:
            lengths = np.diff(cu.detach().cpu().numpy().astype(np.int64))
        else:
            ids = kwargs.get("input_ids")
            shape = ids.shape if isinstance(ids, torch.Tensor) else kwargs["inputs_embeds"].shape[:-1]
            lengths = np.full(int(np.prod(shape[:-1])), shape[-1], dtype=np.int64)
        return float(np.sum(self.language.cost(lengths)))

    def _plan(self, grids: np.ndarray, home: np.ndarray, seconds_per_flop: float, work: np.ndarray) -> EncoderPlan:
        plan = plan_encoders(self.spec.grid_flops(grids), home, self.num_ranks)
        if self.mode != "auto" or not plan.moved.any():
            return plan
        patches = grids.prod(axis=1).astype(np.float64)
        itemsize = torch.empty(0, dtype=self._dtype()).element_size()
        embed_bytes = patches / self.spec.spatial_merge_size**2 * self.width * itemsize
        price = {"seconds_per_cost": seconds_per_flop, "bytes_per_second": self._bytes_per_second}
        if rebalance_pays(plan, patches * self.pixel_dim * itemsize, embed_bytes, other_load=work, **price):
            return plan
        return plan_encoders(np.zeros(home.size), home, self.num_ranks)  # the home plan

    def _dtype(self) -> torch.dtype:
        return next(self.tower.parameters()).dtype

    def _encode(self, parts: list[tuple[torch.Tensor, torch.Tensor]], route: RoutePlan) -> torch.Tensor:
        """Move the patches, encode this rank's images, route the embeddings back: this
        rank's ``[rows, out_hidden * (1 + deepstack)]``, images then videos."""
        device, dtype = next(self.tower.parameters()).device, self._dtype()
        pixels = [p.to(device=device, dtype=dtype).reshape(-1, self.pixel_dim) for p, _ in parts]
        local = torch.cat(pixels) if pixels else torch.zeros(0, self.pixel_dim, device=device, dtype=dtype)
        patches = move_patches(local, route, self.group)
        if patches.shape[0]:
            grid = torch.as_tensor(route.encode_grids, device=device)
            out = self._original(patches, grid_thw=grid, return_dict=True)
            features = [out.pooler_output, *(getattr(out, "deepstack_features", None) or [])]
            encoded = torch.cat(features, dim=1)
        else:
            encoded = torch.zeros(0, self.width, device=device, dtype=dtype)
        return route_back(encoded, route, self.group)

    def _tower_forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs: Any) -> Any:
        if not self._served:
            return self._original(hidden_states, grid_thw, **kwargs)
        grid, embeds = self._served.pop(0)  # the model asks for images, then videos
        if not torch.equal(grid.cpu(), grid_thw.reshape(-1, 3).cpu()):
            raise ConfigError(
                f"rebalance_encoder: the vision tower was called with grids {grid_thw.tolist()} but the forward's "
                f"were {grid.tolist()} (a model that calls its tower other than get_image_features / "
                "get_video_features once each)"
            )
        width = self.spec.out_hidden_size
        fields: dict[str, Any] = {"last_hidden_state": None, "pooler_output": embeds[:, :width]}
        if self.deepstack:
            fields["deepstack_features"] = list(embeds[:, width:].split(width, dim=1))
        return self.output_type(**fields)

    def _tie(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        pending, self._pending = self._pending, None
        if pending is None or not pending.requires_grad:
            return None
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise ConfigError("rebalance_encoder: the language model was called without inputs_embeds")
        return args, {**kwargs, "inputs_embeds": _Tie.apply(embeds, pending)}


def rebalance_encoder(
    model: nn.Module,
    group: ProcessGroup | None,
    *,
    mode: EncoderRebalanceMode = "auto",
    vision: VisionSpec | None = None,
    seconds_per_flop: float = DEFAULT_SECONDS_PER_FLOP,
    bytes_per_second: float = LINK_BYTES_PER_SECOND,
) -> EncoderRebalance | None:
    """Encode each microbatch round's images across the DP ``group`` (see the module docstring).

    Args:
        model: A transformers Qwen2-VL-family model (``...ForConditionalGeneration`` or its
            ``.model``).
        group: The DP group whose ranks run the same microbatch rounds (``None``: one rank,
            where nothing moves).
        mode: ``"auto"``: route a round only where the round time it saves exceeds its
            exchange time (:func:`~seqpack.schedulers.encoder_plan.rebalance_pays`); ``True``:
            wherever the plan moves an image; ``False``: nothing is installed.
        vision: The tower's :class:`~seqpack.cost.VisionSpec` (default: from the model's config).
        seconds_per_flop: The encoder's (and the language model's) seconds per training FLOP.
        bytes_per_second: One rank's exchange bandwidth.

    Returns:
        The installed :class:`EncoderRebalance` (``.remove()`` restores the model); ``None``
        for ``mode=False``.

    Raises:
        ConfigError: ``mode`` not ``"auto"``, ``True`` or ``False``; ``True`` on one rank; a
            model type VisionSpec does not read.
    """
    if encoder_rebalance_mode(mode) is False:
        return None
    if mode is True and group_size(group) < 2:
        raise ConfigError(
            "rebalance_encoder: mode=True on one rank (group None or of size 1) has nowhere to move images"
        )
    for name, value in (("seconds_per_flop", seconds_per_flop), ("bytes_per_second", bytes_per_second)):
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
            raise ConfigError(f"rebalance_encoder: {name} must be a positive number, got {value!r}")
    price = float(seconds_per_flop)
    return EncoderRebalance(
        model, group, mode, vision, seconds_per_flop=lambda: price, bytes_per_second=float(bytes_per_second)
    )


def rebalance_for_config(
    model: nn.Module,
    topology: Topology,
    config: PackingConfig,
    seconds_per_flop: Callable[[], float] = lambda: DEFAULT_SECONDS_PER_FLOP,
) -> EncoderRebalance | None:
    """Hook ``model`` as ``config.encoder_rebalance`` asks, over ``topology``'s DP ranks.

    Off (``None``, nothing created) for ``False``, and for ``"auto"`` without ``config.mrope``,
    on one DP rank, or with CP or pipeline stages. Otherwise collective over the whole default
    group (every rank calls it, once, before the first forward): the route gets DP groups of
    its own, so it never interleaves with DDP's or FSDP's gradient collectives.

    Args:
        seconds_per_flop: The encoder's seconds per training FLOP, read at every round that
            ``"auto"`` prices (the group uses its first rank's value).

    Raises:
        ConfigError: ``encoder_rebalance=True`` on a topology the route cannot run on.
    """
    mode = check_encoder_rebalance(config.encoder_rebalance, mrope=config.mrope, topology=topology)
    if mode is False or config.mrope is None or topology.dp_size < 2 or topology.cp_size > 1 or topology.pp_size > 1:
        return None
    given = config.model
    language = given.cost_model() if given is not None else None
    group = new_axis_groups(topology, backend=dist.get_backend(), axes=["dp"])["dp"]  # the route's alone
    return EncoderRebalance(
        model,
        group,
        mode,
        None if given is None else given.vision,
        seconds_per_flop=seconds_per_flop,
        bytes_per_second=LINK_BYTES_PER_SECOND,
        language=language,
    )


def rebalance_for_steps(model: nn.Module, steps: PackingIterator) -> EncoderRebalance | None:
    """:func:`rebalance_for_config` with ``steps``' topology and config, at its calibrator's
    encoder price under ``calibrate``. Collective: every rank, once, after
    ``wrap_data_iterator`` and before the first forward.

    Returns:
        The hooks (``.remove()`` restores the model); ``None`` where the config is off.
    """
    return rebalance_for_config(
        model, steps.topology, steps.config, lambda: calibrated_seconds_per_flop(steps.calibrator)
    )


def calibrated_seconds_per_flop(calibrator: CostCalibrator | None) -> float:
    """A calibrator's ``encoder_price`` once it predicts seconds, else
    :data:`~seqpack.schedulers.encoder_plan.DEFAULT_SECONDS_PER_FLOP`."""
    price = calibrator.encoder_price if calibrator is not None and calibrator.in_seconds else None
    return price if price is not None and math.isfinite(price) and price > 0 else DEFAULT_SECONDS_PER_FLOP
