"""seqpack.interop.torchtitan on one process: the dataloader yields each step's microbatches in
torchtitan's form, refuses a step of another count, and resumes exactly from a state saved
between or inside steps; ``install`` swaps the trainer's and its checkpointer's dataloader.
The documented snippet of docs/integrations.md is executed here. Meshes on 2 ranks:
tests/distributed/test_torchtitan_dist.py."""

from __future__ import annotations

import pickle
import re
import types
from pathlib import Path

import pytest
import torch

from seqpack import wrap_data_iterator
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.interop import torchtitan as tt
from seqpack.topology import Topology

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def samples(count: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        n = int(torch.randint(4, 60, (1,), generator=g))
        yield {"input_ids": torch.arange(n) + 1000 * i, "labels": torch.arange(n) + 1000 * i + 1}


def steps(count: int = 48, microbatches: int = 3):
    return wrap_data_iterator(
        samples(count),
        Topology.single(),
        samples_per_rank=8,
        max_tokens_per_rank=256,
        scheduler_options={"num_microbatches": microbatches},
        prefetch=0,
    )


@pytest.mark.slow
def test_each_optimizer_step_gets_one_seqpack_step_in_torchtitan_form():
    reference = [[tt.to_torchtitan(b) for b in s.microbatches] for s in steps()]
    got = list(tt.SeqpackDataLoader(steps(), 3))
    assert len(reference) == 6 and len(got) == 18
    for (inputs, labels), (want_inputs, want_labels) in zip(got, [m for s in reference for m in s], strict=True):
        assert inputs.keys() == {"input", "positions"} and inputs["input"].shape == labels.shape
        assert inputs["input"].dim() == 2 and inputs["input"].shape[0] == 1
        assert torch.equal(inputs["input"], want_inputs["input"]) and torch.equal(labels, want_labels)
        assert torch.equal(inputs["positions"], want_inputs["positions"])
    # torchtitan's normaliser, labels != -100 summed over the step's microbatches, is the step's count
    for i, s in enumerate(steps()):
        assert sum(int((labels != -100).sum()) for _, labels in got[3 * i : 3 * i + 3]) == s.num_loss_tokens


def test_a_step_of_another_count_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"seqpack step 0 has 3 microbatches but torchtitan's optimizer step takes 2"):
        next(iter(tt.SeqpackDataLoader(steps(), 2)))
    with pytest.raises(SeqpackTypeError, match="PackingIterator"):
        tt.SeqpackDataLoader(iter([]), 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("taken", [0, 3, 4, 7, 18])
@pytest.mark.slow
def test_state_dict_round_trip_between_and_inside_steps(taken):
    whole = [labels for _, labels in tt.SeqpackDataLoader(steps(), 3)]
    loader = tt.SeqpackDataLoader(steps(), 3)
    it = iter(loader)
    first = [next(it)[1] for _ in range(taken)]
    state = loader.state_dict()
    assert set(state) == {"dp_rank_0", "world_size"} and isinstance(state["dp_rank_0"], bytes)
    resumed = tt.SeqpackDataLoader(steps(), 3)
    resumed.load_state_dict(state)
    rest = [labels for _, labels in resumed]
    assert len(first) + len(rest) == len(whole) == 18
    assert all(torch.equal(a, b) for a, b in zip(first + rest, whole, strict=True))


def test_an_empty_state_loads_and_a_foreign_one_is_refused():
    loader = tt.SeqpackDataLoader(steps(), 3)
    loader.load_state_dict({})
    with pytest.raises(ResumeError, match="no 'dp_rank_0'"):
        loader.load_state_dict({"dp_rank_3": b"", "world_size": 4})


def _saved(taken: int = 1) -> dict:
    """A loader's state after ``taken`` microbatches, unpickled: the fields a checkpoint holds."""
    loader = tt.SeqpackDataLoader(steps(), 3)
    it = iter(loader)
    for _ in range(taken):
        next(it)
    return pickle.loads(loader.state_dict()["dp_rank_0"])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"microbatches_handed": -1}, r"microbatches_handed=-1 must be an integer in \[0, 3\]"),
        ({"microbatches_handed": 4}, r"microbatches_handed=4 must be an integer in \[0, 3\]"),
        ({"microbatches_handed": 2.7}, r"microbatches_handed=2.7 must be an integer"),
        ({"microbatches_handed": True}, r"microbatches_handed=True must be an integer"),
        ({"microbatches_handed": None}, r"microbatches_handed=None must be an integer"),
    ],
)
def test_a_loader_state_out_of_range_is_refused_by_key_and_value(change, words):
    state = _saved() | change
    loader = tt.SeqpackDataLoader(steps(), 3)
    with pytest.raises(ResumeError, match=words):
        loader.load_state_dict({"dp_rank_0": pickle.dumps(state), "world_size": 1})


@pytest.mark.parametrize(
    ("blob", "words"),
    [
        (pickle.dumps({"microbatches_handed": 1}), r"must hold \['seqpack', 'microbatches_handed'\], got \['micro"),
        (pickle.dumps([1, 2]), r"must hold \['seqpack', 'microbatches_handed'\], got list"),
        (b"not a pickle", r"'dp_rank_0' is not a pickled SeqpackDataLoader state: UnpicklingError"),
        ({"seqpack": {}}, r"'dp_rank_0' is not a pickled SeqpackDataLoader state: TypeError"),
    ],
    ids=["missing-key", "not-a-dict", "not-a-pickle", "not-bytes"],
)
def test_a_corrupt_loader_state_is_a_resume_error_naming_what_is_wrong(blob, words):
    loader = tt.SeqpackDataLoader(steps(), 3)
    with pytest.raises(ResumeError, match=words):
        loader.load_state_dict({"dp_rank_0": blob, "world_size": 1})
    with pytest.raises(ResumeError, match="must be a mapping, got list"):
        loader.load_state_dict([("dp_rank_0", blob)])  # type: ignore[arg-type]


def test_a_state_at_the_end_of_a_step_resumes_at_the_next():
    # microbatches_handed may be the whole step (the boundary the check keeps): that step is skipped.
    whole = [labels for _, labels in tt.SeqpackDataLoader(steps(), 3)]
    resumed = tt.SeqpackDataLoader(steps(), 3)
    resumed.load_state_dict({"dp_rank_0": pickle.dumps(_saved(1) | {"microbatches_handed": 3}), "world_size": 1})
    rest = [labels for _, labels in resumed]
    assert len(rest) == len(whole) - 3 and all(torch.equal(a, b) for a, b in zip(rest, whole[3:], strict=True))


def test_install_replaces_the_trainers_and_checkpointers_dataloader():
    trainer = types.SimpleNamespace(
        gradient_accumulation_steps=3,
        num_pipeline_parallel_microbatches=1,
        dataloader=object(),
        checkpointer=types.SimpleNamespace(states={"dataloader": object(), "model": 1}),
    )
    loader = tt.install(trainer, steps())
    assert trainer.dataloader is loader and trainer.checkpointer.states["dataloader"] is loader
    assert loader.microbatches_per_step == 3


@pytest.mark.parametrize(
    ("trainer", "words"),
    [
        (None, "trainer must be torchtitan's Trainer .* got NoneType"),
        (types.SimpleNamespace(gradient_accumulation_steps=3), "got SimpleNamespace"),
        (
            types.SimpleNamespace(gradient_accumulation_steps=2.5, num_pipeline_parallel_microbatches=1),
            r"trainer.gradient_accumulation_steps must be a positive integer, got 2.5",
        ),
        (
            types.SimpleNamespace(gradient_accumulation_steps=2, num_pipeline_parallel_microbatches=True),
            r"trainer.num_pipeline_parallel_microbatches must be a positive integer, got True",
        ),
    ],
)
def test_install_refuses_what_is_not_a_trainer_with_integer_counts(trainer, words):
    with pytest.raises(SeqpackTypeError, match=words):
        tt.install(trainer, steps())


def test_to_torchtitan_refuses_what_is_not_a_packed_batch():
    with pytest.raises(SeqpackTypeError, match="PackedBatch .*got NoneType"):
        tt.to_torchtitan(None)  # type: ignore[arg-type]


def test_topology_without_a_process_group_is_one_rank():
    class Dims:
        def get_optional_mesh(self, axis):
            return None

    assert tt.topology(Dims()) == Topology.single()
    with pytest.raises(SeqpackTypeError, match="ParallelDims"):
        tt.topology(object())


def test_topology_refuses_a_get_mesh_that_returns_no_mesh():
    class Dims:
        def get_optional_mesh(self, axis):
            return object()  # "enabled"

        def get_mesh(self, names):
            return None

    with pytest.raises(SeqpackTypeError, match=r"get_mesh\('batch'\) returned a NoneType, not a DeviceMesh"):
        tt.topology(Dims())


def test_the_documented_snippet_runs():
    # docs/integrations.md's torchtitan snippet, executed with a stand-in trainer.
    text = DOCS.read_text()
    section = text[text.index("## torchtitan") : text.index("## Megatron-LM")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert code, "the torchtitan section has no python snippet"

    class Dims:
        def get_optional_mesh(self, axis):
            return None

    trainer = types.SimpleNamespace(
        gradient_accumulation_steps=3,
        num_pipeline_parallel_microbatches=1,
        parallel_dims=Dims(),
        dataloader=None,
        checkpointer=types.SimpleNamespace(states={"dataloader": None}),
    )
    scope = {"trainer": trainer, "my_samples": samples(48), "max_tokens": 256, "samples_per_rank": 8}
    exec(code[0], scope)  # noqa: S102
    batches = list(trainer.dataloader)
    assert len(batches) == 18 and batches[0][0]["input"].shape[0] == 1
