"""Deterministic test data and test-only schedulers for the wrapper tests.

Every token says where it comes from: token ``j`` of sequence ``s`` of item ``i`` on DP rank
``r`` is ``r*10**7 + i*10**4 + s*10**3 + j`` (sequences are shorter than 1000), so a test
can find every sequence's origin from its first token and rebuild the expected sample.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from harness import TASK_CACHE

from seqpack.schedulers import EmptyScheduler, GridScheduler
from seqpack.thd import IGNORE_INDEX, padded_lengths
from seqpack.topology import Topology

EMPTY_EVERY = 13  # item i with i % 13 == 7 is a zero-length sample
PACKED_EVERY = 5  # item i with i % 5 == 2 is pre-packed (carries cu_seqlens)


def sequence_lengths(seed: int, rank: int, index: int, max_len: int = 40) -> list[int]:
    """Real lengths of the sequences of item ``index`` of DP rank ``rank``."""
    if index % EMPTY_EVERY == 7:
        return [0]
    rng = np.random.default_rng([seed, rank, index])
    if index % PACKED_EVERY == 2:
        return [int(v) for v in rng.integers(1, max_len // 2, size=int(rng.integers(2, 4)))]
    return [int(rng.integers(1, max_len + 1))]


def make_sequence(rank: int, index: int, sub: int, length: int, loss_mask: bool) -> dict[str, torch.Tensor]:
    base = rank * 10**7 + index * 10**4 + sub * 10**3
    seq = {"input_ids": torch.arange(base, base + length, dtype=torch.int64)}
    if loss_mask:
        seq["loss_mask"] = (torch.arange(length) % 3 != 0).to(torch.float32)
    return seq


def make_item(seed: int, rank: int, index: int, *, loss_mask: bool = True, max_len: int = 40) -> dict:
    lengths = sequence_lengths(seed, rank, index, max_len)
    seqs = [make_sequence(rank, index, s, n, loss_mask) for s, n in enumerate(lengths)]
    if index % PACKED_EVERY != 2 or index % EMPTY_EVERY == 7:
        return seqs[0]
    # Pre-packed: sequences back to back, each padded to a multiple of 4 (cu_seqlens_padded).
    padded = padded_lengths(lengths, 4)
    cu = np.r_[0, np.cumsum(lengths)]
    cu_padded = np.r_[0, np.cumsum(padded)]
    item = {key: torch.zeros(int(cu_padded[-1]), dtype=seqs[0][key].dtype) for key in seqs[0]}
    for s, seq in enumerate(seqs):
        for key, value in seq.items():
            item[key][cu_padded[s] : cu_padded[s] + lengths[s]] = value
    item["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32))
    item["cu_seqlens_padded"] = torch.from_numpy(cu_padded.astype(np.int32))
    return item


def items(seed: int, rank: int, count: int, *, loss_mask: bool = True, max_len: int = 40, bad: dict | None = None):
    """The data iterator of DP rank ``rank``; ``bad={"index": i, "kind": ...}`` spoils item i."""
    for index in range(count):
        item = make_item(seed, rank, index, loss_mask=loss_mask, max_len=max_len)
        if bad is not None and bad["index"] == index:
            item = spoil(item, bad["kind"], bad.get("length", 0))
        yield item


def spoil(item: dict, kind: str, length: int = 0) -> dict:
    item = {k: v for k, v in item.items() if k not in ("cu_seqlens", "cu_seqlens_padded")}
    if kind == "missing_input_ids":
        item["tokens"] = item.pop("input_ids")
    elif kind == "unequal_lengths":
        item["labels"] = (
            item["input_ids"][:-1].clone() if item["input_ids"].numel() > 1 else torch.zeros(2, dtype=torch.int64)
        )
    elif kind == "oversize":
        item["input_ids"] = torch.arange(length, dtype=torch.int64)
        item.pop("loss_mask", None)
        item["loss_mask"] = torch.ones(length)
    elif kind == "not_a_mapping":
        return [item["input_ids"]]
    else:
        raise ValueError(kind)
    return item


def identity(first_token: int) -> tuple[int, int, int]:
    """(DP rank, item index, sequence index) of the sequence starting with ``first_token``."""
    rank, rest = divmod(int(first_token), 10**7)
    index, rest = divmod(rest, 10**4)
    return rank, index, rest // 10**3


def expected_sequences(seed: int, rank: int, count: int, max_len: int = 40) -> dict[tuple[int, int, int], int]:
    """Every non-empty sequence among the first ``count`` items of a rank, with its length."""
    out = {}
    for index in range(count):
        for sub, n in enumerate(sequence_lengths(seed, rank, index, max_len)):
            if n:
                out[(rank, index, sub)] = n
    return out


class ScatterScheduler(GridScheduler):
    """Test-only: sends sample ``k`` (in active order) to replica ``(3k + 1) % dp`` (so most
    samples move), packs next-fit, and with ``defer_longest`` holds the longest sample of
    each step for the next one."""

    name = "test_scatter"

    def __init__(self, defer_longest: bool = False):
        self.defer_longest = defer_longest

    def _plan(self, request):
        ids = np.arange(request.num_sequences, dtype=np.int64)
        deferred = np.zeros(0, dtype=np.int64)
        if self.defer_longest and ids.size > 1:
            j = int(np.argmax(request.lengths))
            deferred = ids[j : j + 1]
            ids = np.delete(ids, j)
        # "empty" packs every sample on the replica it sits on: tell it they sit elsewhere.
        replica = (np.arange(ids.size, dtype=np.int64) * 3 + 1) % request.dp_size
        rounds, _ = EmptyScheduler()._plan(request.subset(ids, origin=replica))
        return [[ids[cell] for cell in row] for row in rounds], deferred


class BrokenScheduler(GridScheduler):
    """Test-only: a scheduler with a bug (raises something other than ValueError)."""

    name = "test_broken"

    def _plan(self, request):
        raise RuntimeError("index 7 out of bounds in a scheduler bug")


# --- checking what arrived ------------------------------------------------------------------

FIELDS = (
    "input_ids",
    "labels",
    "loss_mask",
    "position_ids",
    "seq_idx",
    "padding_mask",
    "cu_seqlens",
    "cu_seqlens_padded",
    "sample_ids",
)
TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask")


def batch_arrays(batch) -> dict:
    """A PackedBatch as plain numpy arrays (picklable, cheap to send back from a worker)."""
    out = {name: (None if getattr(batch, name) is None else getattr(batch, name).numpy().copy()) for name in FIELDS}
    out.update(
        max_seqlen=batch.max_seqlen,
        cp_size=batch.cp_size,
        cp_rank=batch.cp_rank,
        cp_layout=str(batch.cp_layout),
        num_loss_tokens=batch.num_loss_tokens,
        shared_cu=batch.cu_seqlens is batch.cu_seqlens_padded,
        dtypes={name: str(getattr(batch, name).dtype) for name in FIELDS if getattr(batch, name) is not None},
    )
    return out


def check_full_batch(arrays: dict, seed: int, pad_multiple: int, *, loss_mask: bool = True, max_len: int = 40):
    """Check an unsharded microbatch against a fresh pack of the samples its tokens name.

    Returns ``[(identity, real length), ...]`` of its sequences (empty for a filler).
    """
    from seqpack.thd import pack_sequences, padding_only_batch

    if arrays["sample_ids"].tolist() == [-1]:
        expected = padding_only_batch(pad_multiple)
        seen = []
    else:
        cu, cu_padded = arrays["cu_seqlens"], arrays["cu_seqlens_padded"]
        seqs, seen = [], []
        for k in range(cu.shape[0] - 1):
            who = identity(arrays["input_ids"][cu_padded[k]])
            n = int(cu[k + 1] - cu[k])
            assert n == sequence_lengths(seed, who[0], who[1], max_len)[who[2]], (who, n)
            seqs.append(make_sequence(*who, n, loss_mask))
            seen.append((who, n))
        expected = pack_sequences(seqs, pad_multiple=pad_multiple, sample_ids=arrays["sample_ids"])
    for name in FIELDS:
        assert np.array_equal(getattr(expected, name).numpy(), arrays[name]), name
    assert expected.max_seqlen == arrays["max_seqlen"]
    return seen


def wait_until(condition, timeout: float = 10.0) -> bool:
    """Poll ``condition()`` every 5 ms until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


_TOPOLOGIES = TASK_CACHE  # cleared with the groups it holds after every pool task


def mesh_topology(layout) -> Topology:
    """The Topology of a CPU device mesh ``layout`` (``((name, size), ...)``). Meshes (and
    their process groups) are built once per pool task and layout, in the same order on
    every rank."""
    if layout not in _TOPOLOGIES:
        from torch.distributed.device_mesh import init_device_mesh

        names = tuple(name for name, _ in layout)
        shape = tuple(size for _, size in layout)
        _TOPOLOGIES[layout] = Topology.from_device_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
    return _TOPOLOGIES[layout]


def repeating_items(count: int, answer: int, repeats: int, *, next_token: bool, seed: int = 0):
    """Samples whose answers of ``answer`` tokens hold ``repeats`` tokens equal to the next one
    (tokens otherwise distinct), -100 on a prompt; labels Hugging Face-style (a copy of
    input_ids) or next-token targets. Per sample ``answer - repeats`` supervised tokens tell
    the alignments apart; the repeats fit either."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        prompt = int(rng.integers(1, 12))
        ids = torch.from_numpy(rng.permutation(np.arange(1, 200))[: prompt + answer])
        for k in range(repeats):
            ids[prompt + 3 * k + 1] = ids[prompt + 3 * k]
        labels = torch.full_like(ids, IGNORE_INDEX)
        if next_token:
            labels[prompt - 1 : -1] = ids[prompt:]
        else:
            labels[prompt:] = ids[prompt:]
        yield {"input_ids": ids, "labels": labels}
