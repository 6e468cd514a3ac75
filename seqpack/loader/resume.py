"""The wrapper's resume state: one dataclass, versioned, checked on load."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from seqpack.errors import ResumeError
from seqpack.options import AXES, INT64_MAX
from seqpack.validation import check_int

__all__ = ["ResumeState", "StateKey", "Stateful"]


@runtime_checkable
class Stateful(Protocol):
    """What ``torch.distributed.checkpoint`` saves and loads: torch's own ``Stateful``
    protocol, declared here because importing ``torch.distributed.checkpoint`` is slow."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class StateKey(StrEnum):
    """The keys of a resume state's dict form, declared once (``ResumeState``'s fields are
    these but ``VERSION``, checked below)."""

    VERSION = "version"
    TOPOLOGY = "topology"
    CONFIG = "config"
    CONFIG_FINGERPRINT = "config_fingerprint"
    STEPS = "steps"
    CONSUMED = "consumed"
    DEFERRED_SAMPLES = "deferred_samples"
    ITERATOR = "iterator"
    SCHEDULER = "scheduler"
    FINISHED = "finished"
    DROPPED_AT_END = "dropped_at_end"
    EMPTY_AT_END = "empty_at_end"
    DATA_ENDED = "data_ended"
    CALIBRATION = "calibration"


@dataclasses.dataclass
class ResumeState:
    """One rank's resume state, as ``PackingIterator.state_dict()`` returns it (a dict).

    Attributes:
        topology: ``Topology.signature()`` it was taken on (sizes and ranks).
        config: ``PackingConfig.summary()``: every setting that changes the data.
        config_fingerprint: ``PackingConfig.fingerprint()``.
        steps: Steps consumed by the training loop (prefetched ones not counted).
        consumed: Samples taken from the data iterator by those steps.
        deferred_samples: Samples read but held back for the next step (tensors).
        iterator: The data iterator's own ``state_dict()``, when it has one.
        scheduler: The scheduler's ``state_dict()``, when it has one.
        finished: The iterator has ended.
        dropped_at_end: Sequences dropped with a partial last step.
        empty_at_end: Zero-length samples read in the step that found the end of data.
        data_ended: Some rank's data ran out; no rank reads again.
        calibration: The online calibrator's state (``TimingLedger.state_dict()``) under
            ``calibrate``, else None.
    """

    VERSION: ClassVar[int] = 4
    KEYS: ClassVar[tuple[str, ...]] = tuple(key.value for key in StateKey)

    topology: dict[str, int]
    config: dict[str, str]
    config_fingerprint: int
    steps: int = 0
    consumed: int = 0
    deferred_samples: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    iterator: Any = None
    scheduler: Any = None
    finished: bool = False
    dropped_at_end: int = 0
    empty_at_end: int = 0
    data_ended: bool = False
    calibration: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.VERSION, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        """Parse and check a saved state of this version.

        Raises:
            ResumeError: Not a mapping, missing keys, an unknown version, or negative counts.
        """
        if not isinstance(state, Mapping):
            raise ResumeError(f"state must be a PackingIterator.state_dict() mapping, got {type(state).__name__}")
        version = state.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version != cls.VERSION:
            raise ResumeError(f"state version {version!r:.40} is not {cls.VERSION}")
        missing = [k for k in cls.KEYS if k not in state]
        if missing:
            raise ResumeError(f"state is missing keys {missing}; expected a PackingIterator.state_dict()")
        fields: dict[str, Any] = {name: state[name] for name in cls.KEYS if name != StateKey.VERSION}
        for name in ("steps", "consumed", "dropped_at_end", "empty_at_end", "config_fingerprint"):
            maximum = INT64_MAX if name == "config_fingerprint" else None
            try:
                fields[name] = check_int(f"state[{name!r}]", state[name], minimum=0, maximum=maximum)
            except ValueError as exc:
                raise ResumeError(str(exc)) from None
        topology = state["topology"]
        if not isinstance(topology, Mapping) or set(topology) != {f"{a}_{k}" for a in AXES for k in ("size", "rank")}:
            raise ResumeError(f"state['topology'] is not a Topology.signature(): {topology!r}")
        config = state["config"]
        if not isinstance(config, Mapping):
            raise ResumeError(f"state['config'] is not a PackingConfig.summary(): {config!r:.60}")
        for name in ("finished", "data_ended"):
            value = state[name]
            if not isinstance(value, (bool, np.bool_)):
                raise ResumeError(f"state[{name!r}] must be True or False, got {value!r:.40}")
            fields[name] = bool(value)
        deferred = state["deferred_samples"]
        if not isinstance(deferred, list) or not all(isinstance(s, Mapping) for s in deferred):
            raise ResumeError("state['deferred_samples'] must be a list of samples")
        fields.update(topology=dict(topology), config=dict(config), deferred_samples=[dict(s) for s in deferred])
        return cls(**fields)

    def check_fits(self, topology: Mapping[str, int], summary: Mapping[str, str], fingerprint: int) -> None:
        """Raise :class:`ResumeError` unless this state was saved on ``topology`` (a
        ``Topology.signature()``) with a ``PackingConfig`` that makes the same data as the
        one of ``summary`` and ``fingerprint`` (its ``summary()`` and ``fingerprint()``)."""
        if self.topology != dict(topology):
            raise ResumeError(
                f"state was saved on topology {_fmt(self.topology)} but this iterator runs on {_fmt(topology)}"
            )
        if self.config_fingerprint == fingerprint:
            return
        here = dict(summary)
        changed = "; ".join(
            f"{key}: {self.config.get(key)!r} (saved) vs {here.get(key)!r} (here)"
            for key in sorted(set(here) | set(self.config))
            if self.config.get(key) != here.get(key)
        )
        raise ResumeError(f"state was saved with another configuration: {changed or 'fingerprints differ'}")


_FIELDS = {field.name for field in dataclasses.fields(ResumeState)}
assert _FIELDS == {key.value for key in StateKey} - {StateKey.VERSION}, "ResumeState fields and StateKey differ"


def _fmt(signature: Mapping[str, int]) -> str:
    return " ".join(f"{a}={signature[f'{a}_rank']}/{signature[f'{a}_size']}" for a in AXES)
