"""Vision-language samples in the wrapper (``PackingConfig(mrope=...)``, docs/multimodal.md).

Under ``mrope`` the reader checks every sample against the vision contract
(:func:`read_sequences`) and keeps its images and videos in its dict under
:data:`PAYLOAD_KEYS`. A sample's payload is one byte string on the wire (:func:`encode`),
whose size every DP rank learns in the length gather (the ``vision_bytes`` column): it prices
the exchange and sizes the payload all-to-all. :func:`with_vision` adds a microbatch's vision
fields from the samples that arrived. Unsupported topologies are refused by name
(:func:`check_topology`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqpack.errors import ConfigError, SampleError
from seqpack.options import DataOwner, LabelFormat
from seqpack.thd import PackedBatch, sample_sequences
from seqpack.thd.layout import token_layout
from seqpack.thd.mrope import IMAGE, VIDEO, MRopeSpec
from seqpack.thd.sample import MEDIA_FIELDS, MROPE_POSITIONS
from seqpack.thd.vision import VisionSample, check_text_sample, has_vision, normalize_vision, pack_vision, text_part
from seqpack.topology import Topology

__all__ = [
    "HEADER_WORDS",
    "PAYLOAD_KEYS",
    "check_topology",
    "decode",
    "encode",
    "payload_bytes",
    "read_sequences",
    "split_payload",
    "with_vision",
]

Sample = dict[str, torch.Tensor]

_MEDIA = ((IMAGE, *MEDIA_FIELDS[0]), (VIDEO, *MEDIA_FIELDS[1]))
PAYLOAD_KEYS: tuple[str, ...] = (*(key for pair in MEDIA_FIELDS for key in pair), MROPE_POSITIONS)
"""The keys of a read sample's vision payload (beside its 1-D token fields)."""

HEADER_WORDS = 9
"""int64 words before a payload's bytes: per modality its pixel rows, row width, dtype code
and grid rows; then the sample's length (the mRoPE rows' width)."""

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # the pixel dtype codes


def check_topology(topology: Topology, mrope: MRopeSpec | None, data_owner: DataOwner) -> None:
    """Refuse ``mrope`` on a topology whose batches could not carry the vision fields.

    Raises:
        ConfigError: CP > 1 (a vision-language pack is not CP-sharded), pipeline
            parallelism (middle stages get the layout alone), or TP > 1 under
            ``data_owner="tp0"`` (the TP broadcast does not carry pixels: use ``"all"``).
    """
    if mrope is None:
        return
    what = f"mrope ({mrope.model_type}) on {topology.describe()}"
    if topology.cp_size > 1:
        raise ConfigError(
            f"{what}: a vision-language pack cannot be CP-sharded yet (its images are encoded whole, the mRoPE rows "
            "are not cut); use cp_size=1"
        )
    if topology.pp_size > 1:
        raise ConfigError(f"{what}: pipeline stages do not get the vision fields yet; use pp_size=1")
    if topology.tp_size > 1 and data_owner == DataOwner.TP0:
        raise ConfigError(
            f"{what}: under data_owner='tp0' the TP broadcast does not carry pixels; pass data_owner='all' (every TP "
            "rank reads the same samples)"
        )


def read_sequences(item: Any, spec: MRopeSpec | None, *, where: str, label_format: LabelFormat) -> list[Sample]:
    """The sequences of one dataloader sample (:func:`~seqpack.thd.sample_sequences`), each
    under ``spec`` checked against the vision contract and carrying its payload.

    Raises:
        SampleError, SeqpackTypeError: As :func:`~seqpack.thd.normalize_sample` and
            :func:`~seqpack.thd.vision.normalize_vision`; a pre-packed sample with images.
    """
    if spec is None:
        return sample_sequences(item, where=where, label_format=label_format)
    vision = isinstance(item, Mapping) and has_vision(item)
    if vision and "cu_seqlens" in item:
        raise SampleError(f"{where} is pre-packed (cu_seqlens) and carries images or videos: give each sample alone")
    sequences = sample_sequences(text_part(item) if vision else item, where=where, label_format=label_format)
    for sequence in sequences:
        if not vision:  # its mRoPE rows are its text positions, laid out when packed (_part)
            check_text_sample(sequence["input_ids"], spec, where)
            continue
        checked = normalize_vision(
            item, sequence["input_ids"], spec, text_positions=sequence.get("position_ids"), where=where
        )
        if checked.grids:
            for kind, pixel_key, grid_key in _MEDIA:
                if kind in checked.grids:
                    sequence[pixel_key] = checked.pixels[kind].contiguous()
                    sequence[grid_key] = checked.grids[kind].contiguous()
            sequence[MROPE_POSITIONS] = checked.positions.contiguous()
    return sequences


def split_payload(sample: Mapping[str, torch.Tensor]) -> tuple[Sample, Sample]:
    """``sample``'s token fields and its vision payload (empty for a text-only sample)."""
    tokens = {key: value for key, value in sample.items() if key not in PAYLOAD_KEYS}
    return tokens, {key: sample[key] for key in PAYLOAD_KEYS if key in sample}


def payload_bytes(sample: Mapping[str, torch.Tensor], truncate_to: int | None = None, *, where: str = "") -> int:
    """Bytes of ``sample``'s encoded payload (:func:`encode`; 0 for a text-only one).

    Raises:
        SampleError: A sample with images or videos longer than ``truncate_to`` (a cut
            would leave placeholders without their pixels, or pixels without them).
    """
    if MROPE_POSITIONS not in sample:
        return 0
    length = int(sample[MROPE_POSITIONS].shape[1])
    if truncate_to is not None and length > truncate_to:
        raise SampleError(
            f"{where or 'a sample'} has images or videos and {length} tokens, more than the {truncate_to} that "
            "on_oversize='truncate' keeps: its placeholders would lose their pixels (use 'drop' or 'error')"
        )
    return HEADER_WORDS * 8 + sum(
        sample[key].numel() * sample[key].element_size() for key in PAYLOAD_KEYS if key in sample
    )


def encode(payload: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One sample's payload as bytes (uint8 ``[payload_bytes]``): the header, then per
    modality its pixels and grid rows, then the mRoPE rows."""
    header = []
    parts: list[torch.Tensor] = []
    for _, pixel_key, grid_key in _MEDIA:
        pixels, grid = payload.get(pixel_key), payload.get(grid_key)
        if pixels is None or grid is None:
            header += [0, 0, 0, 0]
            continue
        header += [pixels.shape[0], pixels.shape[1], _DTYPES.index(pixels.dtype), grid.shape[0]]
        parts += [_bytes(pixels), _bytes(grid.to(torch.int64))]
    positions = payload[MROPE_POSITIONS].to(torch.int64)
    header.append(positions.shape[1])
    return torch.cat([_bytes(torch.tensor(header, dtype=torch.int64)), *parts, _bytes(positions)])


def decode(data: torch.Tensor) -> Sample:
    """The payload :func:`encode` made ``data`` from (each tensor a copy: aligned, owned)."""
    header = _view(data, 0, HEADER_WORDS, torch.int64).tolist()
    at = HEADER_WORDS * 8
    out: Sample = {}
    for i, (_, pixel_key, grid_key) in enumerate(_MEDIA):
        rows, width, code, grid_rows = header[4 * i : 4 * i + 4]
        if grid_rows:
            dtype = _DTYPES[code]
            out[pixel_key] = _view(data, at, rows * width, dtype).view(rows, width)
            at += rows * width * dtype.itemsize
            out[grid_key] = _view(data, at, grid_rows * 3, torch.int64).view(grid_rows, 3)
            at += grid_rows * 24
    length = header[-1]
    out[MROPE_POSITIONS] = _view(data, at, 3 * length, torch.int64).view(3, length)
    return out


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _view(data: torch.Tensor, at: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    return data[at : at + count * dtype.itemsize].clone().view(dtype)


def with_vision(
    batch: PackedBatch,
    shards: Sequence[Mapping[str, torch.Tensor]],
    payloads: Sequence[Mapping[str, torch.Tensor]],
    lengths: Sequence[int],
    spec: MRopeSpec,
) -> PackedBatch:
    """``batch`` (one rank's whole microbatch, CP 1) with the vision fields of
    ``pack_sequences(mrope=spec)``, from each sequence's exchanged token fields, payload
    (empty: text only) and real length, in pack order."""
    assert batch.cp_size == 1 and batch.position_ids is not None and batch.input_ids is not None
    if not shards:  # a padding-only filler: text positions on every row, no pixels
        rows = batch.position_ids.to(torch.int64).expand(3, -1).clone()
        types = torch.zeros(batch.position_ids.shape[0], dtype=torch.int64)
        return dataclasses.replace(batch, mrope_position_ids=rows, mm_token_type_ids=types)
    parts = [_part(shard, payload, n, spec) for shard, payload, n in zip(shards, payloads, lengths, strict=True)]
    cu_real = batch.cu_seqlens.to(torch.int64).numpy()
    cu_padded = batch.cu_seqlens_padded.to(torch.int64)
    layout = token_layout(cu_padded, batch.cu_seqlens, total_tokens=int(batch.input_ids.shape[0]), validate=False)
    fields: dict[str, Any] = pack_vision(parts, cu_real, layout)
    return dataclasses.replace(batch, **fields)


def _part(
    shard: Mapping[str, torch.Tensor], payload: Mapping[str, torch.Tensor], n: int, spec: MRopeSpec
) -> VisionSample:
    """One sequence's :class:`VisionSample` from its exchanged tokens and payload."""
    types = spec.token_types(shard["input_ids"][:n])
    if MROPE_POSITIONS not in payload:  # text only: its text positions on every row
        own = shard.get("position_ids")
        text = own[:n].to(torch.int64) if own is not None else torch.arange(n, dtype=torch.int64)
        return VisionSample(positions=text.expand(3, -1).clone(), token_types=types, pixels={}, grids={})
    pixels = {kind: payload[key] for kind, key, _ in _MEDIA if key in payload}
    grids = {kind: payload[key] for kind, _, key in _MEDIA if key in payload}
    return VisionSample(positions=payload[MROPE_POSITIONS][:, :n], token_types=types, pixels=pixels, grids=grids)


def vision_columns(pool: Sequence[Mapping[str, torch.Tensor]], truncate_to: int | None) -> np.ndarray:
    """int64 ``[len(pool)]``: each sequence's payload bytes (the ``vision_bytes`` column)."""
    return np.array(
        [payload_bytes(s, truncate_to, where=f"sequence {i} of this rank's pool") for i, s in enumerate(pool)],
        dtype=np.int64,
    )
