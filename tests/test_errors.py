"""seqpack.errors: every error is a ValueError (a type error also a TypeError), and StepFailed
keeps its step, rank and reason through pickling, as ranks exchange it (all_gather_object,
spawned processes)."""

from __future__ import annotations

import pickle

import pytest

from seqpack import errors


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_a_value_error_and_a_type_error_is_a_type_error(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.SeqpackError) and issubclass(cls, ValueError)
    assert issubclass(cls, TypeError) == (cls is errors.SeqpackTypeError)


@pytest.mark.parametrize(("step", "rank"), [(3, 1), (None, None), (0, None)])
def test_step_failed_keeps_step_rank_and_reason_through_pickling(step, rank):
    error = errors.StepFailed("step 3 failed on rank 1: sample 7 has no 'input_ids'", step=step, rank=rank)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is errors.StepFailed
    assert (back.step, back.rank, back.reason, str(back)) == (step, rank, error.reason, str(error))


@pytest.mark.parametrize("cls", [errors.ConfigError, errors.SampleError, errors.SeqpackTypeError, errors.WireError])
def test_a_typed_message_rebuilds_the_error_of_its_type_and_text(cls):
    message = errors.typed_message(cls("sample 2: 'labels' has shape (3,): expected (4,)"))
    assert message == f"{cls.__name__}: sample 2: 'labels' has shape (3,): expected (4,)"
    back = errors.from_typed_message(message)
    assert type(back) is cls and str(back) == "sample 2: 'labels' has shape (3,): expected (4,)"


def test_other_errors_and_plain_text_come_back_as_config_errors():
    message = errors.typed_message(KeyError("input_ids"))
    assert message == "ConfigError: 'input_ids'"
    assert type(errors.from_typed_message(message)) is errors.ConfigError
    for text in ("no colon here", "Unknown: a type seqpack does not raise"):
        back = errors.from_typed_message(text)
        assert type(back) is errors.ConfigError and str(back) == text
