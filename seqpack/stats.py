"""Step accounting: tokens, padding, balance and FLOPs of one schedule.

Counts are exact Python ints (``seqlen_sq_sum`` overflows float32's exact range at a single
4K sequence squared times 1000 sequences; Megatron's float32 broadcast rounds it). Costs are
float64, evaluated on padded lengths: pads run through the dense layers like real tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.thd import padded_lengths

if TYPE_CHECKING:
    from seqpack.cost import CostModel
    from seqpack.schedulers.base import Schedule

__all__ = ["StepStats", "microbatch_costs"]


def microbatch_costs(schedule: Schedule, cost: CostModel | None) -> np.ndarray:
    """Cost of every microbatch, float64 ``[num_microbatches, dp_size]``.

    Without a cost model the cost is padded tokens. Empty microbatches cost ``constant``
    (the rank still runs the step on a padding-only filler).
    """
    padded = padded_lengths(schedule.lengths, schedule.pad_multiple)
    per_seq = padded.astype(np.float64) if cost is None else cost.cost(padded)
    constant = 0.0 if cost is None else cost.constant
    out = np.zeros((schedule.num_microbatches, schedule.dp_size), dtype=np.float64)
    for m, row in enumerate(schedule.assignment):
        for d, ids in enumerate(row):
            out[m, d] = constant + per_seq[ids].sum()
    return out


@dataclasses.dataclass
class StepStats:
    """What one step trains on and how evenly it is spread.

    Attributes:
        num_sequences: Sequences trained this step (assigned, after drops).
        num_microbatches: Microbatches per replica.
        min_microbatches: Token lower bound ``ceil(padded tokens / (dp * capacity))``.
        real_tokens, padded_tokens: Tokens without and with padding (fillers included).
        seqlen_sum, seqlen_sq_sum: Exact sums of real lengths and squared real lengths.
        replica_cost: Total cost per DP replica (what DDP / ZeRO-1 / pipeline steps wait for).
        imbalance: ``max(replica_cost) / mean(replica_cost)``.
        round_imbalance: ``sum_m max_d cost[m, d] / sum_m mean_d cost[m, d]`` (what an FSDP
            step waits for: every microbatch round ends with its slowest replica).
        lower_bound: ``max(total_cost / dp, largest single sequence cost)``.
        bound_ratio: ``max(replica_cost) / lower_bound`` (1.0 is optimal).
        pad_fraction: ``1 - real_tokens / padded_tokens``.
        dropped_sequences, dropped_tokens: Removed by ``on_oversize="drop"``.
        truncated_sequences, truncated_tokens: Tokens cut by ``on_oversize="truncate"``.
        deferred_sequences: Held back for the next step.
        empty_samples: Zero-length samples the wrapper dropped.
        flops: Model training FLOPs of the step, when a model is known.
    """

    num_sequences: int = 0
    num_microbatches: int = 0
    min_microbatches: int = 0
    dp_size: int = 1
    cp_size: int = 1
    real_tokens: int = 0
    padded_tokens: int = 0
    seqlen_sum: int = 0
    seqlen_sq_sum: int = 0
    replica_cost: list[float] = dataclasses.field(default_factory=list)
    imbalance: float = 1.0
    round_imbalance: float = 1.0
    lower_bound: float = 0.0
    bound_ratio: float = 1.0
    pad_fraction: float = 0.0
    dropped_sequences: int = 0
    dropped_tokens: int = 0
    truncated_sequences: int = 0
    truncated_tokens: int = 0
    deferred_sequences: int = 0
    empty_samples: int = 0
    flops: float | None = None

    @classmethod
    def from_schedule(
        cls,
        schedule: Schedule,
        cost: CostModel | None = None,
        *,
        flops: float | None = None,
        empty_samples: int = 0,
    ) -> StepStats:
        """Account a schedule. Empty microbatches count a padding-only filler of
        ``pad_multiple`` tokens, as the wrapper sends one."""
        lengths = schedule.lengths
        assigned = np.concatenate([ids for row in schedule.assignment for ids in row] or [np.zeros(0, np.int64)])
        real = lengths[assigned]
        padded = padded_lengths(real, schedule.pad_multiple)
        empties = sum(1 for row in schedule.assignment for ids in row if ids.size == 0)
        padded_tokens = int(padded.sum()) + empties * schedule.pad_multiple
        costs = microbatch_costs(schedule, cost)
        replica = costs.sum(axis=0) if costs.size else np.zeros(schedule.dp_size)
        total = float(replica.sum())
        mean = total / schedule.dp_size if schedule.dp_size else 0.0
        per_seq = padded.astype(np.float64) if cost is None else cost.cost(padded) + cost.constant
        largest = float(per_seq.max()) if per_seq.size else 0.0
        lower = max(mean, largest)
        round_mean = costs.mean(axis=1).sum() if costs.size else 0.0
        round_max = costs.max(axis=1).sum() if costs.size else 0.0
        orig = schedule.original_lengths
        truncated_tokens = int((orig[schedule.truncated] - lengths[schedule.truncated]).sum())
        real_int = [int(v) for v in real.tolist()]
        return cls(
            num_sequences=int(assigned.shape[0]),
            num_microbatches=schedule.num_microbatches,
            min_microbatches=int(math.ceil(int(padded.sum()) / (schedule.dp_size * schedule.capacity)))
            if padded.size
            else 0,
            dp_size=schedule.dp_size,
            cp_size=schedule.cp_size,
            real_tokens=sum(real_int),
            padded_tokens=padded_tokens,
            seqlen_sum=sum(real_int),
            seqlen_sq_sum=sum(v * v for v in real_int),
            replica_cost=[float(v) for v in replica],
            imbalance=float(replica.max() / mean) if mean > 0 else 1.0,
            round_imbalance=float(round_max / round_mean) if round_mean > 0 else 1.0,
            lower_bound=lower,
            bound_ratio=float(replica.max() / lower) if lower > 0 else 1.0,
            pad_fraction=1.0 - sum(real_int) / padded_tokens if padded_tokens else 0.0,
            dropped_sequences=int(schedule.dropped.shape[0]),
            dropped_tokens=int(orig[schedule.dropped].sum()),
            truncated_sequences=int(schedule.truncated.shape[0]),
            truncated_tokens=truncated_tokens,
            deferred_sequences=int(schedule.deferred.shape[0]),
            empty_samples=int(empty_samples),
            flops=flops,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
