"""verl drop-ins: :func:`rearrange_micro_batches`, :func:`get_seqlen_balanced_partitions` and
:func:`get_group_balanced_partitions` with the signatures and return values of verl 0.9.1's
``verl/utils/seqlen_balancing.py``, planned by seqpack's ``balanced`` scheduler on verl's
workload, never over ``max_token_len``. What is the same and what differs on purpose (real
lengths against the cap, a forced group weighed as one sequence, errors that name the value):
docs/rl.md, "verl drop-in".

``batch`` is a TensorDict or any mapping whose values share a first (batch) dimension
(tensors, nested tensors, numpy arrays or lists) and that holds ``attention_mask`` (``[B, S]``
of 0 and 1) or nested ``input_ids`` (verl's no-padding form); TensorDict is never imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqpack.collective.groups import collective, comm_device
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ScheduleError, SeqpackError, SeqpackTypeError
from seqpack.interop.verl_batch import check_rows, row_lengths, select_rows
from seqpack.schedulers import Schedule, get_scheduler
from seqpack.validation import MAX_TOKENS, check_bool, check_optional_int, check_positive_int

__all__ = [
    "VERL_WORKLOAD",
    "get_group_balanced_partitions",
    "get_seqlen_balanced_partitions",
    "rearrange_micro_batches",
]

VERL_WORKLOAD = CostModel(linear=24576.0, quadratic=1.0)
"""verl's ``calculate_workload``: ``24576 * s + s**2`` (dense 7B FLOPs up to a factor)."""


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split indices of ``seqlen_list`` into ``k_partitions`` lists of balanced sums.

    Args:
        seqlen_list: Non-negative integers (lengths or workloads).
        k_partitions: Partitions to make.
        equal_size: Every partition gets ``len(seqlen_list) / k_partitions`` items.

    Returns:
        ``k_partitions`` non-empty lists of indices, ascending inside each list; every
        index in exactly one.

    Raises:
        ConfigError: Fewer items than partitions, or ``equal_size`` with a count that
            ``k_partitions`` does not divide.
        SeqpackTypeError: Values that are not non-negative integers.
    """
    values = _non_negative_ints("seqlen_list", seqlen_list)
    k = check_positive_int("k_partitions", k_partitions)
    equal_size = check_bool("equal_size", equal_size)
    n = values.shape[0]
    if n < k:
        raise ConfigError(f"get_seqlen_balanced_partitions: {n} items cannot fill k_partitions={k} partitions")
    if equal_size and n % k:
        raise ConfigError(f"get_seqlen_balanced_partitions: equal_size needs k_partitions={k} to divide {n} items")
    return balanced_partitions(values, k, equal_size=equal_size)


def balanced_partitions(values: np.ndarray, k: int, *, equal_size: bool = False) -> list[list[int]]:
    """Partitions of ``values`` (int64, ``>= 0``, at least ``k`` of them) with balanced sums,
    from the ``balanced`` scheduler (``k`` replicas of one microbatch each). With
    ``equal_size`` every value carries a bias larger than all values together, so the counts
    balance first (verl's bias); zeros go to the partitions with the fewest items.
    """
    n = values.shape[0]
    bias = int(values.sum()) + 1 if equal_size else 0
    planned = np.arange(n) if equal_size else np.flatnonzero(values > 0)
    weights = values[planned] + bias
    parts: list[list[int]] = [[] for _ in range(k)]
    if planned.size:
        total = int(weights.sum())
        if total > MAX_TOKENS:
            raise ConfigError(
                f"balanced partitions: the values sum to {total} (with the equal_size bias), more than 2**53; "
                "scale them down"
            )
        scheduler = get_scheduler("balanced", num_microbatches=1, locality=False)
        plan = scheduler.schedule(weights, dp_size=k, max_tokens_per_rank=total, cost=CostModel(1.0, 0.0))
        parts = [planned[ids].tolist() for ids in plan.assignment[0]]
    for i in np.flatnonzero(values == 0).tolist() if not equal_size else []:
        min(parts, key=len).append(i)
    return [sorted(p) for p in parts]


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Any], k_partitions: int
) -> list[list[int]]:
    """Split indices into ``k_partitions`` lists of balanced workload, samples of one uid in
    one list, every list holding the same number of uids (verl's contract; equal uids need
    not be contiguous).

    Returns:
        ``k_partitions`` lists of indices, ascending inside each list.

    Raises:
        ConfigError: Lists of different lengths, fewer uids than partitions, a uid count
            ``k_partitions`` does not divide, or a NaN uid (it equals nothing, itself included).
        SeqpackTypeError: An unhashable uid (a list, an array of several elements).
    """
    lengths = _non_negative_ints("seqlen_list", seqlen_list)
    uids = [_uid(i, u) for i, u in enumerate(uid_list)]
    k = check_positive_int("k_partitions", k_partitions)
    if len(uids) != lengths.shape[0]:
        raise ConfigError(f"seqlen_list holds {lengths.shape[0]} values but uid_list {len(uids)}")
    index: dict[Any, int] = {}
    group_of = np.array([index.setdefault(u, len(index)) for u in uids], dtype=np.int64)
    groups = len(index)
    if groups < k or groups % k:
        raise ConfigError(
            f"get_group_balanced_partitions: {groups} uid groups cannot be split equally into k_partitions={k}"
        )
    work = np.bincount(group_of, weights=VERL_WORKLOAD.cost(lengths), minlength=groups)
    parts = balanced_partitions(np.round(work).astype(np.int64), k, equal_size=True)
    member = [np.flatnonzero(np.isin(group_of, p)).tolist() for p in parts]
    return [sorted(m) for m in member]


def _uid(index: int, uid: Any) -> Any:
    """``uid`` as a dict key equal to every uid of the same value (a one-element tensor or
    array by its value)."""
    if isinstance(uid, torch.Tensor) and uid.numel() == 1:
        uid = uid.item()
    elif isinstance(uid, np.ndarray) and uid.size == 1:
        uid = uid.item()
    try:
        hash(uid)
    except TypeError:
        size = f" of {uid.size} elements" if isinstance(uid, np.ndarray) else ""
        size = f" of {uid.numel()} elements" if isinstance(uid, torch.Tensor) else size
        raise SeqpackTypeError(
            f"uid_list[{index}] is a {type(uid).__name__}{size}, which is not hashable: uids must be strings, "
            "numbers or one-element tensors (verl's 'uid' strings)"
        ) from None
    if isinstance(uid, (float, np.floating)) and np.isnan(uid):
        raise ConfigError(
            f"uid_list[{index}] is nan: a NaN uid equals no other uid (not even a NaN), so it groups nothing"
        )
    return uid


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[Any], list[list[int]]]:
    """Split ``batch`` into micro-batches of at most ``max_token_len`` real tokens each.

    Args:
        batch: TensorDict or mapping (module docstring).
        max_token_len: Real tokens one micro-batch may hold.
        dp_group: Process group over which ranks agree on the count (all-reduce max) when
            ``same_micro_num_in_dp``. ``None``, as in verl: no collective.
        num_batches_divided_by: The count is rounded up to a multiple of this (virtual
            pipeline stages).
        same_micro_num_in_dp: Agree on the count over ``dp_group``.
        min_num_micro_batch: At least this many micro-batches (pipeline stages).
        use_dynamic_bsz_balance: Light micro-batches at both ends, heavy ones in the middle;
            otherwise heaviest first.
        force_group_size: Rows ``[g * size, (g + 1) * size)`` stay in one micro-batch
            (verl's reward-model pairs); ``B`` must be a multiple of it.

    Returns:
        ``(micro_batches, indices)``: ``micro_batches[i]`` is ``batch`` at rows
        ``indices[i]`` (a TensorDict stays one; a mapping becomes a dict, a nested tensor
        stays one of the same layout), indices ascending inside each list and every row in
        exactly one list.

    Raises:
        ConfigError: A sequence (or forced group) over ``max_token_len``; ``B`` not a multiple
            of ``force_group_size``; a count (after ``min_num_micro_batch``, the agreement,
            rounding) above the groups of the batch (of the fewest any rank holds, with the
            agreement); a value of other rows (named by key); a mask with no real token, or
            with values other than 0 and 1. With the agreement, a rank's refusal is raised on
            every rank of ``dp_group`` (the others name it): none waits in a collective.
        SeqpackTypeError: ``batch`` not a mapping, a mask that is no ``[B, S]`` tensor, or a
            value that is no tensor, array or list.
    """
    agree = (
        check_bool("same_micro_num_in_dp", same_micro_num_in_dp)
        and dp_group is not None
        and dist.is_available()
        and dist.is_initialized()
    )
    try:  # this rank's checked arguments, group lengths and fewest fitting count
        cap = check_positive_int("max_token_len", max_token_len)
        least = check_optional_int("min_num_micro_batch", min_num_micro_batch, minimum=0) or 0
        multiple = check_optional_int("num_batches_divided_by", num_batches_divided_by, minimum=1) or 1
        order = "pipeline" if check_bool("use_dynamic_bsz_balance", use_dynamic_bsz_balance) else "heavy_first"
        size = check_positive_int("force_group_size", force_group_size)
        units = _unit_lengths(batch, cap, size)  # int64 [B / size], tokens per group of rows
        count, plan = fewest_microbatches(units, cap, least, order)
    except SeqpackError as error:
        if not agree:
            raise
        _agree(0, 0, dp_group, failure=error)  # raises on every rank
        raise AssertionError("unreachable") from error
    count, fewest_units = _agree(count, units.shape[0], dp_group) if agree else (count, len(units))
    count = -(-count // multiple) * multiple
    if count > fewest_units:
        raise _empty_micro_batch(count, fewest_units, size, agree, min_num_micro_batch, num_batches_divided_by)
    if plan is None or plan.num_microbatches != count:
        plan = _plan(units, cap, count, order)
        assert plan is not None  # more microbatches than the fewest that fit always fit
    indices = [
        [row for unit in part for row in range(unit * size, (unit + 1) * size)]
        for part in _with_empty_rows(plan, units)
    ]
    return [select_rows(batch, rows) for rows in indices], indices


def _empty_micro_batch(count: int, units: int, size: int, agree: bool, least: Any, multiple: Any) -> ConfigError:
    where = "the fewest any rank of dp_group holds" if agree else "this batch's"
    what = "rows" if size == 1 else f"groups of force_group_size={size} rows"
    return ConfigError(
        f"rearrange_micro_batches: {count} micro-batches (after min_num_micro_batch={least}, the DP agreement and "
        f"num_batches_divided_by={multiple}) for {units} {what} ({where}): a micro-batch would be empty"
    )


def _unit_lengths(batch: Any, cap: int, size: int) -> np.ndarray:
    """Real tokens of every group of ``size`` consecutive rows of ``batch`` (int64), each
    checked against ``cap``."""
    source, lengths = row_lengths(batch)
    n = lengths.shape[0]
    check_rows(batch, n, source)
    if n and not lengths.any():
        raise ConfigError(
            f"rearrange_micro_batches: {source} holds no real token in any of its {n} rows: nothing to train on "
            + (
                "(an attention_mask marks real tokens with 1)"
                if source == "attention_mask"
                else "(every sequence is empty)"
            )
        )
    if n % size:
        raise ConfigError(
            f"rearrange_micro_batches: batch size {n} must be divisible by force_group_size {size} "
            "(groups of consecutive rows stay together)"
        )
    units = lengths.reshape(-1, size).sum(axis=1)
    if units.size and int(units.max()) > cap:
        i = int(np.argmax(units))
        what = f"row {i}" if size == 1 else f"the group of rows {i * size}..{(i + 1) * size - 1}"
        raise ConfigError(
            f"rearrange_micro_batches: {what} holds {int(units[i])} tokens > max_token_len={cap}; "
            + ("raise max_token_len" if size == 1 else "a forced group is never split: raise max_token_len")
        )
    return units


def fewest_microbatches(
    lengths: np.ndarray, cap: int, least: int = 0, order: str = "pipeline"
) -> tuple[int, Schedule | None]:
    """The fewest micro-batches, at least ``least`` and at least verl's
    ``min(rows, ceil(tokens / cap))``, whose balanced plan keeps every one within ``cap``;
    with that plan (``None`` for a batch without tokens)."""
    n = lengths.shape[0]
    if not int(lengths.sum()):
        return max(least, 0), None
    count = max(least, min(n, -(-int(lengths.sum()) // cap)), 1)
    while True:  # ends: one sequence per microbatch always fits
        plan = _plan(lengths, cap, count, order)
        if plan is not None:
            return count, plan
        count += 1


def _plan(lengths: np.ndarray, cap: int, count: int, order: str) -> Schedule | None:
    """The balanced plan of the rows with tokens in exactly ``count`` microbatches of
    ``cap`` tokens, or ``None`` when they do not fit."""
    positive = lengths[lengths > 0]
    scheduler = get_scheduler("balanced", num_microbatches=count, order=order, locality=False)
    try:
        return scheduler.schedule(positive, dp_size=1, max_tokens_per_rank=cap, cost=VERL_WORKLOAD)
    except ScheduleError:
        return None


def _with_empty_rows(plan: Schedule, lengths: np.ndarray) -> list[list[int]]:
    """Row indices of each microbatch of ``plan`` (planned over the rows with tokens), rows
    without tokens added to the microbatches holding the fewest rows."""
    rows = np.flatnonzero(lengths > 0)
    parts = [rows[cells[0]].tolist() for cells in plan.assignment]
    for i in np.flatnonzero(lengths == 0).tolist():
        min(parts, key=len).append(i)
    return [sorted(p) for p in parts]


def _agree(count: int, units: int, group: Any, failure: SeqpackError | None = None) -> tuple[int, int]:
    """Over ``group``, in one all-reduce: the largest ``count`` and the fewest ``units``; a
    ``failure`` on any rank raised on every rank."""
    none = -(1 << 62)
    rank = dist.get_rank(group)
    values = torch.tensor([count, -units, -rank if failure is not None else none], dtype=torch.int64)
    values = values.to(comm_device(group))
    collective(dist.all_reduce, values, op=dist.ReduceOp.MAX, group=group)
    most, fewest, lowest = values.tolist()  # host sync: the count decides the split
    if failure is not None:
        raise failure
    if lowest != none:
        raise ConfigError(
            f"rearrange_micro_batches: dp rank {-int(lowest)} of dp_group refused its batch (its error names why); "
            "every rank of the group stops here"
        )
    return int(most), -int(fewest)


def _non_negative_ints(name: str, values: Any) -> np.ndarray:
    """``values`` as a 1-D int64 array of integers ``>= 0``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise SeqpackTypeError(f"{name} must be a 1-D sequence of integers, got {array.dtype} {array.shape}")
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
        i = int(np.argmin(array))
        raise SeqpackTypeError(f"{name}[{i}] is {int(array[i])}; values must be >= 0")
    return array
