"""The scheduler registry: a registered class is built by its name with its options, and
listed; a class without a name and options beside an instance are refused naming them."""

from __future__ import annotations

import pytest

from seqpack.errors import ConfigError
from seqpack.schedulers import available_schedulers, get_scheduler
from seqpack.schedulers import registry as registry_module
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.registry import register_scheduler


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))  # put back afterwards
    return registry_module._REGISTRY


def test_a_registered_scheduler_is_built_by_name_and_listed(registry):
    base = type(get_scheduler("balanced"))

    @register_scheduler
    class Mine(base):
        name = "mine_for_test"

    assert registry["mine_for_test"] is Mine
    assert "mine_for_test" in available_schedulers() and "mine_for_test" in available_schedulers(dynamic_cp=True)
    built = get_scheduler("mine_for_test", microbatch_multiple=2)
    assert type(built) is Mine and built.microbatch_multiple == 2
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['colour'\] of scheduler 'mine_for_test'"):
        get_scheduler("mine_for_test", colour="red")


def test_a_scheduler_class_without_a_name_is_refused_naming_the_class(registry):
    class Nameless(Scheduler):
        pass

    before = dict(registry)
    with pytest.raises(ConfigError, match=r"^Nameless has no name$"):
        register_scheduler(Nameless)
    assert registry == before


def test_an_instance_is_returned_as_it_is_and_options_beside_it_are_refused():
    scheduler = get_scheduler("balanced")
    assert get_scheduler(scheduler) is scheduler
    with pytest.raises(ConfigError, match=r"options cannot be given with a Scheduler instance"):
        get_scheduler(scheduler, microbatch_multiple=2)
    with pytest.raises(ConfigError, match=r"unknown scheduler 7; available: .*balanced"):
        get_scheduler(7)
