"""One calibrator (issue 40): CostCalibrator fits a static plan's cost and, with a prior that
prices CP groups (a reference_size), a dynamic-CP group cost. The points observed by the two
calibrators before (commit 7646089, frozen below as literals, in today's one state format) fit
the same models, bit for bit; a state of the other kind, of an old version or with an
impossible point is refused by name."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from seqpack._logging import reset_warn_once
from seqpack.calibrate import CostCalibrator, TimingLedger
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError

# -- points observed by main's code (7646089), frozen -------------------------------------------

COST_PRIOR = CostModel(2e-4, 3e-7, 0.01)
COST_STATE = {
    "version": 2,
    "sums": ["seqlen_sum", "seqlen_sq_sum"],
    "window": None,
    "points": [
        [656, 202378, 0.20297762747118064, 1],
        [743, 243529, 0.2208811491185678, 1],
        [505, 85497, 0.1364492382393517, 1],
        [862, 248340, 0.23324472926606143, 2],
        [872, 270970, 0.24885354384493705, 2],
        [615, 262589, 0.20607256981020777, 3],
        [355, 64181, 0.10001117858347386, 3],
        [1015, 381459, 0.3292927816883127, 3],
    ],
    "skipped": 1,
    "observed": 8,
    "last_step": 3,
}
COST_MODEL = [0.009698249010475113, 0.00019396498020950227, 2.909474703142534e-07]  # (constant, linear, quadratic)

WINDOWED_PRIOR = CostModel(2e-4, 3e-7, 0.01, windowed=1e-7, window=128)
WINDOWED_STATE = {
    "version": 2,
    "sums": ["seqlen_sum", "seqlen_sq_sum", "seqlen_window_sum"],
    "window": 128,
    "points": [
        [1108, 414894, 235220, 0.38080074682229165, 1],
        [717, 205889, 136065, 0.214760202920589, 1],
        [1094, 470244, 231622, 0.39453169029511603, 1],
        [669, 210485, 130953, 0.24204946285952125, 2],
        [482, 103146, 78894, 0.15076847086085707, 2],
        [963, 315065, 197955, 0.2979113678794662, 2],
    ],
    "skipped": 0,
    "observed": 6,
    "last_step": 2,
}
WINDOWED_MODEL = [0.0764798457145337, 0.0, 6.432580659664667e-07, 1.1100025865251716e-07]

GROUP_PRIOR = CostModel(1.0, 1e-4, 0.0, ring_step=10.0, ring_token=0.1, ranks_per_node=2, reference_size=1)
GROUP_STATE = {
    "version": 2,
    "sums": ["size", "seqlen_sum", "seqlen_sq_sum", "spans"],
    "window": None,
    "points": [
        [1, 227, 102604, 0, 0.05765566203034276, 1],
        [3, 543, 488157, 1, 0.05165843091692411, 1],
        [3, 1863, 1052595, 1, 0.1401615267998404, 1],
        [4, 1208, 827480, 1, 0.08060975942647045, 2],
        [4, 1347, 977922, 1, 0.09554996812741678, 2],
        [4, 2629, 2318778, 1, 0.16827734223846197, 2],
        [2, 268, 167768, 0, 0.039905205877822474, 3],
        [1, 3577, 1144640, 0, 0.7504871462001692, 3],
        [2, 2684, 1406416, 0, 0.31696506866685586, 3],
    ],
    "skipped": 0,
    "observed": 9,
    "last_step": 3,
}
GROUP_MODEL = [
    0.008404235592158442,
    0.0001966039058229051,
    3.167360731284994e-08,
    0.0010128613897809487,
    1.4086976403370444e-05,
    4.098913469884097e-06,
]

LEDGER_STATE = {
    "calibrator": {
        "version": 2,
        "sums": ["seqlen_sum", "seqlen_sq_sum"],
        "window": None,
        "points": [[440, 77888, 0.1, 0], [456, 71744, 0.1, 0], [440, 76096, 0.2, 0], [448, 72832, 0.2, 0]],
        "skipped": 0,
        "observed": 4,
        "last_step": 0,
    },
    "pending": [
        {
            "step": 1,
            "sums": [[[440, 77888], [456, 71744]], [[440, 76096], [448, 72832]]],
            "model": None,
            "local": [0.2, 0.2],
        }
    ],
    "last": {
        "step": 0,
        "measured": 1.0,
        "predicted": 0.48408320000000005,
        "model": [0.0002, 3e-07, 0.01, 0.0, None, 0.0, 0.0, 0.0, 8, None],
    },
}


def _calibrators():
    return [
        (CostCalibrator(COST_PRIOR, window=8, min_points=4), COST_STATE, COST_MODEL),
        (
            CostCalibrator(WINDOWED_PRIOR, window=8, min_points=4, keep_prior_shape=False),
            WINDOWED_STATE,
            WINDOWED_MODEL,
        ),
        (CostCalibrator(GROUP_PRIOR, window=16, min_points=6), GROUP_STATE, GROUP_MODEL),
    ]


def _coefficients(model):
    values = model.coefficients if model.reference_size is None else model.group_coefficients(1)
    return [float(c) for c in values]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_states_round_trip_and_fit_the_same_model_bit_for_bit(index):
    cal, state, model = _calibrators()[index]
    cal.load_state_dict(state)
    assert cal.state_dict() == state  # key for key, value for value
    assert list(cal.state_dict()) == list(state)  # and in the same order
    assert cal.fitted and cal.num_points == len(state["points"])
    assert cal.fits_groups is (index == 2)
    assert _coefficients(cal.model) == model  # what the two calibrators fitted before
    other = cal.copy()
    assert type(other) is type(cal) and repr(other) == repr(cal)
    assert other.state_dict() == state and _coefficients(other.model) == model


def test_ledger_state_loads_with_its_models():
    ledger = TimingLedger(CostCalibrator(COST_PRIOR, min_points=3, warmup_steps=0), dp_size=2, dp_rank=0)
    ledger.load_state_dict(LEDGER_STATE)
    assert ledger.pending() == [1] and ledger.last is not None
    assert ledger.last.model == CostModel(2e-4, 3e-7, 0.01)
    assert ledger.state_dict() == LEDGER_STATE


def test_repr_is_the_settings():
    """PackingConfig fingerprints the calibrator's repr: resume compares it with the saved one."""
    assert repr(CostCalibrator(COST_PRIOR)) == (
        f"CostCalibrator(prior={COST_PRIOR!r}, window=1024, min_points=32, robust=True, prior_in_seconds=False, "
        "warmup_steps=1, keep_prior_shape=True)"
    )


def test_a_state_of_the_other_kind_or_an_old_version_is_refused_by_name():
    with pytest.raises(ResumeError, match=r"holds sums \('size', .*this calibrator keeps \('seqlen_sum'"):
        CostCalibrator(COST_PRIOR).load_state_dict(GROUP_STATE)
    with pytest.raises(ResumeError, match=r"holds sums \('seqlen_sum', 'seqlen_sq_sum'\).* keeps \('size'"):
        CostCalibrator(GROUP_PRIOR).load_state_dict(COST_STATE)
    with pytest.raises(ResumeError, match="for window=None; .* window=128"):
        CostCalibrator(WINDOWED_PRIOR).load_state_dict({**WINDOWED_STATE, "window": None})
    old = {key: value for key, value in COST_STATE.items() if key not in ("sums", "window")}
    with pytest.raises(ResumeError, match="calibrator state version 1 is not 2"):
        CostCalibrator(COST_PRIOR).load_state_dict({**old, "version": 1})


def test_ring_terms_need_a_reference_size():
    with pytest.raises(ConfigError, match="has ring terms but no reference_size"):
        CostCalibrator(CostModel(1.0, 0.0, ring_step=1.0))
    with pytest.raises(SeqpackTypeError, match="prior must be a seqpack.CostModel"):
        CostCalibrator("flops")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("point", "problem"),
    [
        ([0, 227, 102604, 0, 0.05, 1], "size 0"),  # a group of no rank
        ([1, -227, 102604, 0, 0.05, 1], "S -227"),
        ([1, 227, 102604, 2, 0.05, 1], "spans 2"),
        ([1, 227, 102604, 0, -0.05, 1], "the time -0.05"),
        ([1, 227, 102604, 0, float("nan"), 1], "the time nan"),
    ],
)
def test_a_group_state_with_an_impossible_point_is_refused_naming_it(point, problem):
    state = {**GROUP_STATE, "points": [*GROUP_STATE["points"][:2], point]}
    with pytest.raises(ResumeError, match=rf"point 2 .* has .*{problem}"):
        CostCalibrator(GROUP_PRIOR).load_state_dict(state)


def test_negative_counters_and_a_string_point_are_refused():
    with pytest.raises(ResumeError, match="negative count"):
        CostCalibrator(COST_PRIOR).load_state_dict({**COST_STATE, "skipped": -1})
    with pytest.raises(ResumeError, match="malformed"):
        CostCalibrator(COST_PRIOR).load_state_dict({**COST_STATE, "points": ["abcd"]})


def test_both_kinds_skip_and_warn_alike_on_an_absurd_time(caplog):
    """One time filter: NaN, inf and <= 0 (an untimed microbatch) are skipped and counted
    silently; a positive time no clock measures is skipped, counted and warned once, naming
    the step and the time."""
    reset_warn_once()
    cost = CostCalibrator(COST_PRIOR, warmup_steps=0)
    group = CostCalibrator(GROUP_PRIOR, warmup_steps=0)
    times = [float("nan"), -1.0, 1e300, 0.5]
    with caplog.at_level(logging.WARNING):
        cost.observe([[10], [20], [30], [40]], times, step=4)
        group.observe([[10], [20], [30], [40]], times, step=4, group_sizes=[1] * 4)
    assert (cost.skipped, cost.num_points, group.skipped, group.num_points) == (3, 1, 3, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages  # once per process
    assert messages[0].startswith("step 4: a microbatch time of 1e+300 s is outside") and "skipped" in messages[0]


def test_group_observations_refuse_what_is_no_group():
    group = CostCalibrator(GROUP_PRIOR)
    with pytest.raises(SeqpackTypeError, match=r"group_sizes must be integers.*observe of step 2"):
        group.observe([[10], [20]], [0.1, 0.2], step=2, group_sizes=[1.5, 2])
    with pytest.raises(ConfigError, match=r"microbatch 1: size 2, S 20, SS 400, spans 3"):
        group.observe([[10], [20]], [0.1, 0.2], group_sizes=[1, 2], spans=[0, 3])
    with pytest.raises(ConfigError, match="pass group_sizes="):
        group.observe([[10], [20]], [0.1, 0.2])
    with pytest.raises(ConfigError, match="group_sizes and spans are for a prior that prices CP groups"):
        CostCalibrator(COST_PRIOR).observe([[10]], [0.1], group_sizes=[1])
    with pytest.raises(SeqpackTypeError, match="sums must be integers"):
        group.observe_sums([[1, "3", 9, 0]], [0.1])
    with pytest.raises(ConfigError, match=r"sums must be one row of \('size', .* per timing \(2\)"):
        group.observe_sums([[1, 3, 9, 0]], [0.1, 0.2])
    assert group.num_points == 0
    assert group.observe([[10], [4, 4]], [0.1, 0.2], group_sizes=np.array([1, 2]), spans=[False, True]) == 2
    assert group.observe_sums(np.array([[1, 10, 100, 0], [2, 8, 32, 1]]), [0.1, 0.2]) == 2
    assert [p[0] for p in group._points] == [(1, 10, 100, 0), (2, 8, 32, 1)] * 2
