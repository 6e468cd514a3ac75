"""Argument checks shared by every module: one definition each, the bad value named.

Each check returns the value coerced to its plain Python type, so callers write
``self.capacity = check_int("capacity", capacity, minimum=1)``.
"""

from __future__ import annotations

import math
import numbers
from enum import Enum
from typing import TypeVar

import numpy as np

from seqpack.errors import ConfigError, SeqpackTypeError

__all__ = [
    "INT64_MAX",
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_optional_int",
    "check_positive_int",
]

INT64_MAX = (1 << 63) - 1
E = TypeVar("E", bound=Enum)


def _is_int(value: object) -> bool:
    # numpy integers register as numbers.Integral; bool is an int but never a count.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` within ``[minimum, maximum]``.

    Raises:
        SeqpackTypeError: Not an integer (floats and bools included).
        ConfigError: Out of range.
    """
    what = "an integer" if minimum is None else "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if not _is_int(value):
        raise SeqpackTypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    number = int(value)  # type: ignore[call-overload]
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name} must be {what}, got {number}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name}={number} is too large (at most {maximum})")
    return number


def check_positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    """``value`` as an ``int >= 1``."""
    return check_int(name, value, minimum=1, maximum=maximum)


def check_optional_int(name: str, value: object, *, minimum: int | None = None) -> int | None:
    """``None`` or :func:`check_int`."""
    return None if value is None else check_int(name, value, minimum=minimum)


def check_number(
    name: str, value: object, *, minimum: float | None = None, allow_zero: bool = True, finite: bool = True
) -> float:
    """``value`` as a ``float`` (ints and numpy numbers accepted, bools refused).

    Raises:
        SeqpackTypeError: Not a real number.
        ConfigError: NaN or infinite (when ``finite``), below ``minimum``, or zero when
            ``allow_zero`` is false.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SeqpackTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    number = float(value)
    if finite and not math.isfinite(number):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")
    if not allow_zero and number == 0:
        raise ConfigError(f"{name} must not be 0")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` as a ``bool`` (``numpy.bool_`` accepted; 0/1 and strings refused)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise SeqpackTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_choice(name: str, value: object, choices: type[E]) -> E:
    """``value`` as a member of the ``choices`` enum (its member or its string value).

    Raises:
        ConfigError: Not one of the values, listing the valid ones.
    """
    if isinstance(value, choices):
        return value
    try:
        return choices(value)
    except ValueError:
        valid = tuple(member.value for member in choices)
        raise ConfigError(f"{name} must be one of {valid}, got {value!r}") from None
