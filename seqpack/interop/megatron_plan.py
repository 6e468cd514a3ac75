"""What seqpack's Megatron-LM packing scheduler computes, without Megatron: its groups, the
checks on samples and configs, and the cost model of a Megatron ``TransformerConfig``; pure,
so tested where Megatron is not installed. The contract kept is Megatron-LM's
``megatron/core/datasets/data_schedule.py``:

* The scheduler gets ``(global_id, padded_seq_len)`` pairs in global order and returns
  ``groups[m][j]``: the ids that microbatch ``m`` of DP x CP rank ``j`` packs (CP rank
  ``j % cp_size`` of DP replica ``j // cp_size``; the CP ranks of one replica share one list).
* A replica's microbatch holds at most ``max_seqlen_per_dp_cp_rank * cp_size`` padded tokens.
* With interleaved pipelines the microbatch count is a multiple of
  ``microbatch_group_size_per_vp_stage``; no microbatch is empty.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from seqpack.cost import CostModel, ModelSpec
from seqpack.errors import ConfigError, SampleError, ScheduleError
from seqpack.schedulers import Scheduler, get_scheduler

__all__ = [
    "HYBRID_CP_REFUSAL",
    "REQUIRED_SAMPLE_KEYS",
    "check_config",
    "check_sample",
    "model_spec",
    "plan_groups",
    "plan_lengths",
    "serve",
]

REQUIRED_SAMPLE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
"""Keys every sample handed to Megatron's packing scheduler carries, beside ``cu_seqlens`` (a
pre-packed sample, e.g. ``SFTDataset``'s) or ``padded_seq_len`` (one sequence)."""
LENGTH_KEYS = ("cu_seqlens", "padded_seq_len")
HYBRID_CP_REFUSAL = (
    "Megatron's hybrid CP (per-microbatch CP groups) schedules through HybridCPDataLoaderWrapper and its "
    "BalancedCPScheduler, which take no packing scheduler; seqpack's plans keep each replica's CP ranks together "
    "(static CP): set hybrid_context_parallel=False and dynamic_cp=False"
)


def plan_groups(
    sample_id_seqlens: Sequence[tuple[int, int]],
    scheduler: Scheduler,
    *,
    max_seqlen_per_dp_cp_rank: int,
    cp_size: int,
    dp_size: int,
    cost: CostModel | None = None,
    sync: str = "replica",
) -> list[list[list[int]]]:
    """Megatron's ``get_groups_and_subsamples`` planned by ``scheduler``.

    Args:
        sample_id_seqlens: ``(global_id, padded_seq_len)`` pairs in global order.
        scheduler: A static-CP seqpack scheduler (its ``microbatch_multiple`` is the VPP
            multiple).
        max_seqlen_per_dp_cp_rank, cp_size, dp_size: Megatron's capacity and sizes.
        cost, sync: What the plan balances (:meth:`~seqpack.schedulers.Scheduler.schedule`).

    Returns:
        ``groups[m][j]``, ids of microbatch ``m`` on DP x CP rank ``j`` (module docstring).

    Raises:
        ScheduleError: A sequence over the capacity, or fewer sequences than the microbatches
            the capacity and the VPP multiple need (one each, ``dp_size`` per round).
    """
    ids = [int(gid) for gid, _ in sample_id_seqlens]
    lengths = np.array([int(n) for _, n in sample_id_seqlens], dtype=np.int64)
    schedule = scheduler.schedule(
        lengths, dp_size=dp_size, cp_size=cp_size, max_tokens_per_rank=max_seqlen_per_dp_cp_rank, cost=cost, sync=sync
    )
    rounds = [[[int(i) for i in replica] for replica in r] for r in schedule.assignment]
    if len(ids) < dp_size * len(rounds):
        multiple = getattr(scheduler, "microbatch_multiple", 1)
        raise ScheduleError(
            f"{len(ids)} sequences cannot fill {len(rounds)} microbatches on each of {dp_size} DP replicas "
            f"(Megatron packs no empty microbatch): the capacity (max_seqlen_per_dp_cp_rank={max_seqlen_per_dp_cp_rank}"
            f" x cp_size={cp_size}) and the VPP multiple (microbatch_group_size_per_vp_stage={multiple}) need "
            f"{len(rounds)}; read at least {dp_size * len(rounds)} sequences a step, or lower the multiple"
        )
    _fill_empty([g for r in rounds for g in r], lengths)
    # The CP ranks of a replica get the same list, as in Megatron.
    return [[group for group in ([ids[i] for i in g] for g in r) for _ in range(cp_size)] for r in rounds]


def plan_lengths(lengths: np.ndarray, options: Mapping[str, Any], **sizes: Any) -> list[list[list[int]]]:
    """:func:`plan_groups` of the pairs ``(i, lengths[i])`` by ``get_scheduler("balanced",
    **options)``: what the planning process of ``prefetch=1`` runs. The scheduler is built
    here, not sent: a pickled one loses the identity of its default stages."""
    return plan_groups(list(enumerate(lengths.tolist())), get_scheduler("balanced", **options), **sizes)


def serve(jobs: BinaryIO, answers: BinaryIO) -> None:
    """The planning process of ``prefetch=1`` (``python -m seqpack.interop.megatron_plan
    JOBS_FD ANSWERS_FD``): read pickled ``(lengths, options, sizes)`` jobs from ``jobs`` and
    write ``(True, groups)`` or ``(False, the exception)`` for each to ``answers``, in order,
    until ``jobs`` ends (the training process closed it or died)."""
    while True:
        try:
            lengths, options, sizes = pickle.load(jobs)
        except EOFError:
            return
        try:
            answer: tuple[bool, Any] = (True, plan_lengths(lengths, options, **sizes))
        except Exception as exc:  # noqa: BLE001 - raised by the step the plan was for
            answer = (False, exc)
        try:
            pickle.dump(answer, answers)
            answers.flush()
        except BrokenPipeError:  # the training process is gone
            return


def _fill_empty(groups: list[list[int]], lengths: np.ndarray) -> None:
    """Give every empty group the shortest sequence of the group holding most (there are at
    least as many sequences as groups, so that one holds two or more)."""
    for empty in [g for g in groups if not g]:
        donor = max(groups, key=len)
        shortest = min(donor, key=lambda i: int(lengths[i]))
        donor.remove(shortest)
        empty.append(shortest)


def check_sample(sample: object, index: int) -> None:
    """Raise unless ``sample`` (item ``index`` of this rank's step) is a mapping with the keys
    Megatron's packing scheduler needs.

    Raises:
        SampleError: Not a mapping, or a key missing (named, with the keys it has).
    """
    if not isinstance(sample, Mapping):
        raise SampleError(f"sample {index} of this rank's step is a {type(sample).__name__}, not a dict of tensors")
    missing = [k for k in REQUIRED_SAMPLE_KEYS if k not in sample]
    if not any(k in sample for k in LENGTH_KEYS):
        missing.append(" or ".join(LENGTH_KEYS))
    if missing:
        raise SampleError(
            f"sample {index} of this rank's step lacks {missing} (it has {sorted(sample)}): Megatron's packing "
            f"scheduler needs {list(REQUIRED_SAMPLE_KEYS)} and 'cu_seqlens' (pre-packed) or 'padded_seq_len' (one "
            "sequence)"
        )


def check_config(config: Any) -> None:
    """Raise if Megatron's ``config`` asks for what seqpack's packing scheduler cannot honour.

    Raises:
        ConfigError: ``hybrid_context_parallel=True`` (:data:`HYBRID_CP_REFUSAL`).
    """
    if getattr(config, "hybrid_context_parallel", False):
        raise ConfigError(f"hybrid_context_parallel=True: {HYBRID_CP_REFUSAL}")


def model_spec(config: Any) -> ModelSpec:
    """The :class:`~seqpack.cost.ModelSpec` of a Megatron ``TransformerConfig`` (dense or MoE
    GPT; a MoE layer's MLP costs its ``moe_router_topk`` routed experts and its shared one).

    Raises:
        ConfigError: A model this cost does not describe (multi-latent attention, a hybrid
            Mamba model, a bidirectional window): pass ``cost=`` instead.
    """
    for name in ("multi_latent_attention", "is_hybrid_model"):
        if getattr(config, name, False):
            raise ConfigError(f"no seqpack cost model follows Megatron's {name}=True: pass cost=CostModel(...)")
    window = getattr(config, "window_size", None)
    if window is not None and window[1] != 0:
        raise ConfigError(f"no seqpack cost model follows Megatron's window_size={window!r}: pass cost=CostModel(...)")
    ffn = config.ffn_hidden_size
    if getattr(config, "num_moe_experts", None):
        ffn = config.moe_router_topk * config.moe_ffn_hidden_size + (config.moe_shared_expert_intermediate_size or 0)
    return ModelSpec(
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=ffn,
        num_query_groups=config.num_query_groups,
        kv_channels=config.kv_channels,
        gated_linear_unit=config.gated_linear_unit,
        window_size=None if window is None else window[0],
    )


if __name__ == "__main__":
    serve(os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb"))
