"""calibrate=True with PackingConfig(model=) of a vision model: the calibrator fits the vision
encoder's FLOPs beside the tokens and the plans price their sample_cost at its fitted price
(issue 41 item 3), on one rank; tests/distributed/test_encoder_calibration_dist.py runs gloo dp=2."""

from __future__ import annotations

import pytest
import torch
from vision_calibration_data import COST, PRICE, SECONDS, K, priced_at, run, samples

from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.topology import Topology


def test_one_rank_fits_the_encoder_and_plans_at_its_fitted_price():
    seen, calibrator = run(Topology.single(), samples(0, 6 * 24), 24)
    assert calibrator.sum_names == ("seqlen_sum", "seqlen_sq_sum", "vision_flops_sum")
    assert calibrator.fitted and calibrator.encoder_price is not None
    assert calibrator.encoder_price / (SECONDS * PRICE) == pytest.approx(K, rel=1e-6)
    assert calibrator.model.linear == pytest.approx(SECONDS * COST.linear, rel=1e-6)
    assert not seen[0][0] and priced_at(seen[0][1], PRICE)  # the prior's price
    assert seen[-1][0] and priced_at(seen[-1][1], calibrator.encoder_price)  # the fitted price


def test_a_text_run_keeps_its_calibrator_as_before():
    gen = torch.Generator().manual_seed(3)
    data = [{"input_ids": torch.randint(2, 100, (int(n),), generator=gen)} for n in torch.randint(6, 60, (24,))]
    config = PackingConfig(samples_per_rank=6, max_tokens_per_rank=96, pad_multiple=2, cost=COST, calibrate=True)
    it = wrap_data_iterator(data, Topology.single(), config)
    next(iter(it))
    assert it.calibrator.sum_names == ("seqlen_sum", "seqlen_sq_sum") and it.calibrator.encoder_price is None
