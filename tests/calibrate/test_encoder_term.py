"""CostCalibrator(encoder_price=): the vision encoder's FLOPs as a feature of the fit (issue 41
item 3), so the price of the plans' sample_cost follows the measured times."""

from __future__ import annotations

import numpy as np
import pytest

from seqpack.calibrate import CostCalibrator, TimingLedger
from seqpack.calibrate.points import MAX_EXACT_FLOPS, microbatch_encoder_flops
from seqpack.cost import CostModel
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.schedulers import Request, get_scheduler

PRIOR = CostModel(1.0, 0.01, 2.0)  # units (say FLOPs / 1e6)
PRICE = 0.002  # the prior's price of one encoder FLOP, in its units
SECONDS = 1e-4  # seconds per prior unit: the clock runs the prior's language model exactly


def _points(k: float, count: int = 48, seed: int = 0):
    """Microbatches of 1-4 sequences, half with encoder work; seconds where the encoder costs
    ``k`` times what the prior says per FLOP."""
    rng = np.random.default_rng(seed)
    lengths, flops, seconds = [], [], []
    for i in range(count):
        mb = rng.integers(8, 200, int(rng.integers(1, 5))).tolist()
        e = int(rng.integers(10_000, 400_000)) if i % 2 else 0
        s, ss = sum(mb), sum(x * x for x in mb)
        lengths.append(mb)
        flops.append(e)
        seconds.append(SECONDS * (PRIOR.constant + PRIOR.linear * s + PRIOR.quadratic * ss + k * PRICE * e))
    return lengths, flops, seconds


@pytest.mark.parametrize("k", [1.0, 4.0, 25.0])
def test_the_fit_recovers_how_much_dearer_the_encoder_is_than_the_prior_says(k):
    calibrator = CostCalibrator(PRIOR, min_points=16, encoder_price=PRICE)
    assert calibrator.sum_names == ("seqlen_sum", "seqlen_sq_sum", "vision_flops_sum")
    assert calibrator.encoder_price == PRICE  # the prior's until fitted
    lengths, flops, seconds = _points(k)
    calibrator.observe(lengths, seconds, encoder_flops=flops)
    model, price = calibrator.model, calibrator.encoder_price
    assert price is not None
    # The language model's terms follow the clock; the encoder's price is k times the prior's
    # at the same clock.
    assert model.linear == pytest.approx(SECONDS * PRIOR.linear, rel=1e-6)
    assert price / (SECONDS * PRICE) == pytest.approx(k, rel=1e-6)
    assert calibrator.shape == ("prior" if k == 1.0 else "fitted")


def test_text_points_price_the_encoder_like_the_language_model():
    calibrator = CostCalibrator(PRIOR, min_points=8, encoder_price=PRICE)
    lengths, _, seconds = _points(1.0, count=12)
    text = [
        SECONDS * (PRIOR.constant + PRIOR.linear * sum(mb) + PRIOR.quadratic * sum(x * x for x in mb)) for mb in lengths
    ]
    calibrator.observe(lengths, [3.0 * t for t in text])  # no encoder_flops: zeros
    assert calibrator.encoder_price == pytest.approx(3.0 * SECONDS * PRICE, rel=1e-9)
    assert calibrator.model.linear == pytest.approx(3.0 * SECONDS, rel=1e-9)


def test_without_an_encoder_price_nothing_changes():
    calibrator = CostCalibrator(PRIOR, min_points=8)
    assert calibrator.sum_names == ("seqlen_sum", "seqlen_sq_sum")
    assert calibrator.encoder_price is None and "encoder_price" not in repr(calibrator)
    with pytest.raises(ConfigError, match="encoder_flops are for a calibrator with an encoder_price"):
        calibrator.observe([[4]], [1.0], encoder_flops=[3])
    assert "encoder_price=0.002" in repr(CostCalibrator(PRIOR, encoder_price=PRICE))


def test_the_encoder_price_is_checked_by_name():
    with pytest.raises(ConfigError, match="encoder_price must be > 0, got -1"):
        CostCalibrator(PRIOR, encoder_price=-1)
    with pytest.raises(SeqpackTypeError, match="encoder_price must be a number, got '1' \\(str\\)"):
        CostCalibrator(PRIOR, encoder_price="1")  # type: ignore[arg-type]
    group = CostModel.from_group_coefficients(np.array([1.0, 1.0, 0.01, 0.0, 0.0, 0.0]), 8)
    with pytest.raises(ConfigError, match="dynamic CP plans no sample_cost"):
        CostCalibrator(group, encoder_price=PRICE)


def test_state_and_copy_keep_the_encoder_sums():
    calibrator = CostCalibrator(PRIOR, min_points=16, encoder_price=PRICE)
    lengths, flops, seconds = _points(5.0)
    calibrator.observe(lengths, seconds, encoder_flops=flops, step=3)
    other = calibrator.copy()
    assert other.encoder_price == calibrator.encoder_price and other.model == calibrator.model
    with pytest.raises(ResumeError, match="vision_flops_sum"):
        CostCalibrator(PRIOR).load_state_dict(calibrator.state_dict())


def _plan(sample_cost):
    request = Request.of([60, 20, 20, 20], dp_size=2, max_tokens_per_rank=64, cost=PRIOR, sample_cost=sample_cost)
    return get_scheduler("balanced").plan(request)


def test_the_ledger_reads_each_microbatchs_encoder_flops_back_from_the_plan():
    flops = np.array([0, 123_457, 98_765, 0], dtype=np.int64)
    price = 0.1 * SECONDS * PRICE  # an odd fitted price
    plan = _plan(flops * price)
    per_mb = microbatch_encoder_flops(plan, price)
    assert per_mb.sum() == flops.sum() and per_mb.dtype == np.int64
    replica, rnd = plan.replica_of(), plan.placement()[1]
    want = np.zeros_like(per_mb)
    np.add.at(want, (rnd, replica), flops)
    assert np.array_equal(per_mb, want)
    assert not microbatch_encoder_flops(_plan(None), price).any()
    with pytest.raises(ConfigError, match="sample 1 has .* vision encoder FLOPs"):
        microbatch_encoder_flops(_plan(np.array([0.0, 2.0 * MAX_EXACT_FLOPS, 0.0, 0.0]) * price), price)

    calibrator = CostCalibrator(PRIOR, min_points=3, encoder_price=PRICE)
    ledger = TimingLedger(calibrator, dp_size=2, dp_rank=0)
    ledger.add_schedule(0, plan, None, encoder_price=price)
    state = ledger.state_dict()
    assert state["pending"][0]["encoder_price"] == price
    assert np.array_equal(np.asarray(state["pending"][0]["sums"])[..., -1], per_mb)


def test_the_fitted_price_moves_images_apart_where_the_prior_kept_them_together():
    # Samples 1 and 2 carry an image. At the prior's price (e = 4 units an image) balancing
    # puts the 60-token text alone and the three 20-token samples together; the clock says
    # the encoder costs 25 times that, and the plan at the fitted price splits the images.
    flops = np.array([0, 2_000, 2_000, 0], dtype=np.int64)
    prior_plan = _plan(flops * PRICE)
    assert prior_plan.replica_of()[1] == prior_plan.replica_of()[2]
    calibrator = CostCalibrator(PRIOR, min_points=16, encoder_price=PRICE)
    lengths, e, seconds = _points(25.0)
    calibrator.observe(lengths, seconds, encoder_flops=e)
    price = calibrator.encoder_price
    assert price is not None
    request = Request.of(
        [60, 20, 20, 20], dp_size=2, max_tokens_per_rank=64, cost=calibrator.model, sample_cost=flops * price
    )
    plan = get_scheduler("balanced").plan(request)
    assert plan.replica_of()[1] != plan.replica_of()[2]
