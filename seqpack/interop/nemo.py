"""NeMo Automodel interop: its BSHD packed batches to THD, with its contract.

:func:`process_input_for_thd` and :func:`split_batch_into_thd_chunks` take and return what
NeMo Automodel's ``thd_utils`` functions of the same names do (shapes, ``-1000`` sentinel
filtering, tail-pad absorption, when ``cu_seqlens_padded`` is emitted), so code written for
NeMo runs unchanged. Deliberate differences, each where NeMo would go silently wrong: a row
tail left out of ``seq_lens_padded`` is folded into the row's last sequence instead of
shifting later rows onto the wrong tokens; ``num_chunks`` below 1 is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqpack.errors import ConfigError, SampleError, SeqpackTypeError
from seqpack.options import INT64_MAX
from seqpack.thd.layout import token_layout
from seqpack.validation import check_int, check_mapping, check_positive_int

__all__ = ["process_input_for_thd", "split_batch_into_thd_chunks"]


def _padding_mask_from_ids(input_ids: torch.Tensor, padding_token_id: int) -> torch.Tensor:
    """Only for batches without ``seq_lens``: pads must form one right-padded tail."""
    ids = input_ids if input_ids.dim() == 1 else input_ids.reshape(input_ids.shape[0], -1)[:, 0]
    padding = ids == padding_token_id
    real = int((~padding).sum())
    if not torch.equal(padding, torch.arange(ids.shape[0], device=ids.device) >= real):
        raise SampleError(
            f"padding_token_id={padding_token_id} also occurs inside the content, so padding cannot "
            "be inferred from token values; pass seq_lens / seq_lens_padded"
        )
    return padding


def _row_layout(
    seq_lens: torch.Tensor, seq_lens_padded: torch.Tensor, seq_len: int, sentinel: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid real and slot lengths (int64) across the rows, with each row's unlisted tail
    folded into the row's last sequence when a later row still holds sequences (where NeMo
    would point later rows' offsets at the wrong tokens)."""
    for name, value in (("seq_lens", seq_lens), ("seq_lens_padded", seq_lens_padded)):
        if not isinstance(value, torch.Tensor):
            raise SeqpackTypeError(f"{name} must be a tensor, got {type(value).__name__}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            # Lengths are counts: a float length would be truncated silently.
            raise SeqpackTypeError(f"{name} must hold integers, got dtype {value.dtype}")
        if value.dim() == 0 or value.shape[0] == 0:
            raise SampleError(f"{name} must be [B, num_packs], got shape {tuple(value.shape)}")
    reals = seq_lens.reshape(seq_lens.shape[0], -1)
    slots = seq_lens_padded.reshape(seq_lens_padded.shape[0], -1)
    if reals.shape != slots.shape:
        raise SampleError(
            f"seq_lens {tuple(seq_lens.shape)} and seq_lens_padded {tuple(seq_lens_padded.shape)} differ in shape"
        )
    keep_real = reals != sentinel
    keep_slot = slots != sentinel
    if not torch.equal(keep_real, keep_slot):
        raise SampleError(
            f"seq_lens and seq_lens_padded mark different entries as padding (seq_lens_padding_value={sentinel})"
        )
    real_list: list[torch.Tensor] = []
    slot_list: list[torch.Tensor] = []
    rows = reals.shape[0]
    row_counts = keep_real.sum(dim=1).tolist()
    last_nonempty = max((r for r in range(rows) if row_counts[r] > 0), default=-1)
    for row in range(rows):
        row_real = reals[row][keep_real[row]].long()
        row_slot = slots[row][keep_slot[row]].long()
        if bool((row_real < 0).any()) or bool((row_slot < row_real).any()):
            raise SampleError(
                f"row {row}: seq_lens {row_real.tolist()} must be >= 0 and <= seq_lens_padded {row_slot.tolist()} "
                f"(entries equal to seq_lens_padding_value={sentinel} are ignored)"
            )
        used = int(row_slot.sum())
        if used > seq_len:
            raise SampleError(f"row {row}: seq_lens_padded sums to {used} > sequence length {seq_len}")
        if row < last_nonempty and used < seq_len:
            if row_slot.numel() > 0:
                row_slot = row_slot.clone()
                row_slot[-1] += seq_len - used
            elif slot_list and slot_list[-1].numel() > 0:
                slot_list[-1] = slot_list[-1].clone()
                slot_list[-1][-1] += seq_len
            else:
                raise SampleError(f"row {row} holds no sequence but precedes rows that do")
        real_list.append(row_real)
        slot_list.append(row_slot)
    return torch.cat(real_list), torch.cat(slot_list)


def process_input_for_thd(
    batch: dict[str, Any],
    seq_lens_padding_value: int = -1000,
    padding_token_id: int = 0,
) -> dict[str, Any]:
    """Convert a BSHD packed batch to THD (NeMo Automodel's ``process_input_for_thd``).

    Args:
        batch: ``input_ids`` ``[B, S]`` (token ids) or ``[B, S, H]`` (embeddings),
            ``labels`` ``[B, S]``, ``position_ids`` ``[B, S]`` (or ``[n_rope, B, S]``),
            ``seq_lens`` / ``seq_lens_padded`` ``[B, num_packs]`` where entries equal to
            ``seq_lens_padding_value`` are filtered out. Other keys pass through.
        seq_lens_padding_value: Sentinel marking unused ``seq_lens`` entries.
        padding_token_id: Pad token id; only consulted when ``seq_lens`` is absent.

    Returns:
        ``input_ids`` ``[B*S]`` (or ``[B*S, H]``), ``labels`` ``[B*S]``, ``position_ids``
        ``[B*S]``, ``cu_seqlens`` (int32, real lengths; when the only padding is the pack's
        tail, its last entry grows to ``B*S`` to absorb it), ``cu_seqlens_padded`` (int32,
        only when it still differs from ``cu_seqlens``), ``max_seqlen`` (int32 scalar tensor,
        the largest ``cu_seqlens`` step), ``padding_mask`` (bool ``[B*S]`` from the layout,
        not from token values) and every other key unchanged.

    Raises:
        SeqpackTypeError: ``input_ids`` not a tensor; ``seq_lens`` / ``seq_lens_padded`` not
            integer tensors (a float length is never truncated).
        SampleError: Shapes that disagree, lengths outside their rows, sentinels that differ
            between ``seq_lens`` and ``seq_lens_padded``, or (without ``seq_lens``) a pad
            token inside the content.
    """
    check_mapping("batch", batch)
    seq_lens_padding_value = check_int(
        "seq_lens_padding_value", seq_lens_padding_value, minimum=-INT64_MAX - 1, maximum=INT64_MAX
    )
    padding_token_id = check_int("padding_token_id", padding_token_id, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
    input_ids = _checked_bshd(batch)
    total_tokens = int(input_ids.shape[0]) * int(input_ids.shape[1])
    input_ids_thd = input_ids.reshape(total_tokens, *input_ids.shape[2:])
    labels, position_ids = batch.get("labels"), batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor):  # mRoPE [n_rope, B, S] -> [n_rope, 1, B*S]
        rope = position_ids.dim() == 3
        position_ids = position_ids.reshape(position_ids.shape[0], 1, -1) if rope else position_ids.reshape(-1)
    result: dict[str, Any] = {
        "input_ids": input_ids_thd,
        "position_ids": position_ids,
        "labels": labels.reshape(total_tokens) if isinstance(labels, torch.Tensor) else labels,
    }
    if batch.get("seq_lens") is None:
        result["cu_seqlens"] = None
        result["padding_mask"] = _padding_mask_from_ids(input_ids_thd, padding_token_id)
    else:
        result.update(_thd_layout(batch, int(input_ids.shape[1]), total_tokens, seq_lens_padding_value))
    for key, value in batch.items():
        if key not in result and key not in ("seq_lens", "seq_lens_padded"):
            result[key] = value
    return result


def _checked_bshd(batch: Mapping[str, Any]) -> torch.Tensor:
    """``batch["input_ids"]`` after checking it and the shapes of ``labels`` / ``position_ids``."""
    if "input_ids" not in batch:
        raise SampleError(f"batch has no 'input_ids' (keys: {sorted(map(str, batch))})")
    input_ids = batch["input_ids"]
    if not isinstance(input_ids, torch.Tensor):
        raise SeqpackTypeError(f"input_ids must be a [B, S] or [B, S, H] tensor, got {type(input_ids).__name__}")
    if input_ids.dim() not in (2, 3):
        raise SampleError(f"input_ids must be [B, S] or [B, S, H], got {tuple(input_ids.shape)}")
    batch_size, seq_len = int(input_ids.shape[0]), int(input_ids.shape[1])
    for key in ("labels", "position_ids"):
        value = batch.get(key)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise SeqpackTypeError(f"{key} must be a tensor, got {type(value).__name__}")
        rope = key == "position_ids" and value.dim() == 3  # mRoPE [n_rope, B, S]
        if tuple(value.shape[1:] if rope else value.shape) != (batch_size, seq_len):
            raise SampleError(
                f"{key} has shape {tuple(value.shape)} but input_ids has {tuple(input_ids.shape)}: "
                f"expected {(batch_size, seq_len)}"
            )
    return input_ids


def _thd_layout(batch: Mapping[str, Any], seq_len: int, total_tokens: int, sentinel: int) -> dict[str, Any]:
    """``cu_seqlens``, ``cu_seqlens_padded`` (when it differs), ``padding_mask`` and
    ``max_seqlen`` of a batch carrying ``seq_lens`` (and maybe ``seq_lens_padded``)."""
    seq_lens, seq_lens_padded = batch["seq_lens"], batch.get("seq_lens_padded")
    if seq_lens_padded is not None:
        reals, slots = _row_layout(seq_lens, seq_lens_padded, seq_len, sentinel)
    else:
        # Sequences sit back to back inside each row. When a row other than the last ends
        # in padding, later rows start after it: that gap becomes the row's last slot's
        # padding (NeMo would shift every later sequence onto the wrong tokens).
        reals, slots = _row_layout(seq_lens, seq_lens, seq_len, sentinel)
        if torch.equal(reals, slots):  # no padding at all: no cu_seqlens_padded, nothing absorbed
            slots = None
    cu_seqlens = _offsets(reals)
    cu_seqlens_padded = None if slots is None else _offsets(slots)
    # From the layout, before the tail is absorbed (_row_layout checked 0 <= real <= slot).
    cu_slots = cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded
    padding_mask = token_layout(cu_slots, cu_seqlens, total_tokens=total_tokens, validate=False).padding_mask
    # Only the pack's tail is padding: absorb it into the last sequence so the two arrays
    # agree and TE can skip its pad_between_seqs path.
    if cu_seqlens_padded is not None and cu_seqlens.numel() > 1:
        if torch.equal(cu_seqlens[:-1], cu_seqlens_padded[:-1]) and int(cu_seqlens[-1]) < total_tokens:
            cu_seqlens[-1] = total_tokens
            cu_seqlens_padded = cu_seqlens.clone()
    out: dict[str, Any] = {
        "cu_seqlens": cu_seqlens.to(torch.int32),
        "padding_mask": padding_mask,
    }
    if cu_seqlens_padded is not None and not torch.equal(cu_seqlens_padded, cu_seqlens):
        out["cu_seqlens_padded"] = cu_seqlens_padded.to(torch.int32)
    if cu_seqlens.numel() > 1:
        out["max_seqlen"] = (cu_seqlens[1:] - cu_seqlens[:-1]).max().to(torch.int32)
    return out


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    """int64 ``[n+1]`` running sums of ``lengths``, starting at 0."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=out[1:])
    return out


def split_batch_into_thd_chunks(
    batch: dict[str, Any],
    num_chunks: int,
    seq_lens_padding_value: int = -1000,
    padding_token_id: int = 0,
) -> dict[str, Any]:
    """Split a BSHD batch along its batch axis into ``num_chunks`` THD chunks, stacked.

    Each chunk goes through :func:`process_input_for_thd`; token tensors are stacked to
    ``[num_chunks, tokens_per_chunk, ...]``, ``cu_seqlens`` to ``[num_chunks, max_seqs + 1]``
    right-padded with ``seq_lens_padding_value``, ``max_seqlen`` to ``[num_chunks]`` (0 for a
    chunk without sequences).
    ``cu_seqlens_padded`` is emitted when any chunk emits it (other chunks contribute their
    ``cu_seqlens``). ``num_chunks == 1`` returns :func:`process_input_for_thd` unchanged.

    Raises:
        SeqpackTypeError: ``num_chunks`` is not an integer.
        ConfigError: ``num_chunks`` is below 1 (NeMo would quietly treat it as 1) or does not
            divide the batch size.
        SampleError: The batch breaks :func:`process_input_for_thd`'s contract.
    """
    num_chunks = check_positive_int("num_chunks", num_chunks)
    check_mapping("batch", batch)
    check_int("seq_lens_padding_value", seq_lens_padding_value, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
    check_int("padding_token_id", padding_token_id, minimum=-INT64_MAX - 1, maximum=INT64_MAX)
    if num_chunks == 1:
        return process_input_for_thd(batch, seq_lens_padding_value, padding_token_id)
    if not isinstance(batch.get("input_ids"), torch.Tensor):
        raise SampleError(f"batch has no 'input_ids' tensor (keys: {sorted(batch)})")
    batch_size = int(batch["input_ids"].shape[0])
    if batch_size % num_chunks != 0:
        raise ConfigError(f"batch size {batch_size} is not divisible by num_chunks={num_chunks}")
    rows = batch_size // num_chunks
    chunks = []
    for index in range(num_chunks):
        chunk = {
            key: (
                value[index * rows : (index + 1) * rows]
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size
                else value
            )
            for key, value in batch.items()
        }
        position_ids = batch.get("position_ids")
        if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 3:
            chunk["position_ids"] = position_ids[:, index * rows : (index + 1) * rows]
        chunks.append(process_input_for_thd(chunk, seq_lens_padding_value, padding_token_id))

    if any("max_seqlen" in chunk for chunk in chunks):  # a chunk without sequences has none: 0
        for chunk in chunks:
            chunk.setdefault("max_seqlen", torch.zeros((), dtype=torch.int32, device=chunk["cu_seqlens"].device))
    result: dict[str, Any] = {}
    any_padded = any("cu_seqlens_padded" in chunk for chunk in chunks)
    for key in chunks[0]:
        if key == "cu_seqlens_padded":
            continue
        values = [chunk[key] for chunk in chunks]
        if not all(isinstance(v, torch.Tensor) for v in values):
            result[key] = values[0]
        elif key == "cu_seqlens":
            result[key] = _stack_right_padded(values, seq_lens_padding_value)
        else:
            result[key] = torch.stack(values)
    if any_padded:
        result["cu_seqlens_padded"] = _stack_right_padded(
            [chunk.get("cu_seqlens_padded", chunk["cu_seqlens"]) for chunk in chunks],
            seq_lens_padding_value,
        )
    return result


def _stack_right_padded(tensors: list[torch.Tensor], fill: int) -> torch.Tensor:
    width = max(t.numel() for t in tensors)
    out = torch.full((len(tensors), width), fill, dtype=tensors[0].dtype, device=tensors[0].device)
    for row, tensor in enumerate(tensors):
        out[row, : tensor.numel()] = tensor
    return out
