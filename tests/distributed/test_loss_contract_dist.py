"""The loss contract, end to end: the gradient of a packed distributed step equals the gradient
of the same global batch computed unpacked in one process.

On gloo ranks (fp64), wrap_data_iterator with the balanced scheduler and several microbatches
per step feeds a tiny model; every rank adds ``sum(token losses) / Step.num_loss_tokens`` of
its microbatches (its CP shard of them) and backpropagates; the gradients are then summed over
the dp x cp ranks (or averaged by DDP with the loss multiplied by the ranks it averages over).
The reference, in the test process: every sequence of the step run alone, the token mean over
all supervised tokens of the step. Cases: TinyHybridLM (attention + Mamba2) at dp=2 and
dp=2 x cp=2, an HF tiny Llama at dp=2 under real DDP; then the same contract through HF's own
loss (``num_items_in_batch``) from a ``datasets.Dataset`` with HF-style labels
(``label_format="unshifted"``), and that data refused under the default ``"shifted"``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from wrapper_data import mesh_topology

from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.loader import wrap_data_iterator
from seqpack.thd import IGNORE_INDEX, pack_sequences

TINY = TinyConfig(vocab_size=64, d_model=32, pattern="AMA", num_heads=4, num_kv_heads=2, d_state=8, mamba_headdim=8)
HF_VOCAB = 97
SPR = 8  # samples per DP rank per step
TOL = 1e-10
LAYOUTS = {"dp2": (("dp", 2),), "dp2cp2": (("dp", 2), ("cp", 2))}


def samples_of(dp_rank: int, vocab: int, seed: int = 5) -> list[dict[str, torch.Tensor]]:
    """DP rank ``dp_rank``'s samples: next-token labels (seqpack's form), -100 on a prompt."""
    rng = np.random.default_rng([seed, dp_rank])
    out = []
    for n in rng.integers(2, 60, SPR):
        ids = torch.from_numpy(rng.integers(0, vocab, int(n)))
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:-1] = ids[1:]
        labels[: int(rng.integers(0, n // 2 + 1))] = IGNORE_INDEX  # the prompt
        out.append({"input_ids": ids, "labels": labels})
    return out


def _tiny_model(cp_group=None) -> TinyHybridLM:
    torch.manual_seed(0)
    return TinyHybridLM(TINY, cp_group=cp_group).double()


def _hf_llama(transformers):
    config = transformers.LlamaConfig(
        vocab_size=HF_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).double()


def _hf_sum(model, batch) -> torch.Tensor:
    """Sum of token losses of one packed microbatch through ``model(**to_hf(batch))``, in fp64
    (HF's own loss upcasts logits to float32 only; its fp64 logits are scored here)."""
    from seqpack.interop.hf import to_hf

    kwargs = to_hf(batch)
    targets = kwargs.pop("shift_labels")[0]
    kwargs.pop("labels")
    logits = model(**kwargs).logits[0]  # [T, vocab], fp64
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


def run_packed_step(layout, model_kind: str) -> dict:
    """One packed step on this rank; the dp x cp gradient (rank 0 returns it)."""
    topo = mesh_topology(layout)
    reads = topo.tp_rank == 0
    vocab = TINY.vocab_size if model_kind == "tiny" else HF_VOCAB
    steps = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, vocab)) if reads else None,
        topo,
        samples_per_rank=SPR,
        max_tokens_per_rank=64 // topo.cp_size,  # a microbatch holds 64 tokens before the CP split
        scheduler="balanced",
    )
    step = next(steps)
    world = topo.dp_size * topo.cp_size  # the ranks gradients are reduced over
    if model_kind == "tiny":
        model = _tiny_model(topo.group("cp") if topo.cp_size > 1 else None)
        for batch in step.microbatches:
            loss_sum, _ = model.loss_sum(batch)  # this rank's CP shard
            (loss_sum / step.num_loss_tokens).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        for grad in grads.values():  # the recipe without DDP: a SUM over dp x cp
            dist.all_reduce(grad)
    else:  # HF Llama under DDP, which averages over the dp ranks: multiply the loss by them
        transformers = pytest.importorskip("transformers")
        model = torch.nn.parallel.DistributedDataParallel(_hf_llama(transformers), process_group=topo.group("dp"))
        last = step.num_microbatches - 1
        for m, batch in enumerate(step.microbatches):
            with model.no_sync() if m < last else torch.enable_grad():
                (_hf_sum(model, batch) * world / step.num_loss_tokens).backward()
        grads = {name.removeprefix("module."): p.grad.clone() for name, p in model.named_parameters()}
    return {
        "num_loss_tokens": step.num_loss_tokens,
        "mb_counts": [b.num_loss_tokens for b in step.microbatches],
        "M": step.num_microbatches,
        "assigned": sorted(int(g) for row in step.schedule.assignment for ids in row for g in ids.tolist()),
        "num_sequences": step.schedule.num_sequences,
        "grads": {k: v.numpy() for k, v in grads.items()} if dist.get_rank() == 0 else None,
        "grad_norm": float(torch.sqrt(sum((g * g).sum() for g in grads.values()))),
    }


def _reference(model_kind: str, dp: int) -> tuple[dict[str, np.ndarray], int]:
    """The step's gradient unpacked: each sequence alone, token mean over all of them."""
    samples = [s for r in range(dp) for s in samples_of(r, TINY.vocab_size if model_kind == "tiny" else HF_VOCAB)]
    if model_kind == "tiny":
        model = _tiny_model()
        sums = [model.loss_sum(pack_sequences([s])) for s in samples]
    else:
        model = _hf_llama(pytest.importorskip("transformers"))
        sums = []
        for s in samples:
            logits = model(input_ids=s["input_ids"][None], use_cache=False).logits[0]
            loss = F.cross_entropy(logits, s["labels"], ignore_index=IGNORE_INDEX, reduction="sum")
            sums.append((loss, (s["labels"] != IGNORE_INDEX).sum()))
    count = int(sum(int(c) for _, c in sums))
    (sum(total for total, _ in sums) / count).backward()
    return {name: p.grad.numpy() for name, p in model.named_parameters()}, count


CASES = [("tiny", "dp2"), ("tiny", "dp2cp2"), ("hf_llama", "dp2")]


@pytest.mark.parametrize("model_kind, layout_name", CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_packed_distributed_gradient_equals_the_unpacked_one(dist_pools, model_kind, layout_name):
    if model_kind == "hf_llama":
        pytest.importorskip("transformers")
    layout = LAYOUTS[layout_name]
    world = int(np.prod([size for _, size in layout]))
    dp = dict(layout)["dp"]
    results = dist_pools.get(world).run(run_packed_step, layout, model_kind)
    first = results[0]
    # Not vacuous: several microbatches, every sequence of the step trained, counts everywhere.
    assert first["M"] >= 3 and first["assigned"] == list(range(dp * SPR)) == list(range(first["num_sequences"]))
    assert {r["num_loss_tokens"] for r in results} == {first["num_loss_tokens"]}
    expected, count = _reference(model_kind, dp)
    assert first["num_loss_tokens"] == count
    worst = max(float(np.abs(first["grads"][name] - grad).max()) for name, grad in expected.items())
    assert set(first["grads"]) == set(expected)
    assert max(abs(r["grad_norm"] - first["grad_norm"]) for r in results) < TOL  # every rank holds the same
    scale = max(float(np.abs(grad).max()) for grad in expected.values())
    print(
        f"{model_kind} {layout_name}: {first['M']} microbatches, {count} loss tokens, max |grad diff| {worst:.2e} "
        f"(max |grad| {scale:.2e})"
    )
    assert scale > 1e-3 and worst < TOL


# --- HF's own loss from a datasets.Dataset with HF-style labels ---------------------------------


def hf_rows(dp_rank: int, answer: tuple[int, int], seed: int = 9) -> dict[str, list[list[int]]]:
    """A rank's rows as a tokenized SFT dataset has them: labels copy input_ids, -100 on the prompt."""
    rng = np.random.default_rng([seed, dp_rank])
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    for _ in range(SPR):
        prompt, reply = int(rng.integers(1, 20)), int(rng.integers(*answer))
        ids = rng.integers(0, HF_VOCAB, prompt + reply).tolist()
        rows["input_ids"].append(ids)
        rows["labels"].append([IGNORE_INDEX] * prompt + ids[prompt:])
    return rows


def run_hf_dataset_step(answer: tuple[int, int], label_format: str | None) -> dict:
    import datasets
    import transformers

    from seqpack.errors import SampleError, StepFailed
    from seqpack.interop.hf import to_hf

    topo = mesh_topology((("dp", 2),))
    data = datasets.Dataset.from_dict(hf_rows(topo.dp_rank, answer))
    options = {} if label_format is None else {"label_format": label_format}
    steps = wrap_data_iterator(
        data, topo, samples_per_rank=SPR, max_tokens_per_rank=64, scheduler="balanced", **options
    )
    try:
        step = next(steps)
    except StepFailed as exc:
        return {
            "error": str(exc),
            "cause": type(exc.__cause__).__name__,
            "sample_error": isinstance(exc.__cause__, SampleError),
        }
    model = _hf_llama(transformers).float()
    with torch.no_grad():
        loss = sum(model(**to_hf(b, num_items_in_batch=step.num_loss_tokens)).loss for b in step.microbatches)
    dist.all_reduce(loss)  # the step's per-token loss: every replica's share
    return {"error": None, "loss": float(loss), "num_loss_tokens": step.num_loss_tokens, "M": step.num_microbatches}


def test_hf_labels_from_a_dataset_through_the_wrapper_give_the_unpacked_token_mean_loss(dist_pools):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    results = dist_pools.get(2).run(run_hf_dataset_step, (1, 30), "unshifted")
    assert all(r["error"] is None for r in results), results
    assert len({r["loss"] for r in results}) == 1 and results[0]["M"] >= 2
    model = _hf_llama(transformers).float()
    losses, counts = [], []
    with torch.no_grad():
        for r in range(2):
            rows = hf_rows(r, (1, 30))
            for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True):
                out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), use_cache=False)
                n = sum(1 for v in labels[1:] if v != IGNORE_INDEX)  # HF's shift: label t + 1 at token t
                losses.append(float(out.loss) * n)
                counts.append(n)
    reference = sum(losses) / sum(counts)
    diff = abs(results[0]["loss"] - reference)
    print(
        f"HF Llama dp=2 from datasets.Dataset: packed loss {results[0]['loss']:.8f}, unpacked {reference:.8f}, "
        f"diff {diff:.1e}, {results[0]['num_loss_tokens']} loss tokens"
    )
    assert results[0]["num_loss_tokens"] == sum(counts)
    assert diff < 1e-5


@pytest.mark.parametrize(
    "answer, per_sample", [((10, 30), True), ((1, 7), False)], ids=["long-answers", "short-answers"]
)
def test_hf_labels_under_the_default_shifted_are_refused_on_every_rank(dist_pools, answer, per_sample):
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    results = dist_pools.get(2).run(run_hf_dataset_step, answer, None)
    assert all(r["error"] is not None and "label_format='unshifted'" in r["error"] for r in results), results
    assert len({r["error"] for r in results}) == 1  # the same error on every rank
    if per_sample:  # a sample's own check: its rank holds the SampleError
        assert "of this rank's data" in results[0]["error"] and any(r["sample_error"] for r in results)
    else:  # answers under 8 tokens: the step's sums, decided alike on every rank
        assert "the samples of every DP rank" in results[0]["error"] and all(r["sample_error"] for r in results)
