"""Resume states saved before dynamic CP was the registered scheduler "dynamic_cp": their
summary names the scheduler dynamic_cp=True ignored ('balanced'); they still resume, and
only when nothing else differs."""

from __future__ import annotations

import pytest

from seqpack.cost import CostModel, GroupCost
from seqpack.errors import ResumeError
from seqpack.loader import PackingConfig
from seqpack.loader.resume import ResumeState
from seqpack.options import fingerprint_text
from seqpack.schedulers import get_scheduler

COST = GroupCost(CostModel(1.0, 0.01, 0.5), ring_step=2.0, ring_token=0.1)
TOPOLOGY = {"signature": 1}


def saved(config: PackingConfig, **changes: str) -> ResumeState:
    """A state as the older build saved it: its summary with the old scheduler spelling."""
    summary = {**config.summary(), "scheduler": repr(get_scheduler("balanced")), **changes}
    return ResumeState(
        topology=dict(TOPOLOGY),
        config=summary,
        config_fingerprint=fingerprint_text(repr(sorted(summary.items()))),
        steps=1,
        consumed=8,
        deferred_samples=[],
        iterator=None,
    )


def test_the_older_spelling_resumes():
    config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, dynamic_cp=True, group_cost=COST)
    state = saved(config)
    assert state.config_fingerprint != config.fingerprint()  # the spellings really differ
    state.check_fits(TOPOLOGY, config, "DynamicCpScheduler")


def test_another_setting_still_refuses_naming_both_spellings():
    config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, dynamic_cp=True, group_cost=COST)
    state = saved(config, max_tokens_per_rank="128")
    with pytest.raises(ResumeError, match=r"max_tokens_per_rank: '128' \(saved\) vs '64' \(here\)") as err:
        state.check_fits(TOPOLOGY, config, "DynamicCpScheduler")
    assert "BalancedScheduler(" in str(err.value) and "DynamicCpScheduler(" in str(err.value)


def test_only_under_dynamic_cp_and_an_intact_fingerprint():
    plain = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, scheduler_options={"order": "pipeline"})
    with pytest.raises(ResumeError, match="another configuration: scheduler"):
        saved(plain).check_fits(TOPOLOGY, plain, "BalancedScheduler")
    config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, dynamic_cp=True, group_cost=COST)
    state = saved(config)
    forged = ResumeState(**{**state.__dict__, "config_fingerprint": state.config_fingerprint ^ 1})
    with pytest.raises(ResumeError, match="another configuration: scheduler"):
        forged.check_fits(TOPOLOGY, config, "DynamicCpScheduler")
