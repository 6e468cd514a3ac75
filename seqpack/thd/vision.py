"""The vision-language sample contract and the packing of its vision fields.

A vision-language sample is what a Hugging Face processor returns for one example: beside
the text fields, ``input_ids`` holding the placeholder tokens, ``pixel_values`` [patches, D]
with ``image_grid_thw`` [images, 3], videos the same way (Qwen2.5-VL also
``second_per_grid_ts``), optionally ``mm_token_type_ids`` [L] and ``position_ids`` [3, L]
(else computed, :func:`~seqpack.thd.mrope.mrope_positions`). Text-only samples mix freely
with these. :func:`normalize_vision` checks one sample; :func:`pack_vision` lays a pack's
vision fields out on its token axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.errors import SampleError, SeqpackTypeError
from seqpack.thd.layout import TokenLayout
from seqpack.thd.mrope import IMAGE, TEXT, VIDEO, MRopeSpec, mrope_positions, placeholder_runs
from seqpack.thd.sample import MEDIA_FIELDS, MROPE_POSITIONS, VISION_KEYS

__all__ = ["VisionSample", "check_text_sample", "has_vision", "normalize_vision", "pack_vision", "text_part"]

_MEDIA = {IMAGE: (*MEDIA_FIELDS[0], "image"), VIDEO: (*MEDIA_FIELDS[1], "video")}


@dataclasses.dataclass
class VisionSample:
    """One sample's checked vision fields."""

    positions: torch.Tensor  # int64 [3, L], mRoPE rows
    token_types: torch.Tensor  # int64 [L], mm_token_type_ids
    pixels: dict[int, torch.Tensor]  # per modality: float [patches, D]
    grids: dict[int, torch.Tensor]  # per modality: int64 [n, 3]


def has_vision(sample: Mapping[str, Any]) -> bool:
    """Whether ``sample`` carries a vision field, or multi-row ``position_ids``."""
    if not VISION_KEYS.isdisjoint(sample.keys()):
        return True
    positions = sample.get("position_ids")
    return positions is not None and getattr(positions, "ndim", 1) == 2


def text_part(sample: Mapping[str, Any]) -> Mapping[str, Any]:
    """``sample`` for :func:`~seqpack.thd.normalize_sample`: without its vision fields and
    multi-row ``position_ids`` (the text row of a vision sample is its own ``arange``)."""
    if not has_vision(sample):
        return sample
    positions = sample.get("position_ids")
    drop = VISION_KEYS | {"second_per_grid_ts"} | ({"position_ids"} if getattr(positions, "ndim", 1) == 2 else set())
    return {key: value for key, value in sample.items() if key not in drop}


def normalize_vision(
    sample: Mapping[str, Any],
    input_ids: torch.Tensor,
    spec: MRopeSpec,
    *,
    text_positions: torch.Tensor | None = None,
    where: str = "sample",
) -> VisionSample:
    """One sample's vision fields checked against the contract, with its mRoPE positions.

    Args:
        sample: The sample as given (a text-only one included).
        input_ids: Its normalised ``input_ids`` (int64 ``[L]``).
        text_positions: Its normalised 1-D ``position_ids``, if it gave them: a text-only
            sample's mRoPE rows are these (else ``arange(L)``, as the model's).
        spec: The model family (:class:`~seqpack.thd.mrope.MRopeSpec`).
        where: How errors name the sample.

    Raises:
        SampleError: Pixels and grids that disagree with each other or with the placeholder
            runs; ``mm_token_type_ids`` that disagree with the placeholders; ``position_ids``
            not ``[3, L]``.
        SeqpackTypeError: A field of the wrong type or dtype.
    """
    length = int(input_ids.shape[0])
    types = spec.token_types(input_ids)
    given_types = sample.get("mm_token_type_ids")
    if given_types is not None:
        _check_types(_as_tensor(given_types, "mm_token_type_ids", where), types, where)
    pixels: dict[int, torch.Tensor] = {}
    grids: dict[int, torch.Tensor] = {}
    for kind, (pixel_key, grid_key, _) in _MEDIA.items():
        media = _media(sample, pixel_key, grid_key, spec, where)
        if media is not None:
            pixels[kind], grids[kind] = media
        else:
            _refuse_placeholders(types, kind, where)
    runs = placeholder_runs(types)
    run_grids = _match_runs(runs, grids, spec, where)
    positions = sample.get("position_ids")
    if positions is not None and getattr(positions, "ndim", 1) == 2:
        given = _as_tensor(positions, "position_ids", where)
        if given.is_floating_point() or given.dtype == torch.bool or tuple(given.shape) != (3, length):
            raise SampleError(
                f"{where}: multi-row 'position_ids' must be integer [3, {length}] (mRoPE's t, h, w rows), got "
                f"{given.dtype} {tuple(given.shape)}"
            )
        mrope = given.to(torch.int64)
    elif not grids and text_positions is not None:  # text only, its own 1-D positions: on every row
        mrope = text_positions.reshape(1, -1).expand(3, -1).clone()
    else:
        mrope = mrope_positions(runs, run_grids, spec, _video_intervals(sample, grids.get(VIDEO), spec, where))
    return VisionSample(positions=mrope, token_types=types, pixels=pixels, grids=grids)


def check_text_sample(input_ids: torch.Tensor, spec: MRopeSpec, where: str) -> None:
    """Refuse a text-only sample (no vision field, :func:`has_vision` false) that carries image
    or video placeholder tokens: the one check :func:`normalize_vision` makes of one.

    Raises:
        SampleError: Placeholder tokens without their grid.
    """
    types = spec.token_types(input_ids)
    for kind in _MEDIA:
        _refuse_placeholders(types, kind, where)


def _refuse_placeholders(types: torch.Tensor, kind: int, where: str) -> None:
    count = int((types == kind).sum())
    if count:
        _, grid_key, noun = _MEDIA[kind]
        raise SampleError(f"{where} has {count} {noun} placeholder tokens but no {grid_key}")


def _as_tensor(value: Any, key: str, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as err:
        raise SeqpackTypeError(f"{where}: {key!r} must be a tensor, numpy array or list, got {value!r:.60}") from err


def _check_types(given: torch.Tensor, types: torch.Tensor, where: str) -> None:
    if given.dim() != 1 or given.shape != types.shape or given.is_floating_point():
        raise SampleError(
            f"{where}: 'mm_token_type_ids' must be integer [{types.shape[0]}] like input_ids, got {given.dtype} "
            f"{tuple(given.shape)}"
        )
    wrong = given.to(torch.int64) != types
    if bool(wrong.any()):
        t = int(torch.nonzero(wrong)[0])
        raise SampleError(
            f"{where}: mm_token_type_ids[{t}]={int(given[t])} but the token there is {_kind_name(int(types[t]))} "
            "(0 text, 1 image placeholder, 2 video placeholder, by the model's image_token_id / video_token_id)"
        )


def _kind_name(kind: int) -> str:
    return {TEXT: "text (0)", IMAGE: "an image placeholder (1)", VIDEO: "a video placeholder (2)"}[kind]


def _media(
    sample: Mapping[str, Any], pixel_key: str, grid_key: str, spec: MRopeSpec, where: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One modality's pixels and grid, checked against each other; ``None`` when absent."""
    pixels, grid = sample.get(pixel_key), sample.get(grid_key)
    if pixels is None and grid is None:
        return None
    if grid is None:
        raise SampleError(f"{where} has {pixel_key} but no {grid_key}: every patch needs its (t, h, w) grid row")
    if pixels is None:
        raise SampleError(f"{where} has {grid_key} but no {pixel_key}: a grid row without its pixels")
    grid = _as_tensor(grid, grid_key, where)
    if grid.is_floating_point() or grid.dtype == torch.bool or grid.dim() != 2 or grid.shape[1] != 3:
        raise SampleError(
            f"{where}: {grid_key!r} must be integer [n, 3] (t, h, w), got {grid.dtype} {tuple(grid.shape)}"
        )
    grid = grid.to(torch.int64)
    if bool((grid <= 0).any()):
        raise SampleError(f"{where}: {grid_key} has a side <= 0: {grid.tolist()}")
    merge = spec.spatial_merge_size
    if bool((grid[:, 1:] % merge != 0).any()):
        raise SampleError(
            f"{where}: {grid_key} {grid.tolist()} has an h or w that is not a multiple of spatial_merge_size={merge}"
        )
    pixels = _as_tensor(pixels, pixel_key, where)
    if not pixels.is_floating_point() or pixels.dim() != 2:
        raise SampleError(
            f"{where}: {pixel_key!r} must be floating [patches, D], got {pixels.dtype} {tuple(pixels.shape)}"
        )
    patches = int(grid.prod(dim=1).sum())
    if pixels.shape[0] != patches:
        raise SampleError(
            f"{where}: {pixel_key} has {pixels.shape[0]} patches but {grid_key} {grid.tolist()} gives sum(t*h*w) = "
            f"{patches}"
        )
    return pixels, grid


def _match_runs(
    runs: list[tuple[int, int, int]], grids: dict[int, torch.Tensor], spec: MRopeSpec, where: str
) -> dict[int, list[tuple[int, int, int]]]:
    """The ``(t, h, w)`` of each placeholder run, each run's length checked against its grid."""
    merge = spec.spatial_merge_size
    per_run: dict[int, list[tuple[int, int, int]]] = {}
    for kind, grid in grids.items():
        rows = [(int(t), int(h), int(w)) for t, h, w in grid.tolist()]
        if kind == VIDEO and spec.frame_runs:  # Qwen3-VL: one run per frame, timestamps between
            rows = [(1, h, w) for t, h, w in rows for _ in range(t)]
        per_run[kind] = rows
    lengths: dict[int, list[int]] = {IMAGE: [], VIDEO: []}
    for kind, start, end in runs:
        if kind != TEXT:
            lengths[kind].append(end - start)
    for kind, (_, grid_key, noun) in _MEDIA.items():
        expected = per_run.get(kind, [])
        found = lengths[kind]
        unit = "frame" if kind == VIDEO and spec.frame_runs else noun
        if len(found) != len(expected):
            raise SampleError(
                f"{where} has {len(found)} {noun} placeholder runs (of {found} tokens) but {grid_key} gives "
                f"{len(expected)} {unit}s: each {unit} needs its own run of t*h*w / {merge}**2 placeholders, text "
                "between runs"
            )
        for index, ((t, h, w), got) in enumerate(zip(expected, found, strict=True)):
            if got != t * h * w // merge**2:
                raise SampleError(
                    f"{where}: {unit} {index} has {got} placeholder tokens but its grid ({t}, {h}, {w}) needs "
                    f"t*h*w / spatial_merge_size**2 = {t * h * w // merge**2}"
                )
    return per_run


def _video_intervals(
    sample: Mapping[str, Any], video_grid: torch.Tensor | None, spec: MRopeSpec, where: str
) -> list[torch.Tensor] | None:
    """Qwen2.5-VL's temporal spacing of each video (``tokens_per_second * second_per_grid_ts``)."""
    seconds = sample.get("second_per_grid_ts")
    if video_grid is None or spec.model_type != "qwen2_5_vl":
        return None
    if seconds is None:
        return [torch.tensor(spec.tokens_per_second)] * int(video_grid.shape[0])  # the model's default: 1 s
    # float32, as the processor's tensor: the model truncates (arange * interval) in that dtype.
    seconds = _as_tensor(seconds, "second_per_grid_ts", where).to(torch.float32).reshape(-1)
    if seconds.shape[0] != video_grid.shape[0]:
        raise SampleError(
            f"{where}: second_per_grid_ts has {seconds.shape[0]} entries for {video_grid.shape[0]} videos"
        )
    return [spec.tokens_per_second * s for s in seconds]


def pack_vision(
    parts: Sequence[VisionSample], cu_real: np.ndarray, layout: TokenLayout
) -> dict[str, torch.Tensor | None]:
    """The :class:`~seqpack.thd.PackedBatch` vision fields of a pack: pixels and grid rows
    concatenated in sequence order, ``mm_token_type_ids`` and the mRoPE rows on the token axis.

    Each sequence's mRoPE rows restart with it; its pads count on from its largest position + 1,
    slots without a sample from 0. Pads are text (type 0).

    Args:
        parts: Every sample's :func:`normalize_vision`, in pack order.
        cu_real: int64 ``[slots + 1]`` real offsets (the samples' sequences first).
        layout: The pack's :class:`~seqpack.thd.TokenLayout` (its padded slots).
    """
    total = int(layout.num_tokens)
    num = len(parts)
    real = ~layout.padding_mask
    dest = torch.from_numpy(np.flatnonzero(real.numpy()))  # [R]
    lengths = torch.from_numpy(cu_real[1 : num + 1] - cu_real[:num])  # [N]
    top = torch.stack([part.positions.max() if part.positions.numel() else torch.tensor(-1) for part in parts])
    shift = torch.zeros(cu_real.shape[0], dtype=torch.int64)  # [slots + 1]: a tail past the last slot included
    shift[:num] = top + 1 - lengths  # pads: largest position + 1 + their offset past the real tokens
    positions = (layout.position + shift[layout.seq_idx.long()]).expand(3, -1).clone()  # [3, T]
    positions[:, dest] = torch.cat([part.positions for part in parts], dim=1)
    types = torch.zeros(total, dtype=torch.int64)
    types[dest] = torch.cat([part.token_types for part in parts])
    fields: dict[str, torch.Tensor | None] = {MROPE_POSITIONS: positions, "mm_token_type_ids": types}
    for kind, (pixel_key, grid_key, _) in _MEDIA.items():
        fields[pixel_key], fields[grid_key] = _concat_media(parts, kind, pixel_key)
    return fields


def _concat_media(
    parts: Sequence[VisionSample], kind: int, pixel_key: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One modality's pixels and grid rows of every sample, in sequence order."""
    owners = [index for index, part in enumerate(parts) if kind in part.pixels]
    if not owners:
        return None, None
    first = parts[owners[0]].pixels[kind]
    for index in owners[1:]:
        pixels = parts[index].pixels[kind]
        if pixels.shape[1] != first.shape[1] or pixels.dtype != first.dtype:
            raise SampleError(
                f"sample {index}: {pixel_key} is {pixels.dtype} [.., {pixels.shape[1]}] but sample {owners[0]}'s is "
                f"{first.dtype} [.., {first.shape[1]}]: one pack holds one patch format"
            )
    pixels = torch.cat([parts[index].pixels[kind] for index in owners])
    grids = torch.cat([parts[index].grids[kind] for index in owners])
    return pixels, grids
