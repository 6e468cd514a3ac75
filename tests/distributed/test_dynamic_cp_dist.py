"""Dynamic CP through the wrapper on gloo (fp64, CPU): dp=4 x cp=1 and dp=2 x cp=2.

DP rank 0 reads one sequence of 3.5x a rank's capacity among many short ones
(tests/distributed/dynamic_cp_data.py). Checked against single-process references:

- every rank's microbatch of every round is exactly its DualChunkSwap shard of its group's
  whole pack (``pack_sequences`` + ``shard_for_cp``), with its group's process group; every
  token of every sequence is delivered exactly once across the shards;
- attention and Mamba2 outputs and parameter gradients of every microbatch, run on the
  batch's own ``cp_group``, equal the whole pack's on one process;
- a TinyHybridLM step's gradient (SUM over the dp x cp ranks) equals the unpacked one-process
  gradient of the step's token mean;
- steps resume exactly from a state dict, and prefetch changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, LONG, SPR, Probe, samples_of
from wrapper_data import mesh_topology

from seqpack.compute.attention import ThdAttention
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.loader import wrap_data_iterator
from seqpack.schedulers.dynamic_cp import DynamicCpSchedule, cp_pad_multiple
from seqpack.thd import pack_sequences
from seqpack.thd.cp import shard_for_cp, unshard_from_cp

TOL = 1e-10
FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask", "cu_seqlens",
          "cu_seqlens_padded", "sample_ids")  # fmt: skip
TINY = TinyConfig(vocab_size=64, d_model=32, pattern="AMA", num_heads=4, num_kv_heads=2, d_state=8, mamba_headdim=8)


def _steps(name: str, *, steps: int = 1, prefetch: int = 1, data_steps: int | None = None):
    topo = mesh_topology(LAYOUTS[name])
    data = samples_of(topo.dp_rank, steps=data_steps or steps)
    it = wrap_data_iterator(
        iter(data), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, dynamic_cp=True,
        group_cost=GROUP_COST, prefetch=prefetch,
    )  # fmt: skip
    return topo, it


def _batch_view(batch) -> dict:
    view = {name: getattr(batch, name).numpy().copy() for name in FIELDS}
    group = batch.cp_group
    view.update(
        max_seqlen=batch.max_seqlen, cp_size=batch.cp_size, cp_rank=batch.cp_rank,
        num_loss_tokens=batch.num_loss_tokens,
        group_ranks=None if group is None else dist.get_process_group_ranks(group),
    )  # fmt: skip
    return view


def run_layout_step(name: str) -> dict:
    topo, steps = _steps(name)
    with steps:
        step = next(steps)
        out = {
            "plane_rank": topo.dp_rank * topo.cp_size + topo.cp_rank,
            "plan": step.schedule.to_arrays(),
            "batches": [_batch_view(b) for b in step.microbatches],
            "num_loss_tokens": step.num_loss_tokens,
            "stats": (step.stats.num_sequences, step.stats.real_tokens, step.stats.predicted_step_time),
            "exchange": step.exchange_bytes,
        }
        # Compute on every microbatch with its own group (a module without one).
        probe = Probe()
        out["probe"] = [probe.loss(batch) for batch in step.microbatches]
        out["probe"] = [(o.numpy(), g) for o, g in out["probe"]]
        out["te_calls"] = te_group_calls(step.microbatches)
    return out


class _RecordingTe(torch.nn.Module):
    """Stands in for TE's DotProductAttention: records set_context_parallel_group calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def set_context_parallel_group(self, group, ranks, stream, comm_type) -> None:
        self.calls.append((None if group is None else ranks, comm_type))


def te_group_calls(batches) -> list:
    """The TE group switches one module makes over the step's microbatches, twice."""
    attention = ThdAttention(4, 4, num_kv_heads=2, backend="torch")
    attention.te_attention = _RecordingTe()
    for batch in [*batches, *batches]:
        group, size, _ = attention.cp_of(batch)
        attention._use_te_group(group, size)
    return attention.te_attention.calls


def _all_samples(dp: int) -> list[dict[str, torch.Tensor]]:
    return [s for r in range(dp) for s in samples_of(r)]


@pytest.fixture(scope="module")
def layout_results(dist_pools):
    return {name: dist_pools.get(4).run(run_layout_step, name) for name in LAYOUTS}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_gets_its_shard_of_its_group(layout_results, name):
    results = sorted(layout_results[name], key=lambda r: r["plane_rank"])
    plan = DynamicCpSchedule.from_arrays(results[0]["plan"])
    dp = plan.dp_size
    samples = _all_samples(dp)
    plan.validate([int(s["input_ids"].shape[0]) for s in samples])
    assert all(np.array_equal(r["plan"]["assigned"], plan.assigned) for r in results)  # same plan everywhere
    delivered = np.zeros(plan.num_sequences, dtype=np.int64)
    for m in range(plan.num_rounds):
        for g in plan.round_groups(m):
            ids, start, size = plan.group_ids(g), int(plan.group_start[g]), int(plan.group_size[g])
            if ids.size == 0:
                assert all(results[start + j]["batches"][m]["sample_ids"].tolist() == [-1] for j in range(size))
                continue
            whole = pack_sequences([samples[i] for i in ids], pad_multiple=cp_pad_multiple(size, 1), sample_ids=ids)
            for j in range(size):
                got = results[start + j]["batches"][m]
                want = shard_for_cp(whole, size, j)
                for field in FIELDS:
                    assert np.array_equal(got[field], getattr(want, field).numpy()), (m, g, j, field)
                assert (got["cp_size"], got["cp_rank"], got["max_seqlen"]) == (size, j, want.max_seqlen)
                assert got["num_loss_tokens"] == whole.num_loss_tokens
                assert got["group_ranks"] == (None if size == 1 else list(range(start, start + size)))
                real = ~got["padding_mask"]
                np.add.at(delivered, got["sample_ids"][got["seq_idx"][real]], 1)
    lengths = np.array([s["input_ids"].shape[0] for s in samples])
    assert np.array_equal(delivered, lengths)  # every token exactly once across all shards
    # Not vacuous: the long sequence on a group of 4, short ones alone, several rounds.
    _, _, sizes = plan.placement()
    assert lengths[0] == LONG and sizes[0] == 4 and (sizes == 1).sum() >= 5 and plan.num_rounds >= 2
    assert {r["num_loss_tokens"] for r in results} == {pack_sequences(samples).num_loss_tokens}
    assert len({r["stats"] for r in results}) == 1 and results[0]["stats"][0] == len(samples)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_outputs_and_gradients_equal_the_whole_pack(layout_results, name):
    results = sorted(layout_results[name], key=lambda r: r["plane_rank"])
    plan = DynamicCpSchedule.from_arrays(results[0]["plan"])
    samples = _all_samples(plan.dp_size)
    probe = Probe()
    worst, groups = 0.0, 0
    for m in range(plan.num_rounds):
        for g in plan.round_groups(m):
            ids, start, size = plan.group_ids(g), int(plan.group_start[g]), int(plan.group_size[g])
            if ids.size == 0:
                continue
            whole = pack_sequences([samples[i] for i in ids], pad_multiple=cp_pad_multiple(size, 1), sample_ids=ids)
            out, grads = probe.loss(whole)
            parts = [torch.from_numpy(results[start + j]["probe"][m][0]) for j in range(size)]
            got = unshard_from_cp(parts, whole.cu_seqlens_padded, size)
            worst = max(worst, float((got - out).abs().max()))
            for key, grad in grads.items():
                summed = sum(results[start + j]["probe"][m][1][key] for j in range(size))
                worst = max(worst, float(np.abs(summed - grad).max()))
            groups += size > 1
    print(f"{name}: {groups} multi-rank groups, max |diff| of outputs and gradients {worst:.2e}")
    assert groups >= 1 and worst < TOL, worst


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_te_cp_group_is_set_only_when_it_changes(layout_results, name):
    for result in layout_results[name]:
        groups = [b["group_ranks"] for b in result["batches"]] * 2
        expected, current = [], None
        for ranks in groups:
            if ranks != current:
                expected.append((ranks, "p2p"))
                current = ranks
        assert result["te_calls"] == expected
    assert any(len(r["te_calls"]) >= 2 for r in layout_results[name])  # some rank switched groups


# --- the loss contract: a tiny model's step gradient ------------------------------------------


def run_tiny_step(name: str) -> dict:
    topo, steps = _steps(name)
    with steps:
        step = next(steps)
        torch.manual_seed(0)
        model = TinyHybridLM(TINY).double()  # no cp_group: every batch carries its own
        for batch in step.microbatches:
            loss_sum, _ = model.loss_sum(batch)
            (loss_sum / step.num_loss_tokens).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for grad in grads.values():  # SUM over the dp x cp ranks: every token ran on exactly one
        dist.all_reduce(grad)
    sizes = sorted({b.cp_size for b in step.microbatches})
    return {"grads": {k: v.numpy() for k, v in grads.items()}, "count": step.num_loss_tokens, "sizes": sizes}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_tiny_model_gradient_equals_the_unpacked_one(dist_pools, name):
    results = dist_pools.get(4).run(run_tiny_step, name)
    dp = dict(LAYOUTS[name])["dp"]
    torch.manual_seed(0)
    model = TinyHybridLM(TINY).double()
    sums = [model.loss_sum(pack_sequences([s])) for s in _all_samples(dp)]
    count = int(sum(int(c) for _, c in sums))
    (sum(total for total, _ in sums) / count).backward()
    assert results[0]["count"] == count and 4 in {s for r in results for s in r["sizes"]}
    worst = max(float(np.abs(results[0]["grads"][n] - p.grad.numpy()).max()) for n, p in model.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in model.parameters())
    print(f"{name}: {count} loss tokens, max |grad diff| {worst:.2e} (max |grad| {scale:.2e})")
    assert scale > 1e-3 and worst < TOL, worst


# --- resume and prefetch --------------------------------------------------------------------------


def _digest(step) -> list:
    return [(b.sample_ids.tolist(), b.input_ids.tolist(), b.cp_size, b.cp_rank) for b in step.microbatches]


def run_resume(name: str, prefetch: int) -> dict:
    _, steps = _steps(name, steps=3, prefetch=prefetch)
    with steps:
        first = next(steps)
        state = steps.state_dict()
        rest = [_digest(s) for s in steps]
    _, again = _steps(name, steps=3, prefetch=prefetch)
    with again:
        again.load_state_dict(state)
        resumed = [_digest(s) for s in again]
    return {"all": [_digest(first), *rest], "resumed": resumed}


@pytest.mark.parametrize("name", ["dp2cp2"])
def test_resume_is_exact_and_prefetch_changes_nothing(dist_pools, name):
    plain = dist_pools.get(4).run(run_resume, name, 0)
    ahead = dist_pools.get(4).run(run_resume, name, 2)
    for a, b in zip(plain, ahead, strict=True):
        assert len(a["all"]) == 3 and a["all"] == b["all"]
        assert a["resumed"] == a["all"][1:] == b["resumed"]
    assert any(cp > 1 for step in plain[0]["all"] for _, _, cp, _ in step)
