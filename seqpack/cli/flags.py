"""Command-line flags derived from a settings dataclass, and the dataclass built back from them.

A settings class declares each field once, with its help text in the field's metadata::

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Settings:
        steps: int = option(4, help="measured steps")
        modes: tuple[Mode, ...] = option(tuple(Mode), help="modes to run", metavar="LIST")

:func:`add_options` turns every field into a flag (``--steps``; the type, choices and
default come from the annotation and the default) and :func:`from_args` builds the
dataclass from the parsed namespace, so its ``__post_init__`` applies the same rules to a
Python caller and to the command line. Supported annotations: ``int``, ``float``, ``str``,
``bool`` (a switch), a ``StrEnum`` (its values become the choices), ``X | None`` and
``tuple[X, ...]`` (a comma-separated list).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["add_options", "flag_name", "from_args", "option"]

T = TypeVar("T")
_META = "seqpack.cli"


@dataclasses.dataclass(frozen=True)
class _Option:
    help: str
    metavar: str | None


def option(default: Any, *, help: str, metavar: str | None = None) -> Any:
    """A dataclass field with a default and the help text (and optionally the metavar) of its
    command-line flag."""
    return dataclasses.field(default=default, metadata={_META: _Option(help=help, metavar=metavar)})


def flag_name(field: dataclasses.Field[Any] | str) -> str:
    """``--max-seq-len`` for the field ``max_seq_len``."""
    return "--" + (field if isinstance(field, str) else field.name).replace("_", "-")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0], True
        raise TypeError(f"unsupported union {tp!r}: only X | None")
    return tp, False


def _scalar(tp: Any) -> tuple[Callable[[str], Any], list[str] | None]:
    """(argparse ``type``, choices) of a scalar annotation."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return str, [str(member.value) for member in tp]
    if tp in (int, float, str):
        return tp, None
    raise TypeError(f"unsupported option type {tp!r}")


def _comma_list(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        return tuple(item(part.strip()) for part in text.split(",") if part.strip())

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'value')}"  # argparse names it in errors
    return parse


def _shown(value: Any) -> Any:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value) if isinstance(value, enum.Enum) else value


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """Add a flag for every field of the dataclass ``cls`` (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name} needs a default to become a flag")
        meta = field.metadata.get(_META)
        help_text = meta.help if meta is not None else None
        kwargs: dict[str, Any] = {"dest": field.name}
        tp, optional = _unwrap_optional(hints[field.name])
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if field.default else "store_true"
            kwargs["default"] = field.default
        else:
            if typing.get_origin(tp) is tuple:
                item_type, ellipsis = typing.get_args(tp)
                if ellipsis is not Ellipsis:
                    raise TypeError(f"{cls.__name__}.{field.name}: only tuple[X, ...] becomes a flag")
                item, choices = _scalar(item_type)
                kwargs["type"] = _comma_list(item)
                kwargs["metavar"] = "LIST"
                if choices:
                    help_text = f"{help_text}; comma-separated, of {', '.join(choices)}"
            else:
                kwargs["type"], choices = _scalar(tp)
                if choices:
                    kwargs["choices"] = choices
            kwargs["default"] = field.default
            if not optional or field.default is not None:
                help_text = f"{help_text} (default: {_shown(field.default)})" if help_text else None
        if meta is not None and meta.metavar:
            kwargs["metavar"] = meta.metavar
        help_text = help_text.replace("%", "%%") if help_text else None  # argparse %-formats help
        parser.add_argument(flag_name(field), help=help_text, **kwargs)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass ``cls`` built from the flags :func:`add_options` added."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: getattr(args, f.name) for f in fields})
