"""Argument checks shared by every module: one definition each, the bad value named.

Each check returns the value coerced to its plain Python type, so callers write
``self.capacity = check_int("capacity", capacity, minimum=1)``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import INT32_MAX, INT64_MAX, MAX_TOKENS

if TYPE_CHECKING:
    import torch

__all__ = [
    "int64_array",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_TOKENS",
    "check_bool",
    "check_choice",
    "check_fits_memory",
    "check_int",
    "check_number",
    "check_numbers",
    "check_mapping",
    "check_optional_int",
    "check_path",
    "check_positive_int",
    "check_tensor",
    "check_window",
    "MAX_WINDOW",
    "memory_limit",
]

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


MAX_WINDOW = INT32_MAX
"""Widest attention window (one side of TE's ``window_size``, ``ThdAttention(window=...)``,
``ModelSpec.window_size``, ``CostModel.window``): a pack's offsets are int32 (``cu_seqlens``),
so a window of 2**31 - 1 already reaches every key of any sequence; a wider one would mean the
same and overflow the int32 window arguments of attention kernels (flash-attention's)."""


def check_window(name: str, value: object, *, unbounded: bool = False) -> int:
    """One side of an attention window: ``0 <= value <= MAX_WINDOW``, or ``-1`` (unbounded,
    TE's convention) when ``unbounded``.

    Raises:
        SeqpackTypeError: Not an integer (floats and bools included).
        ConfigError: Out of that range, named with the range.
    """
    if not _is_int(value):
        raise SeqpackTypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    number = int(value)  # type: ignore[call-overload]
    if not (0 <= number <= MAX_WINDOW or (unbounded and number == -1)):
        valid = ("-1 (unbounded) or " if unbounded else "") + f"an integer 0 <= w <= {MAX_WINDOW}"
        raise ConfigError(
            f"{name} must be {valid}, got {number} (2**31 - 1 already reaches every key of an int32-addressed pack)"
        )
    return number


def check_positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    """``value`` as an ``int >= 1``."""
    return check_int(name, value, minimum=1, maximum=maximum)


def check_optional_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """``None`` or :func:`check_int`."""
    return None if value is None else check_int(name, value, minimum=minimum, maximum=maximum)


def check_number(name: str, value: object, *, minimum: float | None = None, allow_zero: bool = True) -> float:
    """``value`` as a finite ``float`` (ints and numpy numbers accepted, bools refused; -0.0
    reads 0.0).

    Raises:
        SeqpackTypeError: Not a real number.
        ConfigError: NaN, infinite (an int past float64 included), below ``minimum``, or zero
            when ``allow_zero`` is false (``minimum=0.0, allow_zero=False``: ``> 0``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SeqpackTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    try:
        number = float(value) + 0.0  # + 0.0: -0.0 is 0.0
    except OverflowError:  # an int past float64
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    positive = minimum == 0 and not allow_zero
    if minimum is not None and (number < minimum or (positive and number == 0)):
        raise ConfigError(f"{name} must be {'> 0' if positive else f'>= {minimum}'}, got {value!r}")
    if not allow_zero and number == 0:
        raise ConfigError(f"{name} must not be 0, got {value!r}")
    return number


def check_numbers(name: str, values: object, *, where: str = "") -> np.ndarray:
    """``values`` (a sequence, array or tensor of real numbers, or one number) as a 1-D
    float64 array. NaN and infinities pass (callers decide what they mean). ``where`` goes
    into the message after ``name`` (``" (record_times of step 3)"``).

    Raises:
        SeqpackTypeError: An element that is no real number (a string, a bool, ``None``, a
            complex number), named with its index.
    """
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, RuntimeError):  # ragged nesting, a tensor that needs .cpu()
        raise SeqpackTypeError(f"{name} must be numbers{where}, got {values!r:.60}") from None
    if arr.dtype.kind in "iuf" and hasattr(values, "__array__"):
        return arr.reshape(-1).astype(np.float64)  # an array or tensor: its dtype says it all
    # Scan the elements as given: an array made of [0.1, True] holds 1.0, of [0.1, "0.2"] "0.1".
    for i, value in enumerate(np.asarray(values, dtype=object).reshape(-1).tolist()):
        if isinstance(value, (bool, np.bool_)) or not (isinstance(value, numbers.Real) or _is_number_array(value)):
            kind = type(value).__name__
            raise SeqpackTypeError(f"{name} must hold real numbers{where}, got {name}[{i}]={value!r} ({kind})")
    try:
        return arr.reshape(-1).astype(np.float64)
    except (TypeError, ValueError, OverflowError):  # e.g. an int past float64 in an object array
        raise SeqpackTypeError(f"{name} must be float64 numbers{where}, got {values!r:.60}") from None


def _is_number_array(value: object) -> bool:
    """A one-element array or tensor of ints or floats (``torch.tensor(0.1)``)."""
    if not hasattr(value, "__array__"):
        return False
    arr = np.asarray(value)
    return arr.size == 1 and arr.dtype.kind in "iuf"


def int64_array(
    name: str,
    value: object,
    *,
    error: type[Exception] = SeqpackTypeError,
    too_large: type[Exception] | None = None,
    integral_floats: bool = False,
    element: str | None = None,
) -> np.ndarray:
    """``value`` as an int64 array of the same shape (a new array): integers only, none past
    int64 (never wrapped). The one coercer behind every int64 array seqpack accepts.

    Args:
        name: What the value is, for messages (``"lengths"``, ``"origin"``).
        error: Raised for values that are not integers (floats, strings, bools, ragged lists).
        too_large: Raised for an integer past ``2**63 - 1`` (default: ``error``).
        integral_floats: Accept finite floats with integral values (``4.0``); an empty float
            array is always accepted.
        element: How a message names one element: a format string with ``{index}``
            (default ``"{name} element {index}"``), e.g. ``"sample {index} has length"``.
    """
    too_large = too_large or error
    label = element or f"{name} element {{index}} is"

    def past_int64(index: int, number: object) -> Exception:
        return too_large(f"{label.format(index=index)} {number}, too large (at most 2**63 - 1)")

    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged lists, device tensors
        raise error(f"{name} must be integers, got {value!r:.60}") from None
    if array.size == 0:
        return np.zeros(array.shape, dtype=np.int64)
    if isinstance(value, (list, tuple)) and array.dtype.kind in "iu" and {bool, np.bool_} & set(map(type, value)):
        array = np.asarray(value, dtype=object)  # [3, True] reads as [3, 1]: let the element scan name the bool
    flat = array.reshape(-1)
    if array.dtype.kind == "O":
        items = flat.tolist()
        for i, item in enumerate(items):
            if not isinstance(item, numbers.Integral) or isinstance(item, bool):
                raise error(f"{name} must be integers, got {item!r:.60} ({label.format(index=i)} not one)")
        top = max(items)
        if top > INT64_MAX:
            raise past_int64(items.index(top), int(top))
        return np.array([int(v) for v in items], dtype=np.int64).reshape(array.shape)
    if array.dtype.kind == "f" and integral_floats:
        if not (np.all(np.isfinite(flat)) and np.all(flat == np.round(flat))):
            raise error(f"{name} must be integers, got dtype {array.dtype}")
        if flat.max() >= 2.0**63:
            i = int(np.argmax(flat))
            raise past_int64(i, f"{float(flat[i]):.0f}")
    elif array.dtype.kind not in "iu":
        raise error(f"{name} must be integers, got dtype {array.dtype}")
    elif array.dtype == np.uint64 and int(flat.max()) > INT64_MAX:
        i = int(np.argmax(flat))
        raise past_int64(i, int(flat[i]))
    return np.array(array, dtype=np.int64)


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


def check_mapping(name: str, value: object) -> Mapping[str, Any]:
    """``value`` as a mapping (a dict of fields, a batch, a state)."""
    if not isinstance(value, Mapping):
        raise SeqpackTypeError(f"{name} must be a mapping (a dict), got {type(value).__name__}")
    return value


def check_path(name: str, value: object) -> str:
    """``value`` as a file path string (``str`` or ``os.PathLike`` of one; bytes refused)."""
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path or "\x00" in path:
        raise SeqpackTypeError(f"{name} must be a file path (str or os.PathLike), got {value!r}")
    return path


def check_tensor(name: str, value: object, *, min_dim: int = 0) -> torch.Tensor:
    """``value`` as a ``torch.Tensor`` with at least ``min_dim`` dimensions."""
    import torch  # here, not at the top: the layers above that plan (schedulers, cost, cli) need no torch

    if not isinstance(value, torch.Tensor):
        raise SeqpackTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() < min_dim:
        raise ConfigError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(value.shape)}")
    return value


def memory_limit() -> int | None:
    """Bytes this process can ever hold: physical memory, lowered by a cgroup (v2) limit or
    ``RLIMIT_AS`` when one is set; ``None`` where the platform does not say."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # not POSIX
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limits.append(int(f.read().strip()))  # "max" (no limit) is not an int
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    positive = [limit for limit in limits if limit > 0]
    return min(positive) if positive else None


def check_fits_memory(what: str, nbytes: int) -> None:
    """Refuse, before allocating, what needs more memory than this machine has at all.

    Args:
        what: The request, with the argument that sized it (``"n=10**12 lengths"``).
        nbytes: A lower estimate of the bytes it needs.

    Raises:
        ConfigError: ``nbytes`` exceeds :func:`memory_limit`.
    """
    if nbytes < 1 << 30:  # below 1 GiB nothing is absurd: skip the system calls
        return
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        raise ConfigError(
            f"{what} is too large: it needs at least {_gib(nbytes)} of memory, more than the {_gib(limit)} this "
            "process may use"
        )


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
