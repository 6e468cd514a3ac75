"""What a careless or hostile caller passes, and the contract every answer must keep.

The contract (docs/errors.md): a user's mistake is a :class:`~seqpack.errors.SeqpackError`
(a ``ValueError``) or :class:`~seqpack.errors.SeqpackTypeError` (also a ``TypeError``) whose
message names the offending argument; anything else escaping seqpack is a bug. A call that
succeeds with a value of the wrong kind (a float where a count belongs, ``1`` for a flag) is
a silent change, and also a failure.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from seqpack.errors import SeqpackError

# Curated, not random: a random mid-sized count (dp_size=50_000) is a valid but slow request,
# which is the scale suite's business. These are either small or absurd (refused before any
# allocation on every machine).
HOSTILE: list[tuple[str, Callable[[], Any]]] = [
    ("None", lambda: None),
    ("True", lambda: True),
    ("False", lambda: False),
    ("0", lambda: 0),
    ("-1", lambda: -1),
    ("1", lambda: 1),
    ("2", lambda: 2),
    ("3", lambda: 3),
    ("2**31", lambda: 2**31),
    ("2**45", lambda: 2**45),
    ("2**53+1", lambda: 2**53 + 1),
    ("2**63-1", lambda: 2**63 - 1),
    ("2**63", lambda: 2**63),
    ("2**64", lambda: 2**64),
    ("-2**63", lambda: -(2**63)),
    ("0.5", lambda: 0.5),
    ("2.0", lambda: 2.0),
    ("-0.0", lambda: -0.0),
    ("nan", lambda: math.nan),
    ("inf", lambda: math.inf),
    ("-inf", lambda: -math.inf),
    ("1e300", lambda: 1e300),
    ("1j", lambda: 1j),
    ("np.int64(-3)", lambda: np.int64(-3)),
    ("np.int32(4)", lambda: np.int32(4)),
    ("np.uint64(2**64-1)", lambda: np.uint64(2**64 - 1)),
    ("np.float32(2.5)", lambda: np.float32(2.5)),
    ("np.bool_(True)", lambda: np.bool_(True)),
    ("''", lambda: ""),
    ("'abc'", lambda: "abc"),
    ("'1'", lambda: "1"),
    ("' 4 '", lambda: " 4 "),
    ("'\\x00'", lambda: "\x00"),
    ("b'1'", lambda: b"1"),
    ("[]", lambda: []),
    ("[1]", lambda: [1]),
    ("[[1]]", lambda: [[1]]),
    ("[1, 'a']", lambda: [1, "a"]),
    ("(0, 2**64)", lambda: (0, 2**64)),
    ("{}", lambda: {}),
    ("{'a': 1}", lambda: {"a": 1}),
    ("set()", lambda: set()),
    ("object()", lambda: object()),
    ("print", lambda: print),
    ("np.array([])", lambda: np.array([])),
    ("np.array([1.5])", lambda: np.array([1.5])),
    ("np.array([-1])", lambda: np.array([-1])),
    ("np.array([2**63], uint64)", lambda: np.array([2**63], dtype=np.uint64)),
    ("np.zeros((2, 2))", lambda: np.zeros((2, 2))),
    ("np.array(['a'])", lambda: np.array(["a"])),
    ("torch.tensor([1.5])", lambda: torch.tensor([1.5])),
    ("torch.tensor([], int64)", lambda: torch.tensor([], dtype=torch.int64)),
    ("torch.zeros(2, 2)", lambda: torch.zeros(2, 2)),
    ("torch.tensor([True])", lambda: torch.tensor([True])),
    ("torch.tensor([-1])", lambda: torch.tensor([-1])),
    ("torch.tensor([2**62])", lambda: torch.tensor([2**62])),
    ("torch.tensor([0, 3], uint8)", lambda: torch.tensor([0, 3], dtype=torch.uint8)),
    ("torch.tensor(7)", lambda: torch.tensor(7)),
]

hostile_values = st.sampled_from(HOSTILE).map(lambda named: named[1]())


# What a successful call may have been given, per kind of argument.
def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


KINDS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "opt_int": lambda v: v is None or _is_int(v),
    "bool": lambda v: isinstance(v, (bool, np.bool_)),
    "opt_bool": lambda v: v is None or isinstance(v, (bool, np.bool_)),
    "number": lambda v: isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v),
    "opt_number": lambda v: v is None or KINDS["number"](v),
    "str": lambda v: isinstance(v, str),
    "auto_or_bool": lambda v: (isinstance(v, str) and v == "auto") or isinstance(v, (bool, np.bool_)),
    "any": lambda v: True,
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One public callable: how to call it with valid arguments, and what may be spoiled.

    Attributes:
        call: ``call(**kwargs)``.
        valid: Fresh valid keyword arguments.
        args: Argument name -> kind (a key of :data:`KINDS`) of the arguments to spoil.
        aliases: Other words a message may use for an argument (``capacity`` for
            ``max_tokens_per_rank``).
        os_errors: Argument names that are paths: OSErrors about the file are allowed.
    """

    name: str
    call: Callable[..., Any]
    valid: Callable[[], dict[str, Any]]
    args: dict[str, str]
    aliases: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    os_errors: tuple[str, ...] = ()


def check_answer(target: Target, arg: str, value: Any, kwargs: dict[str, Any]) -> str:
    """Call ``target`` with ``kwargs`` (``arg`` spoiled to ``value``); assert the contract.

    Returns:
        ``"ok"`` or ``"refused"`` (for the not-vacuous counts).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # numpy overflow: a silently wrong result
            target.call(**kwargs)
    except SeqpackError as exc:  # SeqpackTypeError included
        message = str(exc)
        words = (arg, *target.aliases.get(arg, ()))
        assert any(word in message for word in words), (
            f"{target.name}({arg}={value!r}): the message does not name {words}: {message}"
        )
        assert "\n" not in message.strip() or "Traceback" not in message, message
        return "refused"
    except OSError as exc:
        assert arg in target.os_errors, f"{target.name}({arg}={value!r}) raised {type(exc).__name__}: {exc}"
        return "refused"
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        raise AssertionError(
            f"{target.name}({arg}={value!r}) raised {type(exc).__name__} (not a SeqpackError): {exc}"
        ) from exc
    kind = target.args[arg]
    assert KINDS[kind](value), f"{target.name} accepted {arg}={value!r} where a {kind} belongs: a silent change"
    return "ok"


def spoil_one(target: Target, data: Any) -> str:
    """Spoil one argument of ``target``'s valid call, drawn from ``data`` (hypothesis'
    ``st.data()``) with a :data:`hostile_values` value, and check the answer
    (:func:`check_answer`)."""
    kwargs = target.valid()
    arg = data.draw(st.sampled_from(sorted(target.args)))
    value = data.draw(hostile_values)
    kwargs[arg] = value
    return check_answer(target, arg, value, kwargs)
