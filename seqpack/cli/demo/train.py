"""One rank of ``seqpack demo``: build the tiny model, shard it with FSDP2, train every mode.

Modes take turns step by step on the same data from the same initial weights, so that
warm-up and the noise of a shared machine fall on all of them alike. Rank 0 prints one log
line per step; the summary table is printed by the launcher (:mod:`seqpack.cli.demo.launch`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seqpack.calibrate import CostCalibrator, MicrobatchTimer
from seqpack.cli.demo.data import load_dataset, padded_microbatches, rank_indices, sample_order
from seqpack.cli.demo.settings import DemoSettings
from seqpack.cli.tables import usable_cores
from seqpack.cost import CostModel
from seqpack.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from seqpack.compute.tiny_lm import TinyConfig
    from seqpack.cost import ModelSpec
    from seqpack.thd import PackedBatch
    from seqpack.topology import Topology

__all__ = ["calibrate_cost", "measure_gemm_flops", "resolve_cost", "warm_up", "worker"]


def measure_gemm_flops(size: int = 384, repeats: int = 5) -> float:
    """fp32 GEMM FLOP/s of this process (the 'peak' that MFU is measured against)."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * size**3 / best


def calibrate_cost(cfg: TinyConfig, max_len: int, tokens: int = 4096, repeats: int = 2) -> CostModel:
    """The tiny model's cost on this CPU: time forward+backward of packs of equal-length
    sequences (64 tokens up to ``max_len``) and fit ``constant + linear*S + quadratic*SS``.

    Attention on CPU runs far below GEMM speed, so the measured cost is more quadratic than
    the FLOPs count says; this is what a rank actually waits for.
    """
    from seqpack.compute.tiny_lm import TinyHybridLM
    from seqpack.thd import pack_sequences

    model = TinyHybridLM(cfg)
    gen = torch.Generator().manual_seed(0)
    sizes, length = [], 64
    while length < max_len:
        sizes.append(length)
        length *= 2
    sizes.append(max_len)
    packs = [[n] * max(1, total // n) for n in sizes for total in (tokens // 2, tokens)]
    times = []
    for lengths in packs:
        batch = pack_sequences([{"input_ids": torch.randint(1, cfg.vocab_size, (n,), generator=gen)} for n in lengths])
        best = math.inf
        for _ in range(repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            loss, _ = model.loss_sum(batch)
            loss.backward()
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    return CostModel.fit(packs, times)


def warm_up(cfg: TinyConfig, settings: DemoSettings) -> None:
    """Run a full-capacity microbatch holding a longest-possible sequence once, so that no
    mode pays this process's first touch of its peak memory (slow on VMs) in its timings."""
    from seqpack.compute.tiny_lm import TinyHybridLM
    from seqpack.thd import pack_sequences

    model = TinyHybridLM(cfg)
    capacity = settings.max_tokens_per_rank  # what one rank holds (CP shards are smaller)
    lengths = [settings.max_seq_len]
    while sum(lengths) + settings.mean_seq_len <= capacity:
        lengths.append(settings.mean_seq_len)
    batch = pack_sequences([{"input_ids": torch.ones(n, dtype=torch.int64)} for n in lengths])
    for _ in range(2):
        loss, _ = model.loss_sum(batch)
        loss.backward()


def resolve_cost(settings: DemoSettings, cfg: TinyConfig, spec: ModelSpec) -> CostModel:
    """The scheduler's cost model, identical on every rank (rank 0 measures, all receive)."""
    import torch.distributed as dist

    if settings.cost == "flops":
        return spec.cost_model()
    if settings.cost == "tokens":
        return CostModel.tokens()
    # "measured", and "online", which starts from this measurement (in seconds) and refits.
    coef = torch.zeros(3, dtype=torch.float64)
    if dist.get_rank() == 0:
        model = calibrate_cost(cfg, settings.max_seq_len)
        coef = torch.tensor([model.linear, model.quadratic, model.constant], dtype=torch.float64)
    dist.broadcast(coef, src=0)  # coefficients are reals; everyone must schedule with the same ones
    return CostModel(float(coef[0]), float(coef[1]), float(coef[2]))


class _Run:
    """One mode's model, optimizer and batches, trained one step at a time (the modes take turns)."""

    def __init__(
        self,
        mode: str,
        settings: DemoSettings,
        mesh: DeviceMesh,
        topology: Topology,
        dataset: Any,
        order: np.ndarray,
        vocab_size: int,
        spec: ModelSpec,
        cost: CostModel,
    ) -> None:
        from torch.distributed.fsdp import fully_shard

        from seqpack.compute.tiny_lm import TinyHybridLM
        from seqpack.loader.iterator import wrap_data_iterator

        self.mode, self.settings, self.topology, self.spec = mode, settings, topology, spec
        cp_group = mesh["cp"].get_group() if settings.cp > 1 else None
        torch.manual_seed(settings.seed)  # every mode starts from the same weights
        self.model = TinyHybridLM(settings.tiny_config(vocab_size), cp_group=cp_group)
        if settings.world_size > 1:
            flat = mesh["dp", "cp"]._flatten("dp_cp")
            if settings.fsdp_units == "block":
                for block in self.model.blocks:
                    fully_shard(block, mesh=flat)
            fully_shard(self.model, mesh=flat)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=settings.lr)
        self.samples = (dataset[i] for i in rank_indices(settings, order, topology.dp_rank))
        self.online = settings.cost == "online" and mode != "padded"
        self.timer = MicrobatchTimer("cpu") if self.online else None
        if mode != "padded":
            online: dict[str, Any] = {}
            if self.online:
                # The measured cost (seconds) is the prior; FSDP syncs every microbatch, so a
                # step waits for the sum over rounds of the slowest replica ("lockstep").
                calibrator = CostCalibrator(cost, window=256, min_points=max(3, 2 * settings.dp), prior_in_seconds=True)
                online = {"calibrate": calibrator, "sync": "lockstep"}
            self.steps = wrap_data_iterator(
                self.samples,
                topology,
                samples_per_rank=settings.samples_per_rank,
                max_tokens_per_rank=settings.max_tokens_per_rank,
                scheduler=mode,
                data_owner="tp0",
                cost=cost,
                flops_fn=spec.flops,
                # The modes take turns step by step: a background thread would prepare this
                # mode's next step inside another mode's timed step. Time the work where it is done.
                prefetch=0,
                **online,
            )
        self.step: Any = None  # the current Step (packed modes)
        self.predictions: list[tuple[int, float, float]] = []  # (step, predicted, measured) seconds
        self.fitted_steps: set[int] = set()  # steps scheduled with a fitted model (not the prior)
        # Every sum starts at 0 (an int): the real-valued ones turn float at the first measured step.
        self.totals: dict[str, Any] = dict.fromkeys(
            ("tokens", "time", "busy", "flops", "pad", "padded", "mbs", "measured"), 0
        )
        self.imbalances: list[float] = []
        self.round_imbalances: list[float] = []
        self.losses: list[float] = []

    def _batches(self) -> tuple[list[PackedBatch], int, int, int, int, float]:
        """(microbatches, real tokens, sum of squared lengths, padded tokens, mbs, imbalance)."""
        import torch.distributed as dist

        from seqpack.thd.cp import shard_for_cp

        settings, topology = self.settings, self.topology
        if self.mode != "padded":
            step = self.step = next(self.steps)
            st = step.stats
            if st.calibrated:
                self.fitted_steps.add(step.step)
            if st.prediction_error is not None and st.measured_step_time is not None:
                measured = st.measured_step_time
                self.predictions.append((st.measured_step or 0, measured * (1 + st.prediction_error), measured))
            self.round_imbalances.append(st.round_imbalance)
            return (
                step.microbatches,
                st.real_tokens,
                st.seqlen_sq_sum,
                st.padded_tokens,
                step.num_microbatches,
                st.imbalance,
            )
        local = [next(self.samples) for _ in range(settings.samples_per_rank)]
        batches = padded_microbatches(local, settings, list(range(len(local))))
        microbatches = [shard_for_cp(b, settings.cp, topology.cp_rank) for b in batches]
        lengths = torch.tensor([int(s["input_ids"].numel()) for s in local], dtype=torch.int64)
        counts = torch.tensor([int(lengths.sum()), int((lengths * lengths).sum()), sum(b.num_tokens for b in batches)])
        if topology.cp_rank != 0:  # the CP ranks of a replica hold the same samples: count once
            counts.zero_()
        dist.all_reduce(counts)
        real, sq_sum, padded = (int(v) for v in counts)
        return microbatches, real, sq_sum, padded, len(microbatches), float("nan")

    def train_step(self, index: int, log: Callable[..., None]) -> None:
        import torch.distributed as dist

        settings = self.settings
        world = settings.world_size
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        microbatches, real_tokens, sq_sum, padded_tokens, num_mbs, imbalance = self._batches()
        loss_tokens = torch.stack([mb.loss_mask.sum() for mb in microbatches if mb.loss_mask is not None])
        loss_tokens = loss_tokens.sum().reshape(1)
        dist.all_reduce(loss_tokens)
        total = torch.zeros(())
        busy = []  # this rank's CPU seconds of every microbatch's forward+backward
        for m, mb in enumerate(microbatches):
            c1 = time.thread_time()
            with self.timer.microbatch(self.step, m) if self.timer is not None else contextlib.nullcontext():
                loss_sum, _ = self.model.loss_sum(mb)
                # FSDP averages gradients over dp x cp; scaling by world makes them the gradient
                # of the global mean loss (CP ranks hold disjoint tokens of the same sequences).
                (loss_sum * world / loss_tokens).backward()
            total = total + loss_sum.detach()
            busy.append(time.thread_time() - c1)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        # [wall, CPU time outside the microbatches, CPU time of each round], each the slowest
        # rank's: every rank runs as many rounds. Their CPU sum is the lockstep step time with
        # a core per rank, which other work on the machine does not stretch.
        c_end = time.thread_time()
        times = torch.tensor([time.perf_counter() - t0, c_end - c0 - sum(busy), *busy], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        seconds = float(times[0])
        loss = float(total / loss_tokens)
        measured = index >= settings.warmup_steps
        if measured:
            t = self.totals
            t["tokens"] += real_tokens
            t["time"] += seconds
            t["busy"] += float(times[1:].sum())
            t["flops"] += float(self.spec.flops(real_tokens, sq_sum))
            t["pad"] += padded_tokens - real_tokens
            t["padded"] += padded_tokens
            t["mbs"] += num_mbs
            t["measured"] += 1
            if not math.isnan(imbalance):
                self.imbalances.append(imbalance)
        self.losses.append(loss)
        log(
            self.mode,
            index,
            settings,
            loss,
            real_tokens / seconds,
            1 - real_tokens / max(padded_tokens, 1),
            imbalance,
            num_mbs,
            measured,
            self.predictions[-1] if self.predictions and self.predictions[-1][0] == index - 1 else None,
        )

    def finish(self) -> None:
        """Run the iterator to its end, so that the last trained step's times reach every
        rank (they travel with the next gather, which then finds the data used up)."""
        if not self.online:
            return
        for _ in self.steps:  # the data is used up: this meets the end, after the last gather
            pass
        last = self.steps.last_measurement
        if last is not None and last.measured is not None and last.predicted is not None:
            if not self.predictions or self.predictions[-1][0] != last.step:
                self.predictions.append((last.step, last.predicted, last.measured))

    def result(self, peak_flops: float) -> dict[str, Any]:
        t = self.totals
        achieved = t["flops"] / t["time"] if t["time"] else 0.0
        cores = min(self.settings.world_size, usable_cores())
        return {
            "mode": self.mode,
            "tokens_per_s": t["tokens"] / t["time"] if t["time"] else 0.0,
            "busy_tokens_per_s": t["tokens"] / t["busy"] if t["busy"] else 0.0,
            "pad_fraction": t["pad"] / t["padded"] if t["padded"] else 0.0,
            "imbalance": float(np.mean(self.imbalances)) if self.imbalances else None,
            "round_imbalance": float(np.mean(self.round_imbalances[self.settings.warmup_steps :]))
            if self.round_imbalances
            else None,
            "microbatches_per_step": t["mbs"] / max(t["measured"], 1),
            "first_loss": self.losses[0],
            "last_loss": self.losses[-1],
            "model_flops_per_s": achieved,
            "mfu": achieved / (peak_flops * cores) if peak_flops else None,
            "seconds": t["time"],
            "steps": t["measured"],
            "real_tokens": t["tokens"],
            # Taken at the end of the run (the ranks' own load included): the summary says when
            # other work time-shared the cores, which makes the measured times mean little.
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            **self._calibration(),
        }

    def _calibration(self) -> dict[str, Any]:
        """Online calibration: the final model and how well the models in use predicted
        the steps' measured time (sum over microbatch rounds of the slowest replica)."""
        if not self.online:
            return {}
        calibrator = self.steps.calibrator
        model = calibrator.model if calibrator is not None else None
        errors: dict[bool, list[float]] = {True: [], False: []}  # by whether the step was scheduled with a fitted model
        for step, predicted, measured in self.predictions:
            if measured > 0:
                errors[step in self.fitted_steps].append(abs(predicted / measured - 1))
        every = errors[True] + errors[False]
        return {
            "cost_model": None if model is None else [model.linear, model.quadratic, model.constant],
            "calibrated": bool(calibrator is not None and calibrator.fitted),
            "predictions": [list(p) for p in self.predictions],
            "prediction_error_mean_abs": float(np.mean(every)) if every else None,
            "prediction_error_fitted": float(np.mean(errors[True])) if errors[True] else None,
            "predicted_by_fitted": len(errors[True]),
        }


def _log_step(
    mode: str,
    step: int,
    settings: DemoSettings,
    loss: float,
    tokens_per_s: float,
    pad: float,
    imbalance: float,
    mbs: int,
    measured: bool,
    prediction: tuple[int, float, float] | None = None,
) -> None:
    width = 16
    done = int(round((step + 1) / settings.total_steps * width))
    bar = "#" * done + "." * (width - done)
    imb = "  n/a " if math.isnan(imbalance) else f"{imbalance:6.3f}"
    tag = "" if measured else "  (warm-up)"
    # Online calibration: the model's prediction for the previous step (whose microbatch
    # times every rank now holds) against its measured time.
    pred = ""
    if prediction is not None:
        _, predicted, seconds = prediction
        pred = f" | step {step}: predicted {predicted * 1e3:7.1f} ms, measured {seconds * 1e3:7.1f} ms"
    print(
        f"[{mode:>11}] step {step + 1:>2}/{settings.total_steps} [{bar}] loss {loss:6.3f} | "
        f"{tokens_per_s:8,.0f} real tok/s | pad {pad * 100:5.1f}% | imbalance {imb} | {mbs:>2} mbs{pred}{tag}",
        flush=True,
    )


def _quiet_log(*args: Any) -> None:
    pass


def worker(settings: DemoSettings) -> list[dict[str, Any]] | None:
    """One rank of the demo (``torch.distributed`` initialised by the caller)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from seqpack.topology import Topology

    torch.set_num_threads(settings.threads)
    rank = dist.get_rank()
    if dist.get_world_size() != settings.world_size:
        raise ConfigError(
            f"world size {dist.get_world_size()} != dp({settings.dp}) * cp({settings.cp}) = {settings.world_size}"
        )
    mesh = init_device_mesh("cpu", (settings.dp, settings.cp), mesh_dim_names=("dp", "cp"))
    topology = Topology.from_device_mesh(mesh)
    dataset, vocab = load_dataset(settings)
    order = sample_order(settings, len(dataset))
    cfg = settings.tiny_config(vocab)
    spec = cfg.model_spec()
    warm_up(cfg, settings)
    cost = resolve_cost(settings, cfg, spec)
    # The GEMM 'peak' is measured by rank 0 while the others wait, so that ranks sharing a
    # core do not halve it.
    peak_t = torch.tensor([measure_gemm_flops() if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(peak_t, src=0)
    peak = float(peak_t)
    if rank == 0 and not settings.quiet:
        share = cost.quadratic_share(settings.mean_seq_len)
        then = "; then calibrated online from the microbatch times" if settings.cost == "online" else ""
        print(
            f"scheduler cost ({settings.cost}): {cost.linear:.4g}*s + {cost.quadratic:.4g}*s^2 + {cost.constant:.4g} "
            f"per microbatch; attention-like quadratic share at {settings.mean_seq_len} tokens: {share:.0%}, "
            f"at {settings.max_seq_len}: {cost.quadratic_share(settings.max_seq_len):.0%}{then}",
            flush=True,
        )
    log = _log_step if rank == 0 and not settings.quiet else _quiet_log
    runs = [_Run(mode, settings, mesh, topology, dataset, order, vocab, spec, cost) for mode in settings.modes]
    for index in range(settings.total_steps):
        for run_ in runs:
            run_.train_step(index, log)
    for run_ in runs:
        run_.finish()
    results = [run_.result(peak) for run_ in runs]
    if rank == 0:
        for r in results:
            r["peak_gemm_flops_per_process"] = peak
        return results
    return None
