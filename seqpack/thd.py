"""THD packing: many variable-length sequences on one token axis.

A microbatch in THD format is every sequence of the pack concatenated along one token axis,
with the boundaries in ``cu_seqlens`` (real lengths) and ``cu_seqlens_padded`` (memory
offsets when each sequence is padded at its end). This module builds such packs
(:func:`pack_sequences`), describes them (:class:`PackedBatch`) and converts NeMo Automodel's
BSHD packed batches to THD (:func:`process_input_for_thd`,
:func:`split_batch_into_thd_chunks`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "position_ids")
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

__all__ = [
    "IGNORE_INDEX",
    "PackedBatch",
    "pack_sequences",
    "padding_only_batch",
    "pad_multiple_for",
    "padded_lengths",
    "split_packed_sample",
    "process_input_for_thd",
    "split_batch_into_thd_chunks",
]


@dataclasses.dataclass
class PackedBatch:
    """One THD microbatch (or this CP rank's shard of it).

    Token fields (``input_ids`` ... ``padding_mask``) hold this rank's tokens; under CP they
    are the DualChunkSwap shard (``T / cp_size`` tokens) while ``cu_seqlens*`` and
    ``max_seqlen`` stay global, as Transformer Engine expects. Middle pipeline stages get
    ``input_ids``, ``labels`` and ``loss_mask`` as ``None``.
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

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole (unsharded) pack."""
        return self.num_tokens * self.cp_size

    def seq_lens(self) -> torch.Tensor:
        """Real length of every sequence (int64 [N])."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def seq_lens_padded(self) -> torch.Tensor:
        """Padded length of every sequence (int64 [N])."""
        return (self.cu_seqlens_padded[1:] - self.cu_seqlens_padded[:-1]).long()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """A copy with every tensor on ``device`` (the identity of a shared cu_seqlens kept)."""
        shared = self.cu_seqlens_padded is self.cu_seqlens
        moved = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=non_blocking)
            moved[field.name] = value
        if shared:
            moved["cu_seqlens_padded"] = moved["cu_seqlens"]
        return PackedBatch(**moved)

    def te_kwargs(
        self,
        *,
        pad_between_seqs: bool | None = None,
        padded_as_real: bool = False,
        include_format: bool = True,
    ) -> dict[str, Any]:
        """Keyword arguments for TE ``DotProductAttention.forward`` in THD.

        ``pad_between_seqs`` is always stated (TE issue #3331: left to TE, real lengths that
        are not multiples of ``2*cp`` give silently wrong attention). When the only padding is
        the pack's tail, it is absorbed into the last sequence and the same tensor object is
        passed as ``cu_seqlens`` and ``cu_seqlens_padded`` (TE #3487 decides the fast path
        by identity). That is exact for causal attention: pads sit after every real token of
        their sequence and carry no loss.

        Args:
            pad_between_seqs: Override the derived flag (rarely right to change).
            padded_as_real: Pass padded offsets as the real lengths too (NeMo Automodel's CP
                path): every pad token is attended as if real, exact for causal attention
                because pads sit at the end of their sequence and carry no loss.
            include_format: Include ``qkv_format="thd"`` and
                ``attn_mask_type="padding_causal"``.
        """
        cu_real, cu_padded = self.cu_seqlens, self.cu_seqlens_padded
        if padded_as_real or cu_padded is cu_real or _only_tail_differs(cu_real, cu_padded):
            cu_real = cu_padded
            derived = False
        else:
            derived = True
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


def _only_tail_differs(cu_real: torch.Tensor, cu_padded: torch.Tensor) -> bool:
    # cu_seqlens are tiny ([N+1]); on a GPU this comparison is one host sync per call.
    return bool(torch.equal(cu_real[:-1], cu_padded[:-1]))


def pad_multiple_for(
    cp_size: int, tp_size: int = 1, sequence_parallel: bool = False, fp8: bool = False
) -> int:
    """The multiple every sequence's padded length must have.

    ``2*cp`` under context parallelism (DualChunkSwap cuts each sequence in ``2*cp`` chunks),
    times ``tp`` under sequence parallelism (the token axis is split over TP too), and a
    multiple of 16 under FP8 (its GEMMs need 16-aligned token counts).
    """
    for name, value in (("cp_size", cp_size), ("tp_size", tp_size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    multiple = 2 * cp_size if cp_size > 1 else 1
    if sequence_parallel:
        multiple *= tp_size
    if fp8:
        multiple = math.lcm(multiple, 16)
    return int(multiple)


def padded_lengths(lengths: np.ndarray | Sequence[int], pad_multiple: int) -> np.ndarray:
    """Smallest multiple of ``pad_multiple`` that holds each length (int64 array)."""
    arr = np.asarray(lengths, dtype=np.int64)
    return -(-arr // pad_multiple) * pad_multiple


def _check_pad_args(pad_multiple: int, pad_to: int | None) -> None:
    if not isinstance(pad_multiple, (int, np.integer)) or isinstance(pad_multiple, bool) or pad_multiple < 1:
        raise ValueError(f"pad_multiple must be a positive integer, got {pad_multiple!r}")
    if pad_to is not None and (not isinstance(pad_to, (int, np.integer)) or pad_to < 0):
        raise ValueError(f"pad_to must be a non-negative integer or None, got {pad_to!r}")


def _sample_tensor(sample: Mapping[str, Any], key: str, index: int) -> torch.Tensor:
    value = sample[key]
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (np.ndarray, list, tuple)):
            value = torch.as_tensor(np.asarray(value))
        else:
            raise TypeError(f"sample {index}: {key!r} must be a 1-D tensor, got {type(value).__name__}")
    if value.dim() != 1:
        raise ValueError(f"sample {index}: {key!r} must be 1-D, got shape {tuple(value.shape)}")
    return value


def pack_sequences(
    samples: Sequence[Mapping[str, Any]],
    *,
    pad_multiple: int = 1,
    pad_to: int | None = None,
    pad_token_id: int = 0,
    sample_ids: Sequence[int] | np.ndarray | torch.Tensor | None = None,
) -> PackedBatch:
    """Pack samples into one THD microbatch.

    Each sequence is padded at its end to a multiple of ``pad_multiple``; ``pad_to`` then
    pads the pack's tail, absorbed into the last sequence's padding so every token belongs to
    a sequence. Pads carry ``pad_token_id``, label ``-100`` and loss mask 0; ``position_ids``
    restart at 0 for every sequence and keep counting through its padding.

    Args:
        samples: Mappings of equal-length 1-D tensors. ``input_ids`` (integers) is
            required; ``labels`` defaults to the next-token labels of ``input_ids`` (last
            token -100), ``loss_mask`` to ``labels != -100``, ``position_ids`` to
            ``arange(len)``.
        pad_multiple: Every sequence's padded length is a multiple of this.
        pad_to: Total token count of the pack (a multiple of ``pad_multiple``).
        pad_token_id: Token id written into pad slots.
        sample_ids: Global id of every sample (default ``0..N-1``).

    Raises:
        ValueError: Empty ``samples``, a zero-length sequence, tensors of unequal length in
            one sample, a pack longer than ``pad_to``, or bad padding arguments.
        TypeError: Non-integer ``input_ids`` or a non-tensor field.
    """
    _check_pad_args(pad_multiple, pad_to)
    if len(samples) == 0:
        raise ValueError("pack_sequences needs at least one sample, got an empty list")
    if pad_to is not None and pad_to % pad_multiple != 0:
        raise ValueError(f"pad_to={pad_to} must be a multiple of pad_multiple={pad_multiple}")

    num_seqs = len(samples)
    ids_list: list[torch.Tensor] = []
    lengths = np.empty(num_seqs, dtype=np.int64)
    present = {key: 0 for key in TOKEN_KEYS[1:]}
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise TypeError(f"sample {index} must be a mapping of tensors, got {type(sample).__name__}")
        if "input_ids" not in sample:
            raise ValueError(f"sample {index} has no 'input_ids' (keys: {sorted(sample)})")
        ids = _sample_tensor(sample, "input_ids", index)
        if ids.dtype not in _INT_DTYPES:
            raise TypeError(f"sample {index}: input_ids must hold integers, got dtype {ids.dtype}")
        length = ids.shape[0]
        if length == 0:
            raise ValueError(f"sample {index} has a zero-length sequence")
        for key in present:
            if key in sample and sample[key] is not None:
                other = _sample_tensor(sample, key, index)
                if other.shape[0] != length:
                    raise ValueError(
                        f"sample {index}: {key!r} has {other.shape[0]} tokens but input_ids has {length}"
                    )
                present[key] += 1
        ids_list.append(ids)
        lengths[index] = length

    padded = padded_lengths(lengths, pad_multiple)
    real_total = int(lengths.sum())
    padded_total = int(padded.sum())
    if pad_to is not None:
        if pad_to < padded_total:
            raise ValueError(
                f"pack needs {padded_total} tokens ({num_seqs} sequences, {real_total} real, "
                f"pad_multiple={pad_multiple}) but pad_to={pad_to}"
            )
        padded[-1] += pad_to - padded_total
        padded_total = pad_to

    cu_real_np = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_real_np[1:])
    cu_padded_np = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(padded, out=cu_padded_np[1:])

    flat_ids = torch.cat(ids_list).to(torch.int64)

    # Labels: the sample's own where given, else next-token labels of its input_ids.
    labels_real = torch.full((real_total,), IGNORE_INDEX, dtype=torch.int64)
    if real_total > 1:
        labels_real[:-1] = flat_ids[1:]
    last_of_seq = torch.from_numpy(cu_real_np[1:] - 1)
    labels_real[last_of_seq] = IGNORE_INDEX
    if present["labels"]:
        _override(labels_real, samples, "labels", cu_real_np, torch.int64)
    mask_real = (labels_real != IGNORE_INDEX).to(torch.float32)
    if present["loss_mask"]:
        _override(mask_real, samples, "loss_mask", cu_real_np, torch.float32)

    seq_starts = torch.from_numpy(np.repeat(cu_padded_np[:-1], padded))
    position_ids = torch.arange(padded_total, dtype=torch.int64) - seq_starts
    seq_idx = torch.from_numpy(np.repeat(np.arange(num_seqs, dtype=np.int32), padded))

    if padded_total == real_total:  # no padding anywhere: the real stream is the pack
        input_ids, labels, loss_mask = flat_ids, labels_real, mask_real
        padding_mask = torch.zeros(padded_total, dtype=torch.bool)
        if present["position_ids"]:
            _override(position_ids, samples, "position_ids", cu_real_np, torch.int64)
    else:
        # Destination of every real token: its offset in the real stream, shifted by the
        # padding that precedes its sequence.
        shift = torch.from_numpy(np.repeat(cu_padded_np[:-1] - cu_real_np[:-1], lengths))
        dest = torch.arange(real_total, dtype=torch.int64) + shift
        input_ids = torch.full((padded_total,), int(pad_token_id), dtype=torch.int64).index_copy_(0, dest, flat_ids)
        labels = torch.full((padded_total,), IGNORE_INDEX, dtype=torch.int64).index_copy_(0, dest, labels_real)
        loss_mask = torch.zeros(padded_total, dtype=torch.float32).index_copy_(0, dest, mask_real)
        padding_mask = torch.ones(padded_total, dtype=torch.bool).index_fill_(0, dest, False)
        if present["position_ids"]:
            pos_real = position_ids.index_select(0, dest)
            _override(pos_real, samples, "position_ids", cu_real_np, torch.int64)
            # Pads keep counting from their sequence's last real position.
            last_pos = pos_real[last_of_seq]
            seq_of_token = torch.from_numpy(np.repeat(np.arange(num_seqs), padded))
            position_ids = position_ids - torch.from_numpy(np.repeat(lengths, padded)) + 1 + last_pos[seq_of_token]
            position_ids.index_copy_(0, dest, pos_real)

    cu_seqlens = torch.from_numpy(cu_real_np.astype(np.int32))
    if np.array_equal(cu_real_np, cu_padded_np):
        cu_seqlens_padded = cu_seqlens  # same object: TE's no-padding fast path (TE #3487)
    else:
        cu_seqlens_padded = torch.from_numpy(cu_padded_np.astype(np.int32))

    return PackedBatch(
        input_ids=input_ids,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=position_ids,
        seq_idx=seq_idx,
        padding_mask=padding_mask,
        cu_seqlens=cu_seqlens,
        cu_seqlens_padded=cu_seqlens_padded,
        max_seqlen=int(padded.max()),
        sample_ids=_as_sample_ids(sample_ids, num_seqs),
    )


def _override(
    target: torch.Tensor,
    samples: Sequence[Mapping[str, Any]],
    key: str,
    cu_real: np.ndarray,
    dtype: torch.dtype,
) -> None:
    """Write each sample's own ``key`` (where it has one) over the defaults in ``target``."""
    values = [sample.get(key) for sample in samples]
    if all(v is not None for v in values):  # the common case: one concatenation
        target.copy_(torch.cat([torch.as_tensor(v) for v in values]).to(dtype))
        return
    for index, value in enumerate(values):
        if value is not None:
            target[cu_real[index] : cu_real[index + 1]] = torch.as_tensor(value).to(dtype)


def _as_sample_ids(sample_ids: Any, num_seqs: int) -> torch.Tensor:
    if sample_ids is None:
        return torch.arange(num_seqs, dtype=torch.int64)
    ids = torch.as_tensor(np.asarray(sample_ids), dtype=torch.int64).reshape(-1)
    if ids.shape[0] != num_seqs:
        raise ValueError(f"sample_ids has {ids.shape[0]} entries for {num_seqs} samples")
    return ids


def padding_only_batch(num_tokens: int, *, pad_token_id: int = 0) -> PackedBatch:
    """A microbatch with no real token: one empty sequence padded to ``num_tokens``.

    Used when a replica has nothing scheduled in a microbatch round but must still run the
    step (FSDP and pipeline schedules need every rank to take part). Its ``sample_ids`` is
    ``[-1]``, its loss mask is all zero.
    """
    if not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
        raise ValueError(f"num_tokens must be a positive integer, got {num_tokens!r}")
    n = int(num_tokens)
    return PackedBatch(
        input_ids=torch.full((n,), int(pad_token_id), dtype=torch.int64),
        labels=torch.full((n,), IGNORE_INDEX, dtype=torch.int64),
        loss_mask=torch.zeros(n, dtype=torch.float32),
        position_ids=torch.arange(n, dtype=torch.int64),
        seq_idx=torch.zeros(n, dtype=torch.int32),
        padding_mask=torch.ones(n, dtype=torch.bool),
        cu_seqlens=torch.tensor([0, 0], dtype=torch.int32),
        cu_seqlens_padded=torch.tensor([0, n], dtype=torch.int32),
        max_seqlen=n,
        sample_ids=torch.tensor([-1], dtype=torch.int64),
    )


def split_packed_sample(
    sample: Mapping[str, Any], *, keys: Sequence[str] = TOKEN_KEYS
) -> list[dict[str, torch.Tensor]]:
    """Split a pre-packed sample (one carrying ``cu_seqlens``) into its sequences.

    ``cu_seqlens`` gives real lengths; ``cu_seqlens_padded`` (optional) the offsets. Pad
    tokens between sequences are dropped: seqpack re-pads after scheduling.
    """
    if "cu_seqlens" not in sample:
        raise ValueError("split_packed_sample needs a 'cu_seqlens' field")
    cu = torch.as_tensor(sample["cu_seqlens"]).reshape(-1).to(torch.int64)
    cu_padded = torch.as_tensor(sample.get("cu_seqlens_padded", cu)).reshape(-1).to(torch.int64)
    if cu.shape != cu_padded.shape:
        raise ValueError(
            f"cu_seqlens has {cu.numel()} entries but cu_seqlens_padded has {cu_padded.numel()}"
        )
    starts = cu_padded[:-1].tolist()
    lens = (cu[1:] - cu[:-1]).tolist()
    ends = cu_padded[1:].tolist()
    total = int(torch.as_tensor(sample["input_ids"]).shape[0])
    if ends and ends[-1] > total:
        raise ValueError(f"cu_seqlens_padded ends at {ends[-1]} but input_ids has {total} tokens")
    out = []
    for start, length, end in zip(starts, lens, ends):
        if length < 0 or start + length > end:
            raise ValueError(f"inconsistent pack layout: real length {length} in slot [{start}, {end})")
        out.append(
            {key: sample[key][start : start + length] for key in keys if sample.get(key) is not None}
        )
    return out


# ---------------------------------------------------------------------------------------
# NeMo Automodel contract: BSHD packed batches to THD.
# ---------------------------------------------------------------------------------------


def _layout_padding_mask(total_tokens: int, reals: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Padding mask from the pack layout: slot ``i`` spans ``slots[i]`` tokens, of which the
    first ``reals[i]`` are real; tokens past the last slot are trailing pack pad."""
    device = reals.device
    positions = torch.arange(total_tokens, device=device)
    if reals.numel() == 0:
        return torch.ones(total_tokens, dtype=torch.bool, device=device)
    starts = torch.zeros(slots.numel() + 1, dtype=torch.long, device=device)
    torch.cumsum(slots.long(), dim=0, out=starts[1:])
    segment = torch.searchsorted(starts[1:], positions, right=True).clamp(max=reals.numel() - 1)
    return ((positions - starts[segment]) >= reals.long()[segment]) | (positions >= starts[-1])


def _padding_mask_from_ids(input_ids: torch.Tensor, padding_token_id: int) -> torch.Tensor:
    """Only for batches without ``seq_lens``: pads must form one right-padded tail."""
    ids = input_ids if input_ids.dim() == 1 else input_ids.reshape(input_ids.shape[0], -1)[:, 0]
    padding = ids == padding_token_id
    real = int((~padding).sum())
    if not torch.equal(padding, torch.arange(ids.shape[0], device=ids.device) >= real):
        raise ValueError(
            f"padding_token_id={padding_token_id} also occurs inside the content, so padding cannot "
            "be inferred from token values; pass seq_lens / seq_lens_padded"
        )
    return padding


def _row_layout(
    seq_lens: torch.Tensor, seq_lens_padded: torch.Tensor, seq_len: int, sentinel: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid real and slot lengths across the rows, with each row's unlisted tail folded into
    the row's last sequence when a later row still holds sequences.

    NeMo assumes every row but the last is fully covered by its ``seq_lens_padded``; when it is
    not, offsets of later rows would silently point at the wrong tokens. Folding the row tail
    into the row's last slot keeps every sequence where its tokens are.
    """
    reals = seq_lens.reshape(seq_lens.shape[0], -1)
    slots = seq_lens_padded.reshape(seq_lens_padded.shape[0], -1)
    if reals.shape != slots.shape:
        raise ValueError(
            f"seq_lens {tuple(seq_lens.shape)} and seq_lens_padded {tuple(seq_lens_padded.shape)} differ in shape"
        )
    keep_real = reals != sentinel
    keep_slot = slots != sentinel
    if not torch.equal(keep_real, keep_slot):
        raise ValueError("seq_lens and seq_lens_padded mark different entries as padding")
    real_list, slot_list = [], []
    rows = reals.shape[0]
    row_counts = keep_real.sum(dim=1).tolist()
    last_nonempty = max((r for r in range(rows) if row_counts[r] > 0), default=-1)
    for row in range(rows):
        row_real = reals[row][keep_real[row]].long()
        row_slot = slots[row][keep_slot[row]].long()
        if bool((row_real < 0).any()) or bool((row_slot < row_real).any()):
            raise ValueError(
                f"row {row}: seq_lens {row_real.tolist()} must be >= 0 and <= seq_lens_padded {row_slot.tolist()}"
            )
        used = int(row_slot.sum())
        if used > seq_len:
            raise ValueError(f"row {row}: seq_lens_padded sums to {used} > sequence length {seq_len}")
        if row < last_nonempty and used < seq_len:
            if row_slot.numel() > 0:
                row_slot = row_slot.clone()
                row_slot[-1] += seq_len - used
            elif slot_list and slot_list[-1].numel() > 0:
                slot_list[-1] = slot_list[-1].clone()
                slot_list[-1][-1] += seq_len
            else:
                raise ValueError(f"row {row} holds no sequence but precedes rows that do")
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
    """
    if "input_ids" not in batch:
        raise ValueError(f"batch has no 'input_ids' (keys: {sorted(batch)})")
    input_ids = batch["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() not in (2, 3):
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be [B, S] or [B, S, H], got {shape}")
    batch_size, seq_len = int(input_ids.shape[0]), int(input_ids.shape[1])
    total_tokens = batch_size * seq_len
    for key in ("labels", "position_ids"):
        value = batch.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 2 and tuple(value.shape) != (batch_size, seq_len):
            raise ValueError(f"{key} has shape {tuple(value.shape)}, expected {(batch_size, seq_len)}")

    input_ids_thd = input_ids.reshape(total_tokens, *input_ids.shape[2:])
    labels = batch.get("labels")
    labels_thd = labels.reshape(total_tokens) if isinstance(labels, torch.Tensor) else labels
    position_ids = batch.get("position_ids")
    if isinstance(position_ids, torch.Tensor):
        if position_ids.dim() == 3:  # mRoPE [n_rope, B, S] -> [n_rope, 1, B*S]
            position_ids_thd = position_ids.reshape(position_ids.shape[0], 1, -1)
        else:
            position_ids_thd = position_ids.reshape(-1)
    else:
        position_ids_thd = position_ids

    seq_lens = batch.get("seq_lens")
    seq_lens_padded = batch.get("seq_lens_padded")
    result: dict[str, Any] = {
        "input_ids": input_ids_thd,
        "position_ids": position_ids_thd,
        "labels": labels_thd,
    }
    if seq_lens is None:
        result["cu_seqlens"] = None
        result["padding_mask"] = _padding_mask_from_ids(input_ids_thd, padding_token_id)
    else:
        if seq_lens_padded is not None:
            reals, slots = _row_layout(seq_lens, seq_lens_padded, seq_len, seq_lens_padding_value)
        else:
            # Sequences sit back to back inside each row. When a row other than the last ends
            # in padding, later rows start after it: that gap becomes the row's last slot's
            # padding (NeMo would shift every later sequence onto the wrong tokens).
            reals, slots = _row_layout(seq_lens, seq_lens, seq_len, seq_lens_padding_value)
            if torch.equal(reals, slots):
                slots = None
        device = reals.device
        cu_seqlens = torch.zeros(reals.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(reals, dim=0, out=cu_seqlens[1:])
        cu_seqlens_padded = None
        if slots is not None:
            cu_seqlens_padded = torch.zeros(slots.numel() + 1, dtype=torch.int64, device=device)
            torch.cumsum(slots, dim=0, out=cu_seqlens_padded[1:])
            # Only the pack's tail is padding: absorb it into the last sequence so the two
            # arrays agree and TE can skip its pad_between_seqs path.
            if cu_seqlens.numel() > 1 and torch.equal(cu_seqlens[:-1], cu_seqlens_padded[:-1]):
                if int(cu_seqlens[-1]) < total_tokens:
                    cu_seqlens[-1] = total_tokens
                    cu_seqlens_padded = cu_seqlens.clone()
        cu_seqlens = cu_seqlens.to(torch.int32)
        result["cu_seqlens"] = cu_seqlens
        result["padding_mask"] = _layout_padding_mask(total_tokens, reals, reals if slots is None else slots)
        if cu_seqlens_padded is not None:
            cu_seqlens_padded = cu_seqlens_padded.to(torch.int32)
            if not torch.equal(cu_seqlens_padded, cu_seqlens):
                result["cu_seqlens_padded"] = cu_seqlens_padded
        if cu_seqlens.numel() > 1:
            result["max_seqlen"] = (cu_seqlens[1:] - cu_seqlens[:-1]).max().to(torch.int32)

    for key, value in batch.items():
        if key not in result and key not in ("seq_lens", "seq_lens_padded"):
            result[key] = value
    return result


def split_batch_into_thd_chunks(
    batch: dict[str, Any],
    num_chunks: int,
    seq_lens_padding_value: int = -1000,
    padding_token_id: int = 0,
) -> dict[str, Any]:
    """Split a BSHD batch along its batch axis into ``num_chunks`` THD chunks, stacked.

    Each chunk goes through :func:`process_input_for_thd`; token tensors are stacked to
    ``[num_chunks, tokens_per_chunk, ...]``, ``cu_seqlens`` to ``[num_chunks, max_seqs + 1]``
    right-padded with ``seq_lens_padding_value``, ``max_seqlen`` to ``[num_chunks]``.
    ``cu_seqlens_padded`` is emitted when any chunk emits it (other chunks contribute their
    ``cu_seqlens``). ``num_chunks <= 1`` returns :func:`process_input_for_thd` unchanged.

    Raises:
        ValueError: ``num_chunks`` does not divide the batch size.
    """
    if num_chunks <= 1:
        return process_input_for_thd(batch, seq_lens_padding_value, padding_token_id)
    batch_size = int(batch["input_ids"].shape[0])
    if batch_size % num_chunks != 0:
        raise ValueError(f"batch size {batch_size} is not divisible by num_chunks={num_chunks}")
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

    result: dict[str, Any] = {}
    any_padded = any("cu_seqlens_padded" in chunk for chunk in chunks)
    for key in chunks[0]:
        if key == "cu_seqlens_padded":
            continue
        if not all(key in chunk for chunk in chunks):
            raise ValueError(f"THD chunks disagree on field {key!r}")
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
