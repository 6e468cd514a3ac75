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
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, LONG, NARROW_COST, SPR, Probe, samples_of
from wrapper_data import mesh_topology

from seqpack.compute.attention import ThdAttention
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import Schedule
from seqpack.thd import group_pad_multiple, pack_sequences
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
        cost=GROUP_COST, prefetch=prefetch,
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


def check_shards(results: list[dict], samples: list[dict]) -> Schedule:
    """Every rank's microbatch of every round is its shard of its group's whole pack, every
    token is delivered once; returns the plan."""
    plan = Schedule.from_arrays(results[0]["plan"])
    plan.validate([int(s["input_ids"].shape[0]) for s in samples])
    assert all(np.array_equal(r["plan"]["assigned"], plan.assigned) for r in results)  # same plan everywhere
    delivered = np.zeros(plan.num_sequences, dtype=np.int64)
    for m in range(plan.num_microbatches):
        for g in plan.round_groups(m):
            ids, start, size = plan.group_ids(g), int(plan.group_start[g]), int(plan.group_size[g])
            if ids.size == 0:
                assert all(results[start + j]["batches"][m]["sample_ids"].tolist() == [-1] for j in range(size))
                continue
            whole = pack_sequences([samples[i] for i in ids], pad_multiple=group_pad_multiple(size, 1), sample_ids=ids)
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
    assert {r["num_loss_tokens"] for r in results} == {pack_sequences(samples).num_loss_tokens}
    return plan


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_gets_its_shard_of_its_group(layout_results, name):
    results = sorted(layout_results[name], key=lambda r: r["plane_rank"])
    samples = _all_samples(dict(LAYOUTS[name])["dp"])
    plan = check_shards(results, samples)
    # Not vacuous: the long sequence on a group of 4, short ones alone, several rounds.
    sizes = plan.per_id(plan.group_size)
    assert samples[0]["input_ids"].shape[0] == LONG and sizes[0] == 4 and (sizes == 1).sum() >= 5
    assert plan.num_microbatches >= 2
    assert len({r["stats"] for r in results}) == 1 and results[0]["stats"][0] == len(samples)


def run_any_size_step() -> dict:
    topo = mesh_topology(LAYOUTS["dp4"])
    data = samples_of(topo.dp_rank, long=180)  # 180 tokens fit 3 ranks (padded to 6: 180 <= 3 x 64)
    steps = wrap_data_iterator(
        iter(data), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, dynamic_cp=True,
        cost=NARROW_COST, scheduler_options={"group_sizes": "any"},
    )  # fmt: skip
    with steps:
        step = next(steps)
        attention = ThdAttention(4, 4, num_kv_heads=2, backend="torch")
        torch.manual_seed(2)
        outputs = []
        for batch in step.microbatches:
            q, k, v = (torch.randn(batch.num_tokens, n, 4, dtype=torch.float64) for n in (4, 2, 2))
            outputs.append(attention(q, k, v, batch).shape[0] == batch.num_tokens)
        return {
            "plane_rank": topo.dp_rank, "plan": step.schedule.to_arrays(), "num_loss_tokens": step.num_loss_tokens,
            "batches": [_batch_view(b) for b in step.microbatches], "ran": all(outputs),
        }  # fmt: skip


def test_any_group_size_runs(dist_pools):
    results = sorted(dist_pools.get(4).run(run_any_size_step), key=lambda r: r["plane_rank"])
    samples = [s for r in range(4) for s in samples_of(r, long=180)]
    plan = check_shards(results, samples)
    assert plan.group_sizes == "any" and 3 in plan.group_size.tolist()  # a group no power of two is
    assert all(r["ran"] for r in results)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_outputs_and_gradients_equal_the_whole_pack(layout_results, name):
    results = sorted(layout_results[name], key=lambda r: r["plane_rank"])
    plan = Schedule.from_arrays(results[0]["plan"])
    samples = _all_samples(plan.dp_size)
    probe = Probe()
    worst, groups = 0.0, 0
    for m in range(plan.num_microbatches):
        for g in plan.round_groups(m):
            ids, start, size = plan.group_ids(g), int(plan.group_start[g]), int(plan.group_size[g])
            if ids.size == 0:
                continue
            whole = pack_sequences([samples[i] for i in ids], pad_multiple=group_pad_multiple(size, 1), sample_ids=ids)
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


# --- TP: rank 0 reads, the broadcast carries each microbatch's group ----------------------------


def run_tp_step() -> dict:
    topo = mesh_topology((("dp", 2), ("tp", 2)))
    data = samples_of(topo.dp_rank, long=100) if topo.tp_rank == 0 else None  # 100 tokens need 2 ranks
    steps = wrap_data_iterator(
        data, topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, dynamic_cp=True, cost=GROUP_COST
    )
    with steps:
        step = next(steps)
        probe = Probe()
        outputs = [probe.loss(batch)[0].numpy() for batch in step.microbatches]  # runs on each batch's group
        return {
            "rank": dist.get_rank(), "tp_rank": topo.tp_rank, "dp_rank": topo.dp_rank,
            "batches": [_batch_view(b) for b in step.microbatches], "outputs": outputs,
            "fingerprint": step.schedule_fingerprint, "count": step.num_loss_tokens,
        }  # fmt: skip


def test_tp_receivers_get_the_batches_and_their_own_groups(dist_pools):
    results = dist_pools.get(4).run(run_tp_step)
    assert len({(r["fingerprint"], r["count"]) for r in results}) == 1
    by_place = {(r["dp_rank"], r["tp_rank"]): r for r in results}
    grouped = 0
    for d in range(2):
        source, receiver = by_place[(d, 0)], by_place[(d, 1)]
        assert len(source["batches"]) == len(receiver["batches"]) >= 2
        for a, b, out_a, out_b in zip(source["batches"], receiver["batches"], source["outputs"], receiver["outputs"],
                                      strict=True):  # fmt: skip
            for field in (*FIELDS, "cp_size", "cp_rank", "max_seqlen", "num_loss_tokens"):
                assert np.array_equal(a[field], b[field]), field
            assert np.array_equal(out_a, out_b)
            if a["cp_size"] > 1:  # each TP lane runs on its own plane's group of the same block
                grouped += 1
                assert b["group_ranks"] == [rank + 1 for rank in a["group_ranks"]]
    assert grouped >= 2


# --- PP: every stage runs the plan on its own plane's groups; middle stages get the layout --------

PP_LAYOUTS = {"dp2pp2": (("pp", 2), ("dp", 2)), "pp3": (("pp", 3),)}


def run_pp_step(name: str) -> dict:
    topo = mesh_topology(PP_LAYOUTS[name])
    reads = topo.is_first_stage or topo.is_last_stage
    data = samples_of(topo.dp_rank, long=100 if topo.dp_size == 2 else 60) if reads else None
    steps = wrap_data_iterator(
        data, topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, dynamic_cp=True, cost=GROUP_COST
    )
    with steps:
        step = next(steps)
        views = [_batch_view(b) if b.input_ids is not None else {"tokens": None, **_layout_view(b)} for b in
                 step.microbatches]  # fmt: skip
        return {"pp": topo.pp_rank, "dp": topo.dp_rank, "batches": views, "fingerprint": step.schedule_fingerprint}


def _layout_view(batch) -> dict:
    group = batch.cp_group
    return {
        "cu_seqlens_padded": batch.cu_seqlens_padded.numpy().copy(), "sample_ids": batch.sample_ids.numpy().copy(),
        "cp_size": batch.cp_size, "cp_rank": batch.cp_rank,
        "group_ranks": None if group is None else dist.get_process_group_ranks(group),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(PP_LAYOUTS))
def test_pipeline_stages_run_the_plan_on_their_own_groups(dist_pools, name):
    layout = PP_LAYOUTS[name]
    world = int(np.prod([size for _, size in layout]))
    results = dist_pools.get(world).run(run_pp_step, name)
    assert len({r["fingerprint"] for r in results}) == 1
    first = {r["dp"]: r for r in results if r["pp"] == 0}
    for r in results:
        mine, theirs = r["batches"], first[r["dp"]]["batches"]
        assert len(mine) == len(theirs) >= 1
        for a, b in zip(theirs, mine, strict=True):
            for field in ("cu_seqlens_padded", "sample_ids", "cp_size", "cp_rank"):
                assert np.array_equal(a[field], b[field]), field
            assert ("tokens" in b) == (name == "pp3" and r["pp"] == 1)  # only a middle stage has no tokens
            if a["cp_size"] > 1:  # the same block on this stage's plane (2 ranks per stage)
                assert b["group_ranks"] == [rank + 2 * r["pp"] for rank in a["group_ranks"]]
    if name == "dp2pp2":
        assert any(b["cp_size"] == 2 for r in results for b in r["batches"])
    else:
        assert any("tokens" in b for r in results for b in r["batches"])  # the middle stage's layout


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
