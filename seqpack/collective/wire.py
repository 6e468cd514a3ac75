"""The wire format of one step, as pure functions: :func:`encode_step` / :func:`decode_step`.

A step travels over TP (tokens and layout) or PP (layout only) as one of three messages,
:class:`StepOk`, :class:`StepEnd` or :class:`StepError`. Everything that describes it is
int64; floats only carry float data (``loss_mask``). No sentinel values: every
variable-length field has its length in the header, and the header is declared once, here
(:data:`PREFIX_FIELDS`, :data:`STEP_FIELDS`, :data:`MICROBATCH_FIELDS`, as numpy structured
dtypes); the tables in docs/wrapper.md are rendered from them (a test keeps them equal).

A message is up to four buffers, broadcast in this order: ``prefix`` (int64, fixed size, so
a receiver knows what to allocate); ``ints`` (int64: the step header, one microbatch row per
microbatch, then the plan's ``to_arrays()``, ``empty_at``, each microbatch's
``cu_seqlens*`` and ``sample_ids``, and with flag 1 the tokens of this rank's shards);
``floats`` (float32 ``loss_mask``, flag 1 only); ``message`` (the UTF-8 error text). docs/wrapper.md
lays it out in full. ``seq_idx``, ``padding_mask`` and (unless samples carry their own)
``position_ids`` are rebuilt by receivers from ``cu_seqlens*``.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum, IntFlag

import numpy as np
import torch

from seqpack.collective.agree import Status
from seqpack.collective.messages import StepEnd, StepError, StepMessage, StepOk
from seqpack.collective.wire_minibatches import decode_minibatches, minibatch_rows
from seqpack.collective.wire_plan import decode_plan, plan_header, plan_payload
from seqpack.errors import ConfigError, WireError
from seqpack.options import CpLayout
from seqpack.thd import batch_from_layout

__all__ = [
    "FORMAT_VERSION",
    "MICROBATCH_FIELDS",
    "PREFIX_FIELDS",
    "STEP_FIELDS",
    "Flag",
    "Kind",
    "StepEnd",
    "StepError",
    "StepMessage",
    "StepOk",
    "WireBuffers",
    "WirePrefix",
    "decode_prefix",
    "decode_step",
    "encode_step",
]

FORMAT_VERSION = 9  # every rank of a job speaks the same one; a peer of another version is refused by name


class Kind(IntEnum):
    BATCH = 1  # TP broadcast: tokens and layout
    LAYOUT = 2  # PP broadcast: layout only


class Flag(IntFlag):
    TOKENS = 1
    POSITION_IDS = 2
    LOSS_TOKENS = 4
    GROUP_STARTS = 8  # each microbatch's CP group start travels (dynamic CP: groups change per round)


# The header, declared once: (field, meaning). Each becomes one int64 word.
PREFIX_FIELDS: tuple[tuple[str, str], ...] = (
    ("version", f"format version ({FORMAT_VERSION})"),
    ("kind", "1 batch (TP: tokens and layout), 2 layout (PP: layout only)"),
    ("status", "0 ok, 1 end of data, 2 error"),
    ("header_len", "int64 words of the whole header, prefix included"),
    ("int_words", "int64 payload words after the header"),
    ("float_words", "float32 payload words"),
    ("message_bytes", "bytes of the UTF-8 error text (status 2 only)"),
    ("num_microbatches", "microbatches M"),
)
STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("step", "step index"),
    ("flags", "1 tokens, 2 position_ids, 4 loss-token counts, 8 group starts"),
    ("fingerprint", "schedule fingerprint (63 bits)"),
    ("empty_samples", "zero-length samples dropped this step"),
    ("dropped_at_end", "sequences dropped with a partial last step"),
    ("error_rank", "global rank that failed (status 2), else -1"),
    ("dp_size", "replicas of the schedule"),
    ("schedule_cp_size", "cp_size of the schedule"),
    ("cp_layout", "how the shards are cut: 0 dualchunk, 1 contiguous (CpLayout order)"),
    ("max_tokens_per_rank", "capacity per rank"),
    ("pad_multiple", "padding multiple"),
    ("num_sequences", "sequences N of the step"),
    ("num_assigned", "assigned ids A"),
    ("num_deferred", "deferred ids D"),
    ("num_dropped", "dropped ids R"),
    ("num_truncated", "truncated ids U"),
    ("num_groups", "CP groups G of the plan (a static plan: M x dp)"),
    ("group_sizes", "the plan's groups: 0 static, 1 pow2, 2 any (GroupSizes order)"),
    ("num_loss_tokens", "supervised tokens of the whole global step (flag 4; else 0)"),
    ("num_empty_at", "zero-length sequences E this DP rank read (their pool indices follow the plan)"),
)
MICROBATCH_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_tokens", "padded tokens T_m of the whole microbatch (all CP ranks)"),
    ("num_sequences", "sequences n_m"),
    ("max_seqlen", "largest padded sequence"),
    ("num_loss_tokens", "supervised tokens of the whole microbatch (flag 4; else 0)"),
    ("cp_size", "CP size of the shard (under dynamic CP its group's size)"),
    ("cp_rank", "CP rank of the shard"),
    ("group_start", "dp x cp plane rank its CP group starts at (flag 8; else 0)"),
    ("minibatch", "mini-batch j of the microbatch (0, 1, ... in order; all 0 with one mini-batch)"),
    ("minibatch_loss_tokens", "supervised tokens of mini-batch j, every replica (flag 4; else 0)"),
)


def _dtype(fields: tuple[tuple[str, str], ...]) -> np.dtype:
    return np.dtype([(name, "<i8") for name, _ in fields])


PREFIX = _dtype(PREFIX_FIELDS)
STEP = _dtype(STEP_FIELDS)
MICROBATCH = _dtype(MICROBATCH_FIELDS)
PREFIX_WORDS = len(PREFIX_FIELDS)
STEP_WORDS = len(STEP_FIELDS)
MB_WORDS = len(MICROBATCH_FIELDS)


@dataclasses.dataclass
class WireBuffers:
    """The buffers of one message: ``prefix``, ``ints`` (header rest and payload) int64,
    ``floats`` float32, ``message`` uint8."""

    prefix: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    message: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.prefix, self.ints, self.floats, self.message))


def _words(record: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(record.view(np.int64).copy())


def _prefix(
    kind: Kind,
    status: Status,
    header_words: int,
    int_words: int,
    float_words: int,
    message_bytes: int,
    num_microbatches: int,
) -> torch.Tensor:
    p = np.zeros(1, dtype=PREFIX)
    p["version"], p["kind"], p["status"] = FORMAT_VERSION, kind, status
    p["header_len"] = PREFIX_WORDS + header_words
    p["int_words"], p["float_words"], p["message_bytes"] = int_words, float_words, message_bytes
    p["num_microbatches"] = num_microbatches
    return _words(p)


def encode_step(msg: StepMessage, *, kind: int = Kind.BATCH) -> WireBuffers:
    """Serialise ``msg`` (pure). ``kind=Kind.LAYOUT`` leaves the tokens out.

    Raises:
        ConfigError: Unknown kind or message type.
        WireError: A batch without tokens for ``Kind.BATCH``, a microbatch count that does not
            match the schedule, or microbatches sharded for different CP ranks.
    """
    if kind not in (Kind.BATCH, Kind.LAYOUT):
        raise ConfigError(f"kind must be Kind.BATCH (1) or Kind.LAYOUT (2), got {kind!r}")
    kind = Kind(kind)
    step = np.zeros(1, dtype=STEP)
    step["step"] = msg.step
    step["error_rank"] = -1
    if isinstance(msg, StepEnd):
        step["dropped_at_end"], step["empty_samples"] = msg.dropped_at_end, msg.empty_samples
        empty = torch.zeros(0, dtype=torch.uint8)
        return WireBuffers(
            _prefix(kind, Status.END, STEP_WORDS, 0, 0, 0, 0), _words(step), torch.zeros(0, dtype=torch.float32), empty
        )
    if isinstance(msg, StepError):
        text = np.frombuffer(msg.message.encode("utf-8"), dtype=np.uint8)
        step["error_rank"] = -1 if msg.rank is None else msg.rank
        return WireBuffers(
            _prefix(kind, Status.ERROR, STEP_WORDS, 0, 0, text.size, 0),
            _words(step),
            torch.zeros(0, dtype=torch.float32),
            torch.from_numpy(text.copy()),
        )
    if not isinstance(msg, StepOk):
        raise ConfigError(f"msg must be a StepOk, StepEnd or StepError, got {type(msg).__name__}")
    sched, batches = msg.schedule, msg.microbatches
    if sched is None:
        raise WireError("a message with status ok needs its schedule")
    if len(batches) != sched.num_microbatches:
        raise WireError(f"{len(batches)} microbatches for a schedule of {sched.num_microbatches}")
    starts_given = msg.group_starts is not None
    if starts_given and len(msg.group_starts or ()) != len(batches):
        raise WireError(
            f"{len(msg.group_starts or ())} group starts (StepOk.group_starts) for {len(batches)} microbatches"
        )
    tokens = kind == Kind.BATCH
    _check_batches(msg, tokens, same_shard=not starts_given)
    counted = msg.num_loss_tokens is not None
    flags = [(Flag.TOKENS, tokens), (Flag.POSITION_IDS, msg.position_ids), (Flag.LOSS_TOKENS, counted)]
    flags.append((Flag.GROUP_STARTS, starts_given))
    step["flags"] = sum(int(flag) for flag, on in flags if on)
    step["num_loss_tokens"] = msg.num_loss_tokens if counted else 0
    step["fingerprint"] = sched.fingerprint()
    step["empty_samples"] = msg.empty_samples
    step["num_empty_at"] = len(msg.empty_at)
    for field, value in plan_header(sched).items():
        step[field] = value
    cp_layout = batches[0].cp_layout if batches else CpLayout.DUALCHUNK
    step["cp_layout"] = list(CpLayout).index(CpLayout(cp_layout))
    starts = msg.group_starts if msg.group_starts is not None else (0,) * len(batches)
    which, mb_counts = minibatch_rows(msg)
    per_mb = np.zeros(len(batches), dtype=MICROBATCH)
    for m, b in enumerate(batches):
        count = b.num_loss_tokens if counted else 0
        layout = (int(b.cu_seqlens_padded[-1]), b.num_sequences, b.max_seqlen, count, b.cp_size, b.cp_rank)
        per_mb[m] = (*layout, starts[m], which[m], mb_counts[m])
    header = [_words(step), _words(per_mb)]
    payload = [torch.from_numpy(array) for array in plan_payload(sched)]
    payload.append(torch.tensor(msg.empty_at, dtype=torch.int64).reshape(-1))
    for b in batches:
        payload += [b.cu_seqlens.to(torch.int64), b.cu_seqlens_padded.to(torch.int64), b.sample_ids.to(torch.int64)]
    if tokens:
        payload += [b.input_ids.to(torch.int64) for b in batches if b.input_ids is not None]
        payload += [b.labels.to(torch.int64) for b in batches if b.labels is not None]
    if msg.position_ids:
        payload += [b.position_ids.to(torch.int64) for b in batches]
    header_words = STEP_WORDS + MB_WORDS * len(batches)
    ints = torch.cat([p.reshape(-1).cpu() for p in header + payload])
    floats = torch.zeros(0, dtype=torch.float32)
    if tokens and batches:
        floats = torch.cat([b.loss_mask.to(torch.float32).cpu() for b in batches if b.loss_mask is not None])
    prefix = _prefix(kind, Status.OK, header_words, ints.shape[0] - header_words, floats.shape[0], 0, len(batches))
    return WireBuffers(prefix, ints, floats, torch.zeros(0, dtype=torch.uint8))


def _check_batches(msg: StepOk, tokens: bool, *, same_shard: bool) -> None:
    """Every microbatch cut in one layout (and, ``same_shard``, as one CP shard), with
    tokens for a batch message and counts for a counted step."""
    batches = msg.microbatches
    if not batches:
        return
    first = batches[0]
    for m, b in enumerate(batches):
        if b.cp_layout != first.cp_layout or (same_shard and (b.cp_size, b.cp_rank) != (first.cp_size, first.cp_rank)):
            raise WireError(
                f"microbatch {m} is shard {b.cp_rank}/{b.cp_size} ({b.cp_layout}), microbatch 0 is "
                f"{first.cp_rank}/{first.cp_size} ({first.cp_layout})"
            )
        if tokens and b.input_ids is None:
            raise WireError(f"microbatch {m} has no tokens; a Kind.BATCH message needs them")
        if msg.num_loss_tokens is not None and b.num_loss_tokens is None:
            raise WireError(f"microbatch {m} has no num_loss_tokens but the step has one")


@dataclasses.dataclass(frozen=True)
class WirePrefix:
    """The decoded fixed prefix: what to allocate for the rest of the message."""

    kind: Kind
    status: Status
    header_len: int
    int_words: int
    float_words: int
    message_bytes: int
    num_microbatches: int

    @property
    def ints_len(self) -> int:
        """Words of the ``ints`` buffer: header after the prefix, then the int64 payload."""
        return self.header_len - PREFIX_WORDS + self.int_words


def decode_prefix(prefix: torch.Tensor | np.ndarray) -> WirePrefix:
    """Check and decode the fixed prefix.

    Raises:
        WireError: Wrong size, another format version, unknown kind or status, or negative
            lengths.
    """
    words = np.asarray(prefix.cpu() if isinstance(prefix, torch.Tensor) else prefix, dtype=np.int64).reshape(-1)
    if words.shape[0] != PREFIX_WORDS:
        raise WireError(f"wire prefix has {words.shape[0]} words, expected {PREFIX_WORDS}")
    p = words.view(PREFIX)[0]
    if p["version"] != FORMAT_VERSION:
        raise WireError(
            f"wire format version {int(p['version'])} received, this seqpack speaks version {FORMAT_VERSION}: "
            "every rank must run the same seqpack"
        )
    if p["kind"] not in (Kind.BATCH, Kind.LAYOUT):
        raise WireError(f"unknown message kind {int(p['kind'])} in wire prefix")
    if p["status"] not in tuple(Status):
        raise WireError(f"unknown status {int(p['status'])} in wire prefix")
    sizes = [int(p[f]) for f in ("int_words", "float_words", "message_bytes", "num_microbatches")]
    if p["header_len"] < PREFIX_WORDS + STEP_WORDS or min(sizes) < 0:
        raise WireError(f"corrupt wire prefix {words.tolist()}")
    m = int(p["num_microbatches"])
    expected = PREFIX_WORDS + STEP_WORDS + MB_WORDS * m
    if p["header_len"] != expected:
        raise WireError(
            f"wire header_len={int(p['header_len'])} but {m} microbatches need "
            f"{PREFIX_WORDS} + {STEP_WORDS} + {MB_WORDS}*{m} = {expected}"
        )
    return WirePrefix(Kind(int(p["kind"])), Status(int(p["status"])), int(p["header_len"]), *sizes)


class _Cursor:
    """Consecutive slices of a 1-D buffer with bound checks."""

    def __init__(self, buf: torch.Tensor, what: str):
        self.buf, self.pos, self.what = buf, 0, what

    def take(self, n: int, field: str) -> torch.Tensor:
        if n < 0 or self.pos + n > self.buf.shape[0]:
            raise WireError(
                f"truncated {self.what} buffer: {field} needs words {self.pos}..{self.pos + n} "
                f"but the buffer has {self.buf.shape[0]}"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def decode_step(buffers: WireBuffers) -> StepMessage:
    """Rebuild a message from its buffers (pure; the four buffers as sent).

    Raises:
        WireError: Version mismatch, truncated or oversized buffers, inconsistent counts,
            or a schedule whose recomputed fingerprint differs from the header's.
    """
    p = decode_prefix(buffers.prefix)
    ints = buffers.ints.reshape(-1).to(torch.int64).cpu()
    floats = buffers.floats.reshape(-1).cpu()
    _check_sizes(p, ints, floats, buffers.message)
    cur = _Cursor(ints, "int64")
    step = cur.take(STEP_WORDS, "step header").numpy().view(STEP)[0]
    if p.status == Status.END:
        return StepEnd(int(step["step"]), int(step["dropped_at_end"]), int(step["empty_samples"]))
    if p.status == Status.ERROR:
        text = bytes(buffers.message.cpu().numpy().astype(np.uint8)).decode("utf-8", errors="replace")
        rank = int(step["error_rank"])
        return StepError(int(step["step"]), text, None if rank < 0 else rank)
    flags = Flag(int(step["flags"]))
    if Flag.TOKENS in flags and p.kind != Kind.BATCH:
        raise WireError("a layout message must not carry tokens")
    per_mb = cur.take(MB_WORDS * p.num_microbatches, "microbatch header").numpy().view(MICROBATCH)
    schedule = decode_plan(lambda n, name: cur.take(n, name).numpy(), step, p.num_microbatches)
    empty_at = _decode_empty_at(cur, step)
    if not 0 <= int(step["cp_layout"]) < len(CpLayout):
        raise WireError(f"cp_layout code {int(step['cp_layout'])} is not one of 0..{len(CpLayout) - 1}")
    cp_layout = list(CpLayout)[int(step["cp_layout"])]
    layouts = _decode_layouts(cur, per_mb)
    token_fields = _decode_tokens(cur, floats, flags, [int(mb["total_tokens"]) // int(mb["cp_size"]) for mb in per_mb])
    if cur.pos != ints.shape[0]:
        raise WireError(f"int64 buffer has {ints.shape[0] - cur.pos} words past the declared fields")
    counted = Flag.LOSS_TOKENS in flags
    batches = []
    for m, (cu, cu_padded, ids) in enumerate(layouts):
        fields = {name: values[m].clone() for name, values in token_fields.items()}
        max_seqlen, cp_size, cp_rank = (int(per_mb[m][name]) for name in ("max_seqlen", "cp_size", "cp_rank"))
        batch = batch_from_layout(
            cu, cu_padded, max_seqlen, ids.clone(), cp_size, cp_rank, cp_layout=cp_layout, **fields
        )
        if counted:
            batch = dataclasses.replace(batch, num_loss_tokens=_count(per_mb[m]["num_loss_tokens"], m))
        batches.append(batch)
    return StepOk(
        step=int(step["step"]),
        schedule=schedule,
        microbatches=batches,
        empty_samples=int(step["empty_samples"]),
        position_ids=Flag.POSITION_IDS in flags,
        num_loss_tokens=_count(step["num_loss_tokens"], None) if counted else None,
        group_starts=tuple(int(mb["group_start"]) for mb in per_mb) if Flag.GROUP_STARTS in flags else None,
        empty_at=empty_at,
        **decode_minibatches(per_mb, counted),
    )


def _decode_empty_at(cur: _Cursor, step: np.void) -> tuple[int, ...]:
    """Pool indices of the zero-length sequences: ascending, each at most the step's sequences."""
    count = int(step["num_empty_at"])
    if count < 0:
        raise WireError(f"num_empty_at {count} in the step header")
    at = cur.take(count, "empty_at").numpy()
    total = int(step["num_sequences"])
    if at.size and (int(at[0]) < 0 or int(at[-1]) > total or bool(np.any(np.diff(at) < 0))):
        raise WireError(f"empty_at {at.tolist()} is not ascending within 0..{total} (the step's sequences)")
    return tuple(int(a) for a in at.tolist())


def _count(value: np.int64, m: int | None) -> int:
    if value < 0:
        raise WireError(f"num_loss_tokens {int(value)} of {'the step' if m is None else f'microbatch {m}'}: corrupted")
    return int(value)


def _check_sizes(p: WirePrefix, ints: torch.Tensor, floats: torch.Tensor, message: torch.Tensor) -> None:
    for name, got, want in (
        ("int64", ints.shape[0], p.ints_len),
        ("float32", floats.shape[0], p.float_words),
        ("message", message.numel(), p.message_bytes),
    ):
        if got != want:
            raise WireError(
                f"{'truncated' if got < want else 'oversized'} {name} buffer: the wire prefix declares {want} words, "
                f"got {got}"
            )


def _decode_layouts(cur: _Cursor, per_mb: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each microbatch's ``cu_seqlens``, ``cu_seqlens_padded`` and ``sample_ids``."""
    layouts = []
    for m, header in enumerate(per_mb):
        total, num_seqs, cp_size = (int(header[name]) for name in ("total_tokens", "num_sequences", "cp_size"))
        if cp_size < 1:
            raise WireError(f"microbatch {m}: cp_size {cp_size} in the header")
        cu = cur.take(num_seqs + 1, f"cu_seqlens of microbatch {m}")
        cu_padded = cur.take(num_seqs + 1, f"cu_seqlens_padded of microbatch {m}")
        ids = cur.take(num_seqs, f"sample_ids of microbatch {m}")
        if int(cu_padded[-1]) != total or total % cp_size:
            raise WireError(f"microbatch {m}: cu_seqlens_padded ends at {int(cu_padded[-1])}, header says {total}")
        layouts.append((cu, cu_padded, ids))
    return layouts


def _decode_tokens(cur: _Cursor, floats: torch.Tensor, flags: Flag, local: list[int]) -> dict[str, list[torch.Tensor]]:
    """This CP rank's token fields of every microbatch (``local`` tokens each)."""
    token_fields: dict[str, list[torch.Tensor]] = {}
    if Flag.TOKENS in flags:
        token_fields["input_ids"] = list(torch.split(cur.take(sum(local), "input_ids"), local))
        token_fields["labels"] = list(torch.split(cur.take(sum(local), "labels"), local))
        token_fields["loss_mask"] = list(torch.split(floats, local)) if local else []
    if Flag.POSITION_IDS in flags:
        token_fields["position_ids"] = list(torch.split(cur.take(sum(local), "position_ids"), local))
    return token_fields
