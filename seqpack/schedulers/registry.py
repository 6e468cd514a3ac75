"""The schedulers by name (the package :mod:`seqpack.schedulers` registers the built-in ones)."""

from __future__ import annotations

import inspect

from seqpack.errors import ConfigError
from seqpack.schedulers.base import Scheduler
from seqpack.schedulers.dynamic_cp.scheduler import DynamicCpScheduler

_REGISTRY: dict[str, type[Scheduler]] = {}

__all__ = ["available_schedulers", "get_scheduler", "register_scheduler"]


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    """Class decorator: make ``cls`` available to :func:`get_scheduler` under ``cls.name``."""
    if not cls.name:
        raise ConfigError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def available_schedulers(*, dynamic_cp: bool = False) -> list[str]:
    """Names :func:`get_scheduler` accepts whose plans are static CP; with ``dynamic_cp=True``
    also those planning dynamic CP (``"dynamic_cp"``)."""
    return sorted(name for name, cls in _REGISTRY.items() if dynamic_cp or not issubclass(cls, DynamicCpScheduler))


def get_scheduler(name: str | Scheduler = "balanced", **options: object) -> Scheduler:
    """The scheduler registered as ``name`` (:func:`available_schedulers`), built with the
    keyword arguments ``options`` of its class; a Scheduler instance is returned as is.

    Raises:
        ValueError: Unknown name, or options given with an instance.
    """
    if isinstance(name, Scheduler):
        if options:
            raise ConfigError("options cannot be given with a Scheduler instance")
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        names = ", ".join(available_schedulers(dynamic_cp=True))
        raise ConfigError(f"unknown scheduler {name!r}; available: {names}")
    cls, signature = _REGISTRY[name], inspect.signature(_REGISTRY[name])
    try:
        signature.bind(**options)
    except TypeError:
        valid = [p for p in signature.parameters if p not in ("self", "args", "kwargs")]
        unknown = sorted(set(options) - set(valid))
        raise ConfigError(f"unknown option(s) {unknown} of scheduler {name!r}; valid: {', '.join(valid)}") from None
    return cls(**options)
