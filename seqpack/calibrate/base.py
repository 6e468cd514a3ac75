"""Calibrator: the machinery every online calibrator shares.

A calibrator keeps a sliding window of timed microbatches, each reduced to a fixed number
of exact integers (its *sums*: ``S, SS[, SW]`` for a :class:`~seqpack.calibrate.CostCalibrator`,
``size, S, SS, spans`` for dynamic CP's ``GroupCostCalibrator``), with its seconds and step.
This base holds what does not depend on the model: the window, the time filter, the
warm-up steps, the cached fit, the counters, the resume state and the copy. A subclass
supplies its prior's type, the width and validity of a point's sums, the fit, how a
scheduled step is reduced to sums (:meth:`Calibrator.schedule_sums`) and how its model
travels in a resume state (:meth:`Calibrator.model_to_list`).

State (version 1, plain Python values)::

    {"version": 1, ["kind": "group",] "points": [[*sums, seconds, step], ...],
     "skipped": int, "observed": int, "last_step": int | None, [subclass keys]}

``kind`` is absent for a ``CostCalibrator`` (as saved since version 1) and ``"group"`` for
a ``GroupCostCalibrator``: each refuses the other's state by name.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

import numpy as np

from seqpack._logging import warn_once
from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.validation import check_bool, check_int, check_numbers

__all__ = ["MAX_SECONDS", "MAX_STEP", "MAX_WINDOW", "MIN_SECONDS", "Calibrator", "check_lengths_count", "check_seconds"]

logger = logging.getLogger(__name__)

MAX_WINDOW = 1 << 24
"""The most timed microbatches a calibrator keeps (each refit reads them all, in Python)."""
MAX_STEP = (1 << 63) - 1  # steps travel and are saved as int64

MIN_SECONDS = 2.0**-120
MAX_SECONDS = 2.0**120
"""Times the calibrators fit (about 7.5e-37 to 1.3e36 s): beyond them no clock measured a
microbatch, and their squares (relative weights) would leave float64. Others are skipped
and counted like NaN."""

# One observation: the microbatch's exact sums, its seconds, its step (-1: none).
Point: TypeAlias = tuple[tuple[int, ...], float, int]

ModelT = TypeVar("ModelT")
CalibratorT = TypeVar("CalibratorT", bound="Calibrator[Any]")


def check_lengths_count(name: str, values: object, where: str = "") -> int:
    """How many microbatches a per-microbatch argument holds (``len``), refusing what has
    none (a string, a number, a 0-d array or tensor).

    Raises:
        SeqpackTypeError: ``values`` is no sequence, named with its type.
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or getattr(values, "ndim", 1) == 0:
        raise SeqpackTypeError(
            f"{name} must be a sequence, one entry per microbatch{where}, got {type(values).__name__}"
        )
    return len(values)


def check_seconds(name: str, values: object, where: str = "") -> np.ndarray:
    """Measured times as a 1-D float64 array: a sequence, a 1-D array or tensor, or one
    number (NaN, infinities and non-positive times pass: callers skip and count them).

    Raises:
        SeqpackTypeError: An element that is no real number (a string, a bool, ``None``),
            named with its index, or an array of 2 or more dimensions (its shape named:
            which axis is the microbatch is a guess seqpack does not make).
    """
    try:
        shape = np.asarray(values).shape
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged nesting: check_numbers names it
        shape = ()
    if len(shape) > 1:
        raise SeqpackTypeError(f"{name} must be one time per microbatch (1-D){where}, got an array of shape {shape}")
    return check_numbers(name, values, where=where)


class Calibrator(Generic[ModelT]):
    """A model fitted online to measured microbatch times (the module docstring).

    Args:
        prior: The model used until ``min_points`` timings are in.
        window: Keep the newest this many timed microbatches (at least 3).
        min_points: Fit once this many valid timings are in (at least 3, at most ``window``).
        robust: Fit with outlier rejection.
        prior_in_seconds: The prior predicts seconds.
        warmup_steps: Ignore the times of steps ``0 .. warmup_steps-1``.

    Subclasses set :attr:`prior_type`, :attr:`KIND` and :attr:`num_sums`, and implement
    :meth:`_fit`, :meth:`_check_sums`, :meth:`schedule_sums`, :meth:`model_to_list` and
    :meth:`model_from_list`.
    """

    STATE_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str | None] = None  # the state's "kind" (None: the key is absent)
    prior_type: ClassVar[type]
    prior_name: ClassVar[str]  # how messages name the prior's type

    def __init__(
        self,
        prior: ModelT,
        *,
        window: int = 1024,
        min_points: int = 32,
        robust: bool = True,
        prior_in_seconds: bool = False,
        warmup_steps: int = 1,
    ) -> None:
        if not isinstance(prior, self.prior_type):
            raise SeqpackTypeError(f"prior must be a {self.prior_name}, got {type(prior).__name__}")
        self.prior = prior
        self.window = check_int("window", window, minimum=3, maximum=MAX_WINDOW)
        self.min_points = check_int("min_points", min_points, minimum=3)
        if self.min_points > self.window:
            raise ConfigError(f"min_points={self.min_points} is larger than window={self.window}")
        self.robust = check_bool("robust", robust)
        self.prior_in_seconds = check_bool("prior_in_seconds", prior_in_seconds)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
        self._points: collections.deque[Point] = collections.deque(maxlen=self.window)
        self.skipped = 0  # timings that were NaN, infinite, <= 0 or outside [MIN_SECONDS, MAX_SECONDS]
        self.observed = 0  # valid timings ever observed (also those that left the window)
        self.last_step: int | None = None
        self._model: ModelT | None = None  # cache of the fit; None = refit on demand

    # -- settings -----------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The keyword arguments (after ``prior``) that rebuild this calibrator, in order."""
        return {
            "window": self.window,
            "min_points": self.min_points,
            "robust": self.robust,
            "prior_in_seconds": self.prior_in_seconds,
            "warmup_steps": self.warmup_steps,
        }

    def __repr__(self) -> str:
        # Settings only (what PackingConfig fingerprints: keep it stable), not the observations.
        words = ", ".join(f"{name}={value}" for name, value in self.settings().items())
        return f"{type(self).__name__}(prior={self.prior!r}, {words})"

    @property
    def num_sums(self) -> int:
        """How many integers one timed microbatch is reduced to."""
        raise NotImplementedError

    @property
    def num_points(self) -> int:
        """Timings in the window."""
        return len(self._points)

    @property
    def fitted(self) -> bool:
        """Whether :attr:`model` is fitted (else it is the prior)."""
        return len(self._points) >= self.min_points

    @property
    def in_seconds(self) -> bool:
        """Whether :attr:`model` predicts seconds (fitted, or a prior in seconds)."""
        return self.fitted or self.prior_in_seconds

    # -- observations -------------------------------------------------------------------------

    def _add(self, rows: Sequence[tuple[int, ...]], times: Sequence[float], step: int | None) -> int:
        """Observe microbatches given as exact sums (what :meth:`observe` and the ledger
        call). NaN, infinite and non-positive times (an untimed microbatch) are skipped and
        counted; a positive time outside ``[MIN_SECONDS, MAX_SECONDS]`` also, with a
        warning (once per calibrator class). Returns how many timings were kept."""
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step
        if step is not None and step < self.warmup_steps:
            return 0
        kept = 0
        for sums, t in zip(rows, times, strict=True):
            if not (math.isfinite(t) and MIN_SECONDS <= t <= MAX_SECONDS):
                self.skipped += 1
                if math.isfinite(t) and t > 0:
                    warn_once(
                        logger,
                        f"absurd-time:{type(self).__name__}",
                        "step %s: a microbatch time of %r s is outside [%.2g, %.2g] s; it is skipped (counted in "
                        "%s.skipped); further ones are not reported",
                        step,
                        t,
                        MIN_SECONDS,
                        MAX_SECONDS,
                        type(self).__name__,
                    )
                continue
            self._points.append((tuple(int(v) for v in sums), float(t), -1 if step is None else step))
            kept += 1
        if kept:
            self.observed += kept
            self._model = None
        return kept

    @property
    def model(self) -> ModelT:
        """The fitted model once :attr:`fitted`, else the prior."""
        if not self.fitted:
            return self.prior
        if self._model is None:
            self._model = self._fit()
        return self._model

    def _fit(self) -> ModelT:
        raise NotImplementedError

    def _check_sums(self, sums: tuple[int, ...]) -> str | None:
        """What is wrong with one point's sums (``None``: nothing)."""
        return None if min(sums) >= 0 else "a negative length sum"

    # -- what the ledger asks ---------------------------------------------------------------------

    def schedule_sums(self, schedule: Any) -> np.ndarray:
        """int64 ``[M, dp, num_sums]``: the sums of every microbatch of a scheduled step."""
        raise NotImplementedError

    def sums_hint(self) -> str:
        """How a caller computes :meth:`schedule_sums` (for messages)."""
        return f"{type(self).__name__}.schedule_sums(schedule)"

    def predict_sums(self, model: ModelT, sums: np.ndarray) -> np.ndarray:
        """float64 ``[...]``: what ``model`` predicts for microbatches given as sums
        (:meth:`schedule_sums`' last axis)."""
        raise NotImplementedError

    def model_to_list(self, model: ModelT) -> list[float]:
        """A model as plain floats for a resume state."""
        raise NotImplementedError

    def model_from_list(self, values: Sequence[float]) -> ModelT:
        """Inverse of :meth:`model_to_list`."""
        raise NotImplementedError

    # -- Stateful -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Observations (``[*sums, seconds, step]`` each) and counters, plain Python values."""
        state: dict[str, Any] = {"version": self.STATE_VERSION}
        if self.KIND is not None:
            state["kind"] = self.KIND
        state.update(
            points=[[*sums, t, k] for sums, t, k in self._points],
            skipped=self.skipped,
            observed=self.observed,
            last_step=self.last_step,
        )
        return state

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a state this calibrator cannot take (beyond version and kind)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the settings stay this calibrator's; a smaller window
        keeps the newest points).

        Raises:
            ResumeError: Not this kind of calibrator's state, another version, or a
                malformed one (named).
        """
        name = type(self).__name__
        if not isinstance(state, Mapping):
            raise ResumeError(f"calibrator state must be a {name}.state_dict() (a mapping), got {type(state).__name__}")
        kind = state.get("kind")
        if state.get("version") != self.STATE_VERSION or kind != self.KIND:
            what = (
                "a GroupCostCalibrator's" if kind == "group" else "a CostCalibrator's" if kind is None else repr(kind)
            )
            raise ResumeError(
                f"calibrator state must be a {name}.state_dict() of version {self.STATE_VERSION}, got {what} of "
                f"version {state.get('version')!r}"
            )
        self._check_state(state)
        width = self.num_sums
        try:
            points = [_point(item, width) for item in state["points"]]
            skipped, observed = _count(state["skipped"]), _count(state["observed"])
            last = state.get("last_step")
            last_step = None if last is None else int(last)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"{name} state is malformed: {exc}") from None
        for i, (sums, t, _) in enumerate(points):
            problem = self._check_sums(sums) if math.isfinite(t) and t > 0 else f"the time {t!r}"
            if problem is not None:
                raise ResumeError(f"{name} state is malformed: point {i} ({[*sums, t]}) has {problem}")
        self._points = collections.deque(points, maxlen=self.window)
        self.skipped, self.observed, self.last_step = skipped, observed, last_step
        self._model = None

    def copy(self: CalibratorT) -> CalibratorT:
        """A calibrator with the same settings and observations."""
        other = type(self)(self.prior, **self.settings())
        other.load_state_dict(self.state_dict())
        return other


def _point(item: Sequence[Any], width: int) -> Point:
    """A saved ``[*sums, seconds, step]`` with ``width`` sums."""
    if isinstance(item, (str, bytes)) or len(item) != width + 2:
        raise ValueError(f"a point has {len(item)} values, expected {width + 2}")
    return tuple(int(v) for v in item[:width]), float(item[width]), int(item[width + 1])


def _count(value: Any) -> int:
    count = int(value)
    if count < 0:
        raise ValueError(f"a negative count {value!r}")
    return count
