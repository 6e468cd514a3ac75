"""The THD microbatch: :class:`PackedBatch` and its Transformer Engine keyword arguments."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX, INT64_MAX, CpLayout
from seqpack.thd.sample import IGNORE_INDEX, MEDIA_FIELDS, MROPE_POSITIONS, TOKEN_KEYS, VISION_FIELDS
from seqpack.validation import check_choice, check_int, check_positive_int

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["BATCH_TOKEN_FIELDS", "VISION_BATCH_FIELDS", "PackedBatch", "map_tensors", "padding_only_batch"]

BATCH_TOKEN_FIELDS: tuple[str, ...] = (*TOKEN_KEYS, "seq_idx", "padding_mask")
"""The per-token fields of a :class:`PackedBatch` (what CP sharding cuts)."""
_REQUIRED_TENSORS = ("position_ids", "seq_idx", "padding_mask", "cu_seqlens", "cu_seqlens_padded", "sample_ids")
_TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "seq_idx", "padding_mask")
VISION_BATCH_FIELDS: tuple[str, ...] = (MROPE_POSITIONS, *VISION_FIELDS)
"""The fields of a vision-language pack (``None`` on a text-only one)."""


@dataclasses.dataclass
class PackedBatch:
    """One THD microbatch (or this CP rank's shard of it).

    Token fields (``input_ids`` ... ``padding_mask``) hold this rank's tokens: under CP its
    shard (``T / cp_size`` tokens) in the layout ``cp_layout`` names, while ``cu_seqlens*`` and
    ``max_seqlen`` stay global, as Transformer Engine expects. Middle pipeline stages get
    ``input_ids``, ``labels`` and ``loss_mask`` as ``None``.

    ``num_loss_tokens`` counts the tokens of the whole microbatch (every CP rank's share)
    whose label is not -100 and ``loss_mask`` > 0; ``None`` where the builder was not told it.

    ``cp_group`` is the process group this shard's CP ranks share (set by the wrapper on every
    CP-sharded batch; ``ThdAttention`` and ``Mamba2Mixer`` use it instead of their own);
    ``None`` for a rank alone. It is not serialised.

    A vision-language pack (:mod:`seqpack.thd.vision`) also carries the fields of
    :data:`VISION_BATCH_FIELDS`, ``None`` on a text-only pack; it cannot be CP-sharded yet.
    """

    input_ids: torch.Tensor | None  # int64 [T]
    labels: torch.Tensor | None  # int64 [T], IGNORE_INDEX where no loss
    loss_mask: torch.Tensor | None  # float32 [T]
    position_ids: torch.Tensor  # int64 [T], restarts per sequence, counts through its pad
    seq_idx: torch.Tensor  # int32 [T], sequence index of every token, pads included
    padding_mask: torch.Tensor  # bool [T], True = pad
    cu_seqlens: torch.Tensor  # int32 [N+1], real lengths (global)
    cu_seqlens_padded: torch.Tensor  # int32 [N+1], padded offsets (global)
    max_seqlen: int  # largest padded sequence length
    sample_ids: torch.Tensor  # int64 [N], global ids (-1 for a padding-only filler)
    cp_size: int = 1
    cp_rank: int = 0
    num_loss_tokens: int | None = None  # supervised tokens of the whole microbatch (all CP ranks)
    cp_layout: CpLayout = CpLayout.DUALCHUNK  # how the token fields were cut (meaningless at cp_size 1)
    cp_group: ProcessGroup | None = dataclasses.field(default=None, compare=False, repr=False)
    # Vision-language packs only (None otherwise); see seqpack.thd.vision.
    mrope_position_ids: torch.Tensor | None = None  # int64 [3, T], t/h/w rows, restart per sequence
    mm_token_type_ids: torch.Tensor | None = None  # int64 [T], 0 text and pads, 1 image, 2 video placeholder
    pixel_values: torch.Tensor | None = None  # float [image patches, D], in sequence order
    image_grid_thw: torch.Tensor | None = None  # int64 [images, 3]
    pixel_values_videos: torch.Tensor | None = None  # float [video patches, D]
    video_grid_thw: torch.Tensor | None = None  # int64 [videos, 3]

    def __post_init__(self) -> None:
        # Types and shapes only, never values (that would read device memory).
        for name in _REQUIRED_TENSORS:
            if not isinstance(getattr(self, name), torch.Tensor):
                raise SeqpackTypeError(f"PackedBatch.{name} must be a tensor, got {type(getattr(self, name)).__name__}")
        for name in ("input_ids", "labels", "loss_mask", *VISION_BATCH_FIELDS):
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                raise SeqpackTypeError(f"PackedBatch.{name} must be a tensor or None, got {type(value).__name__}")
        tokens = self.position_ids.shape
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and (value.dim() != 1 or value.shape != tokens):
                raise ConfigError(
                    f"PackedBatch.{name} has shape {tuple(value.shape)}; every token field must be 1-D "
                    f"with this rank's {tuple(tokens)} tokens (position_ids)"
                )
        bounds = self.cu_seqlens.shape
        if self.cu_seqlens.dim() != 1 or bounds[0] < 1 or self.cu_seqlens_padded.shape != bounds:
            raise ConfigError(
                f"PackedBatch.cu_seqlens {tuple(bounds)} and cu_seqlens_padded "
                f"{tuple(self.cu_seqlens_padded.shape)} must both be 1-D [N + 1]"
            )
        if self.sample_ids.shape != (bounds[0] - 1,):
            raise ConfigError(
                f"PackedBatch.sample_ids has shape {tuple(self.sample_ids.shape)}, expected ({bounds[0] - 1},): "
                "one id per sequence of cu_seqlens"
            )
        check_int("PackedBatch.max_seqlen", self.max_seqlen, minimum=0)
        check_int("PackedBatch.cp_size", self.cp_size, minimum=1)
        check_int("PackedBatch.cp_rank", self.cp_rank, minimum=0, maximum=self.cp_size - 1)
        if self.num_loss_tokens is not None:
            self.num_loss_tokens = check_int("PackedBatch.num_loss_tokens", self.num_loss_tokens, minimum=0)
        self.cp_layout = check_choice("PackedBatch.cp_layout", self.cp_layout, CpLayout)
        if self.cp_group is not None and self.cp_size == 1:
            raise ConfigError("PackedBatch.cp_group is set on a batch with cp_size=1: a rank alone has no CP group")
        if any(getattr(self, name) is not None for name in VISION_BATCH_FIELDS):
            _check_vision(self)

    @property
    def has_vision(self) -> bool:
        """Whether this is a vision-language pack (it carries mRoPE positions)."""
        return self.mrope_position_ids is not None

    @property
    def num_tokens(self) -> int:
        """Tokens held by this rank (padding included)."""
        return int(self.position_ids.shape[0])

    @property
    def num_real_tokens(self) -> int:
        """Non-pad tokens held by this rank."""
        return int(self.num_tokens - int(self.padding_mask.sum()))

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1)

    def seq_lens(self) -> torch.Tensor:
        """Real length of every sequence (int64 [N])."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def seq_lens_padded(self) -> torch.Tensor:
        """Padded length of every sequence (int64 [N])."""
        return (self.cu_seqlens_padded[1:] - self.cu_seqlens_padded[:-1]).long()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """A copy with every tensor on ``device`` (the identity of a shared cu_seqlens kept)."""
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as err:
            raise ConfigError(f"device must be a torch device, got {device!r}: {err}") from None
        return map_tensors(self, lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def te_kwargs(
        self,
        *,
        pad_between_seqs: bool | None = None,
        padded_as_real: bool = False,
        include_format: bool = True,
    ) -> dict[str, Any]:
        """Keyword arguments for TE ``DotProductAttention.forward`` in THD.

        ``pad_between_seqs`` is always stated (left to TE, real lengths that are not multiples
        of ``2*cp`` give silently wrong attention). When the only padding is the pack's tail,
        the same tensor object is passed as ``cu_seqlens`` and ``cu_seqlens_padded`` (TE picks
        its fast path by identity); exact for causal attention, as pads end their sequence.

        Args:
            pad_between_seqs: Override the derived flag (rarely right to change).
            padded_as_real: Pass padded offsets as the real lengths too (NeMo Automodel's CP
                path): pads are attended as real tokens, exact for causal attention.
            include_format: Include ``qkv_format="thd"`` and
                ``attn_mask_type="padding_causal"``.
        """
        cu_real, cu_padded = self.cu_seqlens, self.cu_seqlens_padded
        # Only the tail differs: on a GPU one host sync per call, on [N+1] tensors.
        derived = not (padded_as_real or cu_padded is cu_real or torch.equal(cu_real[:-1], cu_padded[:-1]))
        if not derived:
            cu_real = cu_padded
        kwargs: dict[str, Any] = {
            "cu_seqlens_q": cu_real,
            "cu_seqlens_kv": cu_real,
            "cu_seqlens_q_padded": cu_padded,
            "cu_seqlens_kv_padded": cu_padded,
            "max_seqlen_q": int(self.max_seqlen),
            "max_seqlen_kv": int(self.max_seqlen),
            "pad_between_seqs": derived if pad_between_seqs is None else bool(pad_between_seqs),
        }
        if include_format:
            kwargs["qkv_format"] = "thd"
            kwargs["attn_mask_type"] = "padding_causal"
        return kwargs


def _check_vision(batch: PackedBatch) -> None:
    """A vision-language pack's fields: shapes (no values read)."""
    if batch.cp_size > 1:
        raise ConfigError(
            f"PackedBatch: a vision-language pack cannot be CP-sharded yet (cp_size={batch.cp_size}); pack it for "
            "cp_size=1"
        )
    tokens = tuple(batch.position_ids.shape)
    positions, types = batch.mrope_position_ids, batch.mm_token_type_ids
    if positions is None or types is None:
        raise ConfigError(
            "PackedBatch: vision fields need both mrope_position_ids [3, T] and mm_token_type_ids [T] (the positions "
            "and placeholders of the pack's images and videos)"
        )
    if tuple(positions.shape) != (3, *tokens) or tuple(types.shape) != tokens:
        raise ConfigError(
            f"PackedBatch.mrope_position_ids has shape {tuple(positions.shape)} and mm_token_type_ids "
            f"{tuple(types.shape)}; expected (3, {tokens[0]}) and ({tokens[0]},)"
        )
    for pixel_name, grid_name in MEDIA_FIELDS:
        pixels, grid = getattr(batch, pixel_name), getattr(batch, grid_name)
        if (pixels is None) != (grid is None):
            missing = grid_name if grid is None else pixel_name
            raise ConfigError(f"PackedBatch.{pixel_name} and {grid_name} go together; {missing} is None")
        if grid is not None and (grid.dim() != 2 or grid.shape[1] != 3 or pixels.dim() != 2):
            raise ConfigError(
                f"PackedBatch.{grid_name} has shape {tuple(grid.shape)} and {pixel_name} {tuple(pixels.shape)}; "
                "expected [n, 3] and [patches, D]"
            )


def padding_only_batch(num_tokens: int, *, pad_token_id: int = 0, slots: int = 1) -> PackedBatch:
    """A microbatch with no real token: one empty sequence padded to ``num_tokens``.

    For a replica with nothing scheduled in a microbatch round that must still run the step.
    ``slots``: the sequence slots (:class:`~seqpack.thd.StaticShapes`' ``max_sequences``): the
    first holds the padding, the others are zero-length; ``sample_ids`` is -1 for each.
    """
    n = check_positive_int("num_tokens", num_tokens, maximum=INT32_MAX)  # cu_seqlens are int32
    pad_token_id = check_int("pad_token_id", pad_token_id, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
    slots = check_positive_int("slots", slots, maximum=INT32_MAX)
    cu_padded = torch.full((slots + 1,), n, dtype=torch.int32)
    cu_padded[0] = 0
    return PackedBatch(
        input_ids=torch.full((n,), pad_token_id, dtype=torch.int64),
        labels=torch.full((n,), IGNORE_INDEX, dtype=torch.int64),
        loss_mask=torch.zeros(n, dtype=torch.float32),
        position_ids=torch.arange(n, dtype=torch.int64),
        seq_idx=torch.zeros(n, dtype=torch.int32),
        padding_mask=torch.ones(n, dtype=torch.bool),
        cu_seqlens=torch.zeros(slots + 1, dtype=torch.int32),
        cu_seqlens_padded=cu_padded,
        max_seqlen=n,
        sample_ids=torch.full((slots,), -1, dtype=torch.int64),
        num_loss_tokens=0,
    )


def map_tensors(batch: PackedBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> PackedBatch:
    """A copy of ``batch`` with ``fn`` applied to every tensor field; a ``cu_seqlens_padded``
    that is the ``cu_seqlens`` object stays that object (TE #3487 picks its path by identity)."""
    fields = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    for name, value in fields.items():
        if isinstance(value, torch.Tensor):
            fields[name] = fn(value)
    if batch.cu_seqlens_padded is batch.cu_seqlens:
        fields["cu_seqlens_padded"] = fields["cu_seqlens"]
    return PackedBatch(**fields)
