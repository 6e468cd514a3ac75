"""seqpack's scheduler behind Megatron-LM's own ``wrap_data_iterator``.

Megatron-LM (``megatron/core/datasets/data_schedule.py``) picks a ``BasePackingScheduler``
from ``scheduler_map`` by ``config.sequence_packing_scheduler`` and calls its ``run``: fetch
each DP rank's samples, gather their lengths, ``get_groups_and_subsamples``, reroute, pack,
broadcast over PP and TP. :class:`SeqpackPackingScheduler` is Megatron's
``DpBalancedScheduler`` with seqpack's planner in ``get_groups_and_subsamples``: Megatron's
``run`` does everything else, so the model gets Megatron's own packing of seqpack's groups.
:func:`install` is the one call that makes ``wrap_data_iterator`` use it.

The pure part (groups, checks, the cost of a ``TransformerConfig``) is
:mod:`seqpack.interop.megatron_plan`. Importing this module without Megatron-LM raises
:class:`MegatronUnavailableError`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch

from seqpack.cost import CostModel, check_cost_model
from seqpack.errors import ConfigError, SampleError
from seqpack.interop.megatron_plan import HYBRID_CP_REFUSAL, check_config, check_sample, model_spec, plan_groups
from seqpack.options import Sync
from seqpack.schedulers import get_scheduler
from seqpack.validation import check_choice, check_optional_int, check_positive_int

__all__ = ["MegatronUnavailableError", "SeqpackPackingScheduler", "install"]


class MegatronUnavailableError(ConfigError, ModuleNotFoundError):
    """Megatron-LM with ``megatron.core.datasets.data_schedule`` cannot be imported;
    ``__cause__`` is the import error."""


try:
    from megatron.core.datasets import data_schedule  # type: ignore[import-not-found]
except ImportError as exc:
    raise MegatronUnavailableError(
        "seqpack.interop.megatron needs Megatron-LM with megatron/core/datasets/data_schedule.py (its main branch; "
        f"the megatron-core 0.19 release lacks it): {exc}"
    ) from exc


class SeqpackPackingScheduler(data_schedule.DpBalancedScheduler):
    """Megatron's packing scheduler planned by seqpack (module docstring).

    Args:
        max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage:
            Megatron's, as its ``wrap_data_iterator`` passes them (the last ``None`` without
            interleaved pipelines).
        cost: What the plan balances (a :class:`~seqpack.cost.CostModel`). ``None``: the
            model of the ``config`` that
            ``run`` gets (:func:`~seqpack.interop.megatron_plan.model_spec`), or seqpack's
            default model where that config has no model fields.
        sync: ``"replica"`` (default: Megatron's DDP and distributed optimizer reduce
            gradients once a step, so a step waits for the slowest replica's total) or
            ``"lockstep"`` (every microbatch round waits for its slowest replica).
        dynamic_cp: Per-microbatch CP groups: refused (Megatron's hybrid CP takes no packing
            scheduler, :func:`~seqpack.interop.megatron_plan.check_config`).
        **options: ``balanced`` scheduler options (``order``, ``locality``, ...).

    Raises:
        ConfigError: A size or option out of range, ``dynamic_cp=True``, or
            ``microbatch_multiple`` among ``options`` (Megatron's VPP group size sets it).
    """

    def __init__(
        self,
        max_seqlen_per_dp_cp_rank: int,
        cp_size: int,
        dp_size: int,
        microbatch_group_size_per_vp_stage: int | None = None,
        *,
        cost: CostModel | None = None,
        sync: str = "replica",
        dynamic_cp: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(
            check_positive_int("max_seqlen_per_dp_cp_rank", max_seqlen_per_dp_cp_rank),
            check_positive_int("cp_size", cp_size),
            check_positive_int("dp_size", dp_size),
            check_optional_int("microbatch_group_size_per_vp_stage", microbatch_group_size_per_vp_stage, minimum=1),
        )
        if dynamic_cp:
            raise ConfigError(f"dynamic_cp=True: {HYBRID_CP_REFUSAL}")
        if "microbatch_multiple" in options:
            raise ConfigError("microbatch_multiple is Megatron's microbatch_group_size_per_vp_stage here: set that")
        self.cost = check_cost_model("cost", cost)
        self.sync = check_choice("sync", sync, Sync).value
        multiple = microbatch_group_size_per_vp_stage or 1
        self.scheduler = get_scheduler("balanced", microbatch_multiple=multiple, **options)

    def get_groups_and_subsamples(self, sample_id_seqlens: list[tuple[int, int]]) -> list[list[list[int]]]:
        """Megatron's groups: ``groups[m][j]``, the ids microbatch ``m`` of DP x CP rank ``j``
        packs (:func:`~seqpack.interop.megatron_plan.plan_groups`)."""
        return plan_groups(
            sample_id_seqlens,
            self.scheduler,
            max_seqlen_per_dp_cp_rank=self.max_seqlen_per_dp_cp_rank,
            cp_size=self.cp_size,
            dp_size=self.dp_size,
            cost=self.cost,
            sync=self.sync,
        )

    def run(
        self,
        data_iterator: Any,
        num_microbatches: int,
        dp_group: Any,
        tp_group: Any,
        pp_group: Any,
        dp_cp_group: Any,
        dev: Any,
        config: Any,
    ) -> Any:
        """Megatron's ``run``, after refusing a config seqpack cannot honour and with this
        rank's samples checked.

        Raises:
            ConfigError: ``config`` asks for hybrid CP. SampleError: A sample of this step lacks
                a key, on this DP rank or another (every rank of ``dp_group`` raises).
        """
        check_config(config)
        if self.cost is None and hasattr(config, "hidden_size"):
            self.cost = model_spec(config).cost_model()
        # TP rank 0 of the first and last stage reads (under VPP from its stage's entry).
        iterators = list(data_iterator) if isinstance(data_iterator, list) else [data_iterator]
        for v, iterator in enumerate(iterators):
            if iterator is not None:
                iterators[v] = _read_checked(iterator, num_microbatches, dp_group, dev)
        data_iterator = iterators if isinstance(data_iterator, list) else iterators[0]
        return super().run(data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config)


def _read_checked(data_iterator: Any, num_microbatches: int, dp_group: Any, dev: Any) -> Iterator[Any]:
    """This rank's ``num_microbatches`` items (as many as Megatron reads; an item is a sample
    or a list of them), every sample checked and the outcome agreed over ``dp_group``: a bad
    sample fails every DP rank instead of leaving the others waiting in the length gather."""
    items = [next(data_iterator) for _ in range(num_microbatches)]
    samples = [sample for item in items for sample in (item if isinstance(item, list) else [item])]
    error = None
    try:
        for index, sample in enumerate(samples):
            check_sample(sample, index)
    except SampleError as exc:
        error = exc
    if dp_group.size() > 1:
        failed = torch.tensor([error is not None], dtype=torch.int32, device=dev)
        torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        if error is None and failed.item():  # a host sync, once a step (Megatron's gather syncs too)
            error = SampleError(
                "a sample of this step on another DP rank lacks a key Megatron's packing scheduler needs"
            )
    if error is not None:
        raise error
    return iter(items)


def install(**options: Any) -> Any:
    """Make Megatron's ``wrap_data_iterator`` plan with :class:`SeqpackPackingScheduler`.

    Megatron picks its scheduler from ``data_schedule.scheduler_map`` by
    ``config.sequence_packing_scheduler``, whose only choice is ``"dp_balanced"`` (an enum,
    which cannot gain members): seqpack takes that entry, so a config that asks for
    ``"dp_balanced"`` runs seqpack's planner. No Megatron file changes.

    Args:
        **options: :class:`SeqpackPackingScheduler`'s keyword options, checked now.

    Returns:
        The entry replaced (Megatron's ``DpBalancedScheduler``), to put back if wanted.

    Raises:
        ConfigError, SeqpackTypeError: A bad option.
    """
    SeqpackPackingScheduler(1, 1, 1, None, **options)  # check the options here, not at the first step
    key = data_schedule.PackingSchedulerEnum.DP_BALANCED
    replaced = data_schedule.scheduler_map[key]
    data_schedule.scheduler_map[key] = functools.partial(SeqpackPackingScheduler, **options)
    return replaced
