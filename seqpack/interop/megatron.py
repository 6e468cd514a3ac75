"""seqpack's scheduler behind Megatron-LM's own ``wrap_data_iterator``.

:class:`SeqpackPackingScheduler` is Megatron's ``DpBalancedScheduler``
(``megatron/core/datasets/data_schedule.py``) with seqpack's planner in
``get_groups_and_subsamples``: Megatron's ``run`` does everything else (fetch, gather, reroute,
pack, broadcast). :func:`install` makes ``wrap_data_iterator`` use it. ``prefetch=1`` plans
each step in a planning process while the step before trains (a process, not a thread:
seqpack's kernels hold the GIL); docs/integrations.md, "Plan time and prefetch". The pure part
is :mod:`seqpack.interop.megatron_plan`. Importing this module without Megatron-LM raises
:class:`MegatronUnavailableError`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from seqpack.cost import CostModel, check_cost_model
from seqpack.errors import ConfigError, SampleError
from seqpack.interop.megatron_plan import (
    HYBRID_CP_REFUSAL,
    check_config,
    check_sample,
    model_spec,
    plan_groups,
)
from seqpack.options import Sync
from seqpack.schedulers import get_scheduler
from seqpack.validation import check_choice, check_int, check_optional_int, check_positive_int

__all__ = ["MegatronUnavailableError", "SeqpackPackingScheduler", "install"]

logger = logging.getLogger(__name__)


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
            model of the ``config`` that ``run`` gets, or seqpack's default model where that
            config has no model fields.
        sync: ``"replica"`` (default: Megatron reduces gradients once a step) or
            ``"lockstep"``.
        dynamic_cp: Per-microbatch CP groups: refused (Megatron's hybrid CP takes no packing
            scheduler).
        prefetch: ``1``: plan each step during the step before (the loop must pass
            ``wrap_data_iterator`` the same data iterator object every step, and every rank
            must install the same value); ``0`` (default): plan inside ``run``.
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
        prefetch: int = 0,
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
        self.prefetch = check_int("prefetch", prefetch, minimum=0, maximum=1)
        self.options = {"microbatch_multiple": microbatch_group_size_per_vp_stage or 1, **options}
        self.scheduler = get_scheduler("balanced", **self.options)
        self._ahead: _ReadAhead | None = None  # this step's samples, read and planned by the run before

    def get_groups_and_subsamples(self, sample_id_seqlens: list[tuple[int, int]]) -> list[list[list[int]]]:
        """Megatron's groups: ``groups[m][j]``, the ids microbatch ``m`` of DP x CP rank ``j``
        packs (:func:`~seqpack.interop.megatron_plan.plan_groups`); under ``prefetch=1`` the
        plan made ahead when it was made for these very pairs."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.plan is not None and ahead.pairs == sample_id_seqlens:
            start = time.perf_counter()
            try:
                groups = ahead.plan.result()
            except _PlannerGone as exc:  # the planning process died (killed, out of memory)
                logger.warning("%s: planning this step here", exc)
                _PLANNER.clear()
            else:
                logger.debug("plan made ahead; waited %.2f ms for it", 1e3 * (time.perf_counter() - start))
                return groups
        return plan_groups(sample_id_seqlens, self.scheduler, **self._sizes())

    def _sizes(self) -> dict[str, Any]:
        """:func:`~seqpack.interop.megatron_plan.plan_groups`' keyword arguments."""
        sizes = {"max_seqlen_per_dp_cp_rank": self.max_seqlen_per_dp_cp_rank, "cp_size": self.cp_size}
        return sizes | {"dp_size": self.dp_size, "cost": self.cost, "sync": self.sync}

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
        rank's samples checked; under ``prefetch=1``, then the next step read and planned.

        Raises:
            ConfigError: ``config`` asks for hybrid CP. SampleError: A sample of this step lacks
                a key, on this DP rank or another (every rank of ``dp_group`` raises).
        """
        check_config(config)
        if self.cost is None and hasattr(config, "hidden_size"):
            self.cost = model_spec(config).cost_model()
        index = _reader_index(data_iterator, pp_group, config)
        source = None if index is None else (data_iterator if index == -2 else data_iterator[index])
        if source is not None:
            items = self._take(source, num_microbatches, dp_group, dev)
            if index == -2:
                data_iterator = iter(items)
            else:
                data_iterator = list(data_iterator)
                data_iterator[index] = iter(items)
        result = super().run(data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config)
        if source is not None and self.prefetch:
            self._read_ahead(source, num_microbatches, dp_group, dev)
        return result

    def _take(self, source: Any, count: int, dp_group: Any, dev: Any) -> list[Any]:
        """This step's ``count`` items: those read ahead for it (and its plan), the rest read
        and checked now."""
        ahead = _recall(source) if self.prefetch else None
        items: list[Any] = []
        if ahead is not None:
            if ahead.error is not None:
                raise ahead.error
            items, self._ahead = ahead.items, ahead
        if len(items) < count:
            more, error, _ = _read_checked(source, count - len(items), dp_group, dev, stop=False)
            if error is not None:
                raise error
            items = items + more
        if len(items) > count:  # fewer microbatches than the step before (a batch-size ramp)
            _AHEAD[source] = _ReadAhead(items[count:])
        return items[:count]

    def _read_ahead(self, source: Any, count: int, dp_group: Any, dev: Any) -> None:
        """Read the next step's items from ``source`` (assuming ``count`` again), gather their
        lengths over ``dp_group`` as Megatron's ``run`` will, and hand them to the planning
        process. A bad sample or the end of the data on any DP rank stops here, agreed; the
        next ``run`` raises it or meets the end."""
        held = _recall(source)
        items = held.items if held is not None else []
        more, error, ended = _read_checked(source, max(count - len(items), 0), dp_group, dev, stop=True)
        ahead = _ReadAhead(items + more, error=error)
        if error is None and not ended:
            _, ahead.pairs, _, _, seqlens = data_schedule.get_batch_and_global_seqlens(
                iter(ahead.items), count, dp_group
            )
            # Megatron's global ids are the positions of the lengths in its gather.
            ahead.plan = _planner().submit(np.array(seqlens, dtype=np.int64), self.options, self._sizes())
        _AHEAD[source] = ahead


@dataclasses.dataclass
class _ReadAhead:
    """A data iterator's next step under ``prefetch=1``, read during the step before: its
    ``items`` (checked), the agreed ``error`` they gave, or the ``(global_id,
    padded_seq_len)`` ``pairs`` gathered over DP and their ``plan`` in the making, used when
    Megatron's own gather gives the same pairs."""

    items: list[Any]
    error: SampleError | None = None
    pairs: list[tuple[int, int]] | None = None
    plan: Future[list[list[list[int]]]] | None = None


# Keyed by the data iterator: wrap_data_iterator builds a new scheduler every step.
_AHEAD: weakref.WeakKeyDictionary[Any, _ReadAhead] = weakref.WeakKeyDictionary()


class _PlannerGone(RuntimeError):
    """The planning process ended before answering."""


class _Planner:
    """This rank's planning process: ``python -m seqpack.interop.megatron_plan`` (its
    ``serve`` loop) on two pipes of its own, fed by one thread here, one plan at a time, in
    order. A fresh interpreter, not a ``multiprocessing`` child: ``fork`` would copy CUDA and
    threads, ``spawn`` would import the training script again. It ends when this process
    closes its end of the jobs pipe."""

    def __init__(self) -> None:
        jobs_out, jobs_in = os.pipe()
        answers_out, answers_in = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # seqpack as imported here
        command = [sys.executable, "-m", "seqpack.interop.megatron_plan", str(jobs_out), str(answers_in)]
        self.process = subprocess.Popen(command, pass_fds=(jobs_out, answers_in), env=env, stdin=subprocess.DEVNULL)
        os.close(jobs_out)
        os.close(answers_in)
        self.jobs, self.answers = os.fdopen(jobs_in, "wb"), os.fdopen(answers_out, "rb")
        self.queue: queue.SimpleQueue[tuple[Any, Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._feed, name="seqpack-megatron-plan", daemon=True).start()

    def submit(self, lengths: np.ndarray, options: dict[str, Any], sizes: dict[str, Any]) -> Future[Any]:
        """The groups of :func:`~seqpack.interop.megatron_plan.plan_lengths`, to come."""
        future: Future[Any] = Future()
        self.queue.put(((lengths, options, sizes), future))
        return future

    def _feed(self) -> None:
        while True:
            job, future = self.queue.get()
            try:
                pickle.dump(job, self.jobs)
                self.jobs.flush()
                planned, answer = pickle.load(self.answers)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                code = self.process.poll()
                future.set_exception(_PlannerGone(f"seqpack's planning process ended (exit code {code}): {exc!r}"))
                continue
            (future.set_result if planned else future.set_exception)(answer)


_PLANNER: list[_Planner] = []


def _planner() -> _Planner:
    """This rank's :class:`_Planner`, started at its first plan."""
    if not _PLANNER:
        _PLANNER.append(_Planner())
    return _PLANNER[0]


def _recall(source: Any) -> _ReadAhead | None:
    """What was read ahead from ``source`` (forgotten here), or ``None``.

    Raises:
        ConfigError: ``source`` cannot be weakly referenced (before anything is read from it).
    """
    try:
        return _AHEAD.pop(source, None)
    except TypeError:
        raise ConfigError(
            f"prefetch=1 needs a data iterator that can be weakly referenced (Megatron's RerunDataIterator, a "
            f"generator), got a {type(source).__name__}: wrap it in RerunDataIterator or install with prefetch=0"
        ) from None


def _reader_index(data_iterator: Any, pp_group: Any, config: Any) -> int | None:
    """Which iterator Megatron's ``run`` reads on this rank: ``-2`` the one given, ``0`` / ``-1``
    the first / last stage's entry of a VPP list, ``None`` none (TP rank > 0, a middle stage)."""
    vpp = getattr(config, "virtual_pipeline_model_parallel_size", None)
    if vpp is None or vpp <= 1:
        return None if data_iterator is None else -2
    index = 0 if pp_group.rank() == 0 else -1 if pp_group.rank() == pp_group.size() - 1 else None
    return None if index is None or data_iterator[index] is None else index


def _read_checked(
    data_iterator: Any, count: int, dp_group: Any, dev: Any, *, stop: bool
) -> tuple[list[Any], SampleError | None, bool]:
    """``count`` items of this rank (an item is a sample or a list of them), every sample
    checked and the outcome agreed over ``dp_group`` (a bad sample fails every DP rank). With
    ``stop``, the end of the data is caught and agreed too (returned as ``ended``); without,
    it propagates."""
    items: list[Any] = []
    ended = False
    try:
        for _ in range(count):
            items.append(next(data_iterator))
    except StopIteration:
        if not stop:
            raise
        ended = True
    samples = [sample for item in items for sample in (item if isinstance(item, list) else [item])]
    error = None
    try:
        for index, sample in enumerate(samples):
            check_sample(sample, index)
    except SampleError as exc:
        error = exc
    if dp_group.size() > 1:
        flags = torch.tensor([error is not None, ended], dtype=torch.int32, device=dev)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        failed, ended = (bool(f) for f in flags.tolist())  # a host sync, once a step (as Megatron's gather)
        if error is None and failed:
            error = SampleError(
                "a sample of this step on another DP rank lacks a key Megatron's packing scheduler needs"
            )
    return items, error, ended


def install(**options: Any) -> Any:
    """Make Megatron's ``wrap_data_iterator`` plan with :class:`SeqpackPackingScheduler`.

    seqpack takes ``data_schedule.scheduler_map``'s ``"dp_balanced"`` entry (its only
    choice, an enum), so a config that asks for ``"dp_balanced"`` runs seqpack's planner.

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
