"""Work the wrapper does once, not again: the schedule's fingerprint is hashed once per step,
the step's predicted time computed once, the scheduler built once per iterator; and a
config's fingerprint (what resume compares) stays what it was."""

from __future__ import annotations

from unittest import mock

import pytest
from wrapper_data import items

from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.loader import calibration as calibration_module
from seqpack.schedulers import Schedule, predicted_step_time
from seqpack.schedulers import schedule as schedule_module
from seqpack.topology import Topology

STEPS = 3


def _config(**options) -> PackingConfig:
    return PackingConfig(samples_per_rank=6, max_tokens_per_rank=48, pad_multiple=4, **options)


def _steps(config: PackingConfig) -> list:
    return list(wrap_data_iterator(items(3, 0, 6 * STEPS), Topology.single(), config))


@pytest.mark.parametrize("options", [{}, {"calibrate": True}, {"dynamic_cp": True}])
def test_the_schedule_fingerprint_is_hashed_once_a_step(options):
    with mock.patch.object(schedule_module, "_digest", wraps=schedule_module._digest) as digest:
        steps = _steps(_config(prefetch=0, check_schedule=True, **options))
        assert len(steps) == STEPS and digest.call_count == STEPS
    for step in steps:  # nothing wrote the plan's arrays after it was hashed
        assert step.schedule_fingerprint == Schedule.from_arrays(step.schedule.to_arrays()).fingerprint()


@pytest.mark.parametrize("options", [{}, {"calibrate": True}, {"dynamic_cp": True, "calibrate": True}])
def test_the_predicted_step_time_is_computed_once_a_step(options):
    config = _config(prefetch=0, **options)
    with (
        mock.patch.object(calibration_module, "predicted_step_time", wraps=predicted_step_time) as in_loader,
        mock.patch("seqpack.stats.predicted_step_time", wraps=predicted_step_time) as in_stats,
    ):
        steps = _steps(config)
    assert len(steps) == STEPS and in_loader.call_count + in_stats.call_count == STEPS
    for step in steps:  # the prediction of the model the step was planned with
        again = predicted_step_time(step.schedule, step.stats.cost_model, sync=config.sync)
        assert step.stats.predicted_step_time == again


@pytest.mark.parametrize("options", [{}, {"dynamic_cp": True}, {"validate_ranks": False}, {"scheduler": "dp_balanced"}])
def test_the_scheduler_is_built_once_an_iterator(options):
    config = _config(**options)  # its own construction builds one, to check the name and options
    original = PackingConfig.build_scheduler
    with mock.patch.object(PackingConfig, "build_scheduler", autospec=True, side_effect=original) as built:
        it = wrap_data_iterator(items(3, 0, 6 * STEPS), Topology.single(), config)
        assert built.call_count == 1
        next(it)
        state = it.state_dict()
        it.close()
        again = wrap_data_iterator(items(3, 0, 6 * STEPS), Topology.single(), config)
        again.load_state_dict(state)
        rest = list(again)
    assert built.call_count == 2 and len(rest) == STEPS - 1
    assert state["config_fingerprint"] == config.resolve(Topology.single()).fingerprint()


def test_a_config_fingerprint_does_not_change():
    """Resume compares it: the values hashed at cad467f, before and after ``resolve``."""
    cases = [
        ({}, 1706135721540280068, 8880274383723710635),
        (
            dict(
                scheduler="dp_balanced",
                scheduler_options={"microbatch_multiple": 2},
                on_oversize="truncate",
                sync="replica",
            ),
            6950017187956551060,
            6501763346049537757,
        ),
        (dict(dynamic_cp=True, scheduler_options={"group_sizes": "any"}), 1576458769751906327, 4721403662433905627),
    ]
    for options, given, resolved in cases:
        config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, **options)
        assert config.fingerprint() == given
        assert config.resolve(Topology.single()).fingerprint() == resolved
        scheduler = config.build_scheduler()
        assert config.fingerprint(scheduler) == given and config.summary(scheduler) == config.summary()
