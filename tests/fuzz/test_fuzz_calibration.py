"""Fuzz the closed loop's inputs (issue 24): hostile types and extreme times into
``CostModel.fit``, ``CostCalibrator`` of a static and of a group cost (constructors, ``observe``,
``load_state_dict``), ``wrap_data_iterator(calibrate=...)`` and ``Step.record_times``, and
``record_times`` called out of order.

The contract (docs/errors.md, "Calibration"): a bad argument is one SeqpackError naming it
(and under record_times the step and the DP rank); an extreme time (NaN, inf, <= 0, 1e308,
1e-320) is skipped and counted, never fitted, never an overflow warning; call order follows
the documented rules (a step's times once; late, closed or resumed iterators drop times,
never fail on them). Every hostile value of :data:`hostile.HOSTILE` is tried for every
argument (no sampling: about 2,000 calls, a few seconds)."""

from __future__ import annotations

import collections
import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hostile import HOSTILE, Target, check_answer
from wrapper_data import items

from seqpack._logging import reset_warn_once
from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, SeqpackError, StepFailed
from seqpack.loader import wrap_data_iterator
from seqpack.topology import Topology

TRUTH = CostModel(2e-4, 3e-7, 0.01)
GROUP_PRIOR = CostModel(1.0, 1e-4, 0.0, ring_step=10.0, ring_token=0.1, ranks_per_node=2, reference_size=1)
MBS = [[100, 20], [300], [50, 60, 70], [400, 10]]
SECONDS = [0.05, 0.09, 0.06, 0.12]

# Extreme but real times: each is either kept (a time a clock can measure) or skipped and
# counted, with no numpy warning on the way.
EXTREMES: list[tuple[str, Any]] = [
    ("1e308", 1e308),
    ("1.7e308", 1.7e308),
    ("1e-320", 1e-320),
    ("5e-324", 5e-324),
    ("-1", -1.0),
    ("-0.0", -0.0),
    ("0", 0.0),
    ("nan", math.nan),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("1e154", 1e154),
    ("1e-154", 1e-154),
    ("np.float32(0.1)", np.float32(0.1)),
    ("np.float16(0.1)", np.float16(0.1)),
    ("np.int64(2)", np.int64(2)),
    ("0-d array", np.array(0.1)),
    ("0-d tensor", torch.tensor(0.1)),
]
SHAPES: list[tuple[str, Any]] = [
    ("2-d array", np.full((2, 2), 0.1)),
    ("2-d list", [[0.1, 0.2], [0.3, 0.4]]),
    ("2-d tensor", torch.full((4, 1), 0.1)),
    ("short", SECONDS[:3]),
    ("long", [*SECONDS, 0.1]),
    ("ragged", [0.1, [0.2, 0.3], 0.4, 0.5]),
]


def _seconds_kind(value: Any) -> bool:
    """What a successful call may have been given as seconds: 4 real, non-bool numbers."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001
        return False
    return arr.shape == (4,) and arr.dtype.kind in "iuf"


def _fit(**kw: Any) -> Any:
    return CostModel.fit(kw["microbatches"], kw["seconds"], robust=kw["robust"])


def _observe(**kw: Any) -> Any:
    cal = CostCalibrator(TRUTH, min_points=3, warmup_steps=0)
    cal.observe(kw["microbatch_lengths"], kw["seconds"], step=kw["step"])
    return cal.model


def _group_observe(**kw: Any) -> Any:
    cal = CostCalibrator(GROUP_PRIOR, min_points=3, warmup_steps=0)
    cal.observe(
        kw["microbatch_lengths"], kw["seconds"], step=kw["step"], group_sizes=kw["group_sizes"], spans=kw["spans"]
    )
    return cal.model


def _make(kind: type, prior: Any) -> Callable[..., Any]:
    def make(**kw: Any) -> Any:
        return kind(prior, **kw)

    return make


def _load(kind: type, prior: Any) -> Callable[..., Any]:
    def load(**kw: Any) -> Any:
        kind(prior).load_state_dict(kw["state"])

    return load


def _wrap(calibrate: Any = True, prefetch: int = 0, count: int = 200) -> Any:
    return wrap_data_iterator(
        items(3, 0, count),
        Topology.single(),
        samples_per_rank=12,
        max_tokens_per_rank=64,
        pad_multiple=4,
        calibrate=calibrate,
        prefetch=prefetch,
    )


def _wrap_calibrate(**kw: Any) -> Any:
    with _wrap(kw["calibrate"]) as it:
        return next(it).step


def _record(**kw: Any) -> Any:
    """record_times on step 0, then next(): a refused call fails the next step with its
    message; an accepted one lets it run."""
    with _wrap() as it:
        step = next(it)
        seconds = kw["seconds"]
        if isinstance(seconds, list) and len(seconds) == 4:
            seconds = (seconds * step.num_microbatches)[: step.num_microbatches]
        try:
            step.record_times(seconds)
        except SeqpackError as exc:
            with pytest.raises(StepFailed) as failed:
                next(it)
            assert str(exc) in str(failed.value)  # the same message, for every rank
            raise
        return next(it).step


SETTINGS = {"window": "int", "min_points": "int", "robust": "bool", "prior_in_seconds": "bool", "warmup_steps": "int"}
TARGETS = [
    Target(
        "CostModel.fit",
        _fit,
        lambda: {"microbatches": MBS, "seconds": SECONDS, "robust": False},
        {"microbatches": "any", "seconds": "any", "robust": "bool"},
        aliases={"microbatches": ("microbatch",)},
    ),
    Target(
        "CostCalibrator.observe",
        _observe,
        lambda: {"microbatch_lengths": MBS, "seconds": SECONDS, "step": 3},
        {"microbatch_lengths": "any", "seconds": "any", "step": "opt_int"},
        aliases={"microbatch_lengths": ("microbatch",)},
    ),
    Target(
        "CostCalibrator (groups).observe",
        _group_observe,
        lambda: {
            "microbatch_lengths": MBS,
            "group_sizes": [1, 2, 1, 2],
            "spans": [0, 1, 0, 0],
            "seconds": SECONDS,
            "step": 3,
        },
        {"microbatch_lengths": "any", "group_sizes": "any", "spans": "any", "seconds": "any", "step": "opt_int"},
        aliases={"microbatch_lengths": ("microbatch",), "group_sizes": ("microbatch",), "spans": ("microbatch",)},
    ),
    Target(
        "CostCalibrator",
        _make(CostCalibrator, TRUTH),
        lambda: {"min_points": 3},
        {**SETTINGS, "keep_prior_shape": "bool"},
    ),
    Target("CostCalibrator (groups)", _make(CostCalibrator, GROUP_PRIOR), lambda: {"min_points": 3}, SETTINGS),
    Target("CostCalibrator.load_state_dict", _load(CostCalibrator, TRUTH), lambda: {"state": {}}, {"state": "any"}),
    Target(
        "CostCalibrator (groups).load_state_dict",
        _load(CostCalibrator, GROUP_PRIOR),
        lambda: {"state": {}},
        {"state": "any"},
    ),
    Target("wrap_data_iterator", _wrap_calibrate, lambda: {"calibrate": True}, {"calibrate": "bool"}),
    Target(
        "Step.record_times",
        _record,
        lambda: {"seconds": SECONDS},
        {"seconds": "any"},
        aliases={"seconds": ("record_times",)},
    ),
]
# A successful call may only have been given what its argument means.
ACCEPTS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("CostModel.fit", "seconds"): _seconds_kind,
    ("CostCalibrator.observe", "seconds"): _seconds_kind,
    ("CostCalibrator (groups).observe", "seconds"): _seconds_kind,
    ("Step.record_times", "seconds"): _seconds_kind,
}


def _targets() -> list[tuple[Target, str]]:
    return [(t, arg) for t in TARGETS for arg in sorted(t.args)]


def _valid_first(target: Target) -> None:
    kwargs = target.valid()
    if target.name.endswith("load_state_dict"):
        return  # {} is refused: the spoiled values are what is tried
    target.call(**kwargs)


@pytest.mark.parametrize(("target", "arg"), _targets(), ids=[f"{t.name}-{a}" for t, a in _targets()])
@pytest.mark.slow
def test_every_hostile_value_is_refused_by_name_or_used_as_meant(target, arg):
    _valid_first(target)
    outcomes: collections.Counter[str] = collections.Counter()
    values = HOSTILE if target.name != "Step.record_times" else HOSTILE[::2]  # each value: a fresh iterator
    for _, make in values:
        value = make()
        kwargs = target.valid()
        kwargs[arg] = value
        outcome = check_answer(target, arg, value, kwargs)
        if outcome == "ok" and (target.name, arg) in ACCEPTS:
            assert ACCEPTS[target.name, arg](value), f"{target.name} accepted {arg}={value!r}"
        outcomes[outcome] += 1
    assert outcomes["refused"] > 0, outcomes  # not vacuous


@pytest.mark.parametrize("name", [n for n, _ in SHAPES])
@pytest.mark.parametrize("target", ["CostModel.fit", "CostCalibrator.observe", "CostCalibrator (groups).observe"])
def test_times_of_the_wrong_shape_are_refused_naming_the_shape_or_count(target, name):
    by_name = {t.name: t for t in TARGETS}
    value = dict(SHAPES)[name]
    kwargs = by_name[target].valid()
    kwargs["seconds"] = value
    with pytest.raises(SeqpackError, match=r"seconds") as info:
        by_name[target].call(**kwargs)
    message = str(info.value)
    assert "shape (" in message or "3" in message or "5" in message or "[1]" in message, message
    if target != "CostModel.fit":
        assert "step 3" in message, message  # the step these times belong to


@pytest.mark.parametrize(("name", "value"), EXTREMES, ids=[n for n, _ in EXTREMES])
def test_extreme_times_are_kept_or_skipped_and_counted_never_a_warning(name, value):
    reset_warn_once()
    for where in ("one", "all"):
        seconds: list[Any] = [value] * 4 if where == "all" else [0.05, 0.09, value, 0.12]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cal = CostCalibrator(TRUTH, min_points=3, warmup_steps=0)
            kept = cal.observe(MBS, seconds, step=3)
            group = CostCalibrator(GROUP_PRIOR, min_points=3, warmup_steps=0)
            group_kept = group.observe(MBS, seconds, group_sizes=[1, 2, 1, 2], spans=[0, 1, 0, 0])
            models = [cal.model, group.model]
        assert kept + cal.skipped == 4 and group_kept + group.skipped == 4
        t = float(value)
        valid = math.isfinite(t) and 2.0**-120 <= t <= 2.0**120
        assert cal.skipped == (0 if valid else 1 if where == "one" else 4)
        assert all(math.isfinite(float(c)) and c >= 0 for m in models for c in m.coefficients)


@pytest.mark.parametrize(("name", "value"), EXTREMES, ids=[n for n, _ in EXTREMES])
def test_fit_fits_or_names_the_bad_time_never_a_warning(name, value):
    for seconds in ([value] * 4, [0.05, 0.09, value, 0.12]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                model = CostModel.fit(MBS, seconds, robust=True)
            except ConfigError as exc:
                assert "seconds[" in str(exc), exc  # the bad time, by index and value
                continue
        assert all(math.isfinite(float(c)) and c >= 0 for c in model.coefficients)
        assert model.predict_sums(np.array([1, 1])) > 0


def test_fit_near_the_largest_double_is_the_fit_in_seconds_scaled():
    """Before: ``math range error`` (an OverflowError) for times above 2**1023."""
    base = CostModel.fit(MBS, SECONDS)
    scale = 2.0**1020
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = CostModel.fit(MBS, [t * scale for t in SECONDS])
        huge = CostModel.fit(MBS, [1.7e308] * 4)
    assert big.constant == base.constant * scale and big.linear == base.linear * scale
    assert huge == CostModel(0.0, 0.0, 1.7e308)


@pytest.mark.parametrize(("name", "value"), [e for e in EXTREMES if e[0] in ("1e308", "5e-324", "nan", "-1")])
@pytest.mark.slow
def test_record_times_with_extreme_times_runs_and_leaks_no_warning(name, value):
    """Before: 1e308 s reached the step-time sum of the measurement (numpy overflow warnings)."""
    reset_warn_once()
    with _wrap() as it, warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            step = next(it)
            step.record_times([value] * step.num_microbatches)
        next(it)
        calibrator = it.calibrator
        assert calibrator is not None and calibrator.num_points == 0 and calibrator.skipped > 0
        assert it.last_measurement is None  # no step time from times no clock measures


# -- call order ------------------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 1])
def test_record_times_twice_in_one_step_is_refused_and_fails_the_next_step(prefetch):
    with _wrap(prefetch=prefetch) as it:
        step = next(it)
        step.record_times([0.1] * step.num_microbatches)
        with pytest.raises(ConfigError, match=r"record_times was called twice for step 0 on DP rank 0"):
            step.record_times([0.2] * step.num_microbatches)
        with pytest.raises(StepFailed, match="twice for step 0"):
            next(it)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.slow
def test_times_of_an_earlier_step_are_taken_while_pending_then_dropped_and_counted(prefetch, caplog):
    reset_warn_once()
    with _wrap(prefetch=prefetch) as it:
        first, second = next(it), next(it)
        first.record_times([0.1] * first.num_microbatches)  # late but still pending: taken
        second.record_times([0.1] * second.num_microbatches)
        for _ in range(6):
            step = next(it)
            step.record_times([0.1] * step.num_microbatches)
        ledger = it._producer.calibration.ledger
        assert ledger.late == 0
        skipped = [next(it) for _ in range(5)]  # steps whose times never come
        with caplog.at_level(logging.WARNING):
            skipped[0].record_times([0.1] * skipped[0].num_microbatches)  # long gone: dropped, counted, warned
        assert ledger.late == 1 and "arrived after the calibrator stopped waiting" in caplog.text
        next(it)  # no failure


def test_record_times_after_close_is_ignored_without_error():
    it = _wrap()
    step = next(it)
    step.record_times([0.1] * step.num_microbatches)
    last = next(it)
    it.close()
    last.record_times([0.1] * last.num_microbatches)  # a finally: block may report the last step
    with pytest.raises(SeqpackError, match="closed"):
        next(it)


@pytest.mark.slow
def test_record_times_of_an_old_iterator_after_resume_leaves_the_new_one_alone():
    reference = _wrap()
    old = _wrap()
    for it in (reference, old):
        for _ in range(3):
            step = next(it)
            step.record_times([0.01 * (i + 1) for i in range(step.num_microbatches)])
    unreported = next(old)
    next(reference)  # its step 3, unreported too
    state = old.state_dict()
    resumed = _wrap()
    resumed.load_state_dict(state)
    unreported.record_times([0.5] * unreported.num_microbatches)  # into the old iterator's ledger only
    step = next(resumed)
    assert resumed.calibrator.state_dict() == old.calibrator.state_dict()
    ref_step = next(reference)
    assert ref_step.step == step.step and ref_step.schedule_fingerprint == step.schedule_fingerprint
    for it in (reference, old, resumed):
        it.close()


def test_record_times_without_calibration_names_the_setting():
    with _wrap(calibrate=False) as it:
        step = next(it)
        with pytest.raises(ConfigError, match="record_times needs calibration: pass calibrate=True"):
            step.record_times([0.1] * step.num_microbatches)


def test_loading_a_state_then_observing_keeps_the_window_and_counters():
    cal = CostCalibrator(TRUTH, window=4, min_points=3, warmup_steps=0)
    cal.observe(MBS, SECONDS, step=1)
    state = cal.state_dict()
    other = CostCalibrator(TRUTH, window=4, min_points=3, warmup_steps=0)
    other.load_state_dict(state)
    assert other.observe(MBS[:1], [math.nan], step=0) == 0  # an earlier step after a load: counted, last_step kept
    assert (other.skipped, other.last_step, other.num_points) == (1, 1, 4)
    other.observe(MBS, SECONDS, step=2)
    assert other.num_points == 4 and other.observed == 8
