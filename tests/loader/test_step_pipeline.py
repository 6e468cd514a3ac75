"""A step's pipeline (docs/wrapper.md, "A step's pipeline"): calibration is data a step takes
in and gives back, and a step passes iterator -> producer -> phases -> step."""

import dataclasses
import importlib

import pytest
from test_import_graph import import_graph
from wrapper_data import items

from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel, default_cost_model
from seqpack.loader import wrap_data_iterator
from seqpack.loader.calibration import StepInput
from seqpack.topology import Topology

TRUTH = CostModel(1e-4, 1e-7, 0.01)


def _wrap(**kwargs):
    kwargs.setdefault("prefetch", 0)
    return wrap_data_iterator(
        items(3, 0, 200), Topology.single(), samples_per_rank=12, max_tokens_per_rank=64, pad_multiple=4, **kwargs
    )


def _times(step):
    out = []
    for batch in step.microbatches:
        padded = (batch.cu_seqlens_padded[1:] - batch.cu_seqlens_padded[:-1]).tolist()
        out.append(TRUTH.microbatch_cost(padded if batch.sample_ids[0] >= 0 else []))
    return out


@pytest.mark.slow
def test_without_calibrate_a_step_takes_nothing_and_gives_nothing_back():
    it = _wrap()
    state = it._calibration
    assert state.take(0) == StepInput() and state.recorder is None
    step = next(it)
    assert state.absorb(None, StepInput(), None) is None
    assert not step.stats.calibrated and step.stats.cost_model == it.stats_cost


def test_a_step_takes_the_model_and_words_and_absorbing_the_words_gives_the_measurement():
    it = _wrap(calibrate=CostCalibrator(default_cost_model(), min_points=8))
    state = it._calibration
    seen = []
    for step in it:
        taken = state.take(step.step + 1)  # what the next step will take (take has no side effect here)
        assert taken.model == it.calibrator.model and taken.fitted == it.calibrator.fitted
        assert taken.words is not None and taken.blank is not None and taken.error is None
        assert taken.blank.shape == (state.ledger.width(),)  # one ABSENT word per pending microbatch
        seen.append((step.stats.cost_model, step.stats.measured_step))
        step.record_times(_times(step))
    assert seen[0] == (default_cost_model(), None)
    assert seen[-1][1] == len(seen) - 2  # the last measurement the stats carry: the step before
    assert it.last_measurement is not None and it.last_measurement.step == len(seen) - 1


def test_the_fingerprint_covers_the_model_only_when_there_is_one():
    step = next(_wrap())
    plan = step.schedule
    assert StepInput().fingerprint(plan) == plan.fingerprint()
    one, other = StepInput(model=TRUTH), StepInput(model=dataclasses.replace(TRUTH, constant=0.02))
    assert len({one.fingerprint(plan), other.fingerprint(plan), plan.fingerprint()}) == 3
    assert one.fingerprint(plan) == StepInput(model=TRUTH, fitted=True).fingerprint(plan)


@pytest.mark.slow
def test_the_backbone_is_iterator_producer_phases_step():
    graph = import_graph()
    loader = {name for name in graph if name.startswith("seqpack.loader.")}
    # The thread runner knows the hand-over type only; the producer does not know the runner.
    assert graph["seqpack.loader.prefetch"] & loader == {"seqpack.loader.step"}
    assert not {"seqpack.loader.prefetch", "seqpack.loader.iterator"} & graph["seqpack.loader.producer"]
    # Calibration is data: no stage module consults it but the producer and the iterator.
    users = {name for name in loader if "seqpack.loader.calibration" in graph[name]}
    assert users == {"seqpack.loader.producer", "seqpack.loader.iterator"}


def test_removed_names_are_gone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("seqpack.loader.placement")
    prefetch = importlib.import_module("seqpack.loader.prefetch")
    for name in ("DeviceCopy", "Progress", "check_device", "tensors_of"):  # now seqpack.loader.step's
        with pytest.raises(AttributeError):
            getattr(prefetch, name)
    assert "Ready" not in prefetch.__all__  # imported there (the runner hands it over), owned by step
    calibration = importlib.import_module("seqpack.loader.calibration")
    with pytest.raises(AttributeError):
        calibration.StepCalibration  # noqa: B018


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("seqpack.loader.iterator", "DATA_OWNERS"),  # seqpack.options.DataOwner is the one
        ("seqpack.collective", "agree_status"),  # agree() is the one agreement
        ("seqpack.collective.agree", "agree_status"),
        ("seqpack.collective.agree", "STATUS_OK"),  # Status.OK
        ("seqpack.options", "Objective"),  # the sync says what a plan balances
    ],
)
def test_old_aliases_are_gone(module, name):
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", ["VERSION", "STATE_VERSION", "STATE_CONFIG", "STATE_CALIBRATION"])
def test_the_iterator_has_no_state_aliases(name):
    from seqpack.loader.iterator import PackingIterator

    with pytest.raises(AttributeError):  # seqpack.loader.resume.StateKey / ResumeState.VERSION are the ones
        getattr(PackingIterator, name)
