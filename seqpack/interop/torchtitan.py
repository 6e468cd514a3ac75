"""torchtitan 0.3: a :class:`~seqpack.topology.Topology` from its ``ParallelDims``
(:func:`topology`: DP is its ``batch`` mesh) and a dataloader that feeds its ``Trainer`` one
seqpack step per optimizer step (:class:`SeqpackDataLoader`, :func:`install`): exactly
``gradient_accumulation_steps * num_pipeline_parallel_microbatches`` microbatches, each
``({"input": [1, T], "positions": [1, T]}, labels)``, with ``step.num_loss_tokens`` its loss
normaliser. docs/integrations.md, "torchtitan". torchtitan itself is never imported here.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from seqpack.errors import ConfigError, ResumeError, SeqpackTypeError
from seqpack.loader.iterator import PackingIterator
from seqpack.thd.batch import PackedBatch
from seqpack.topology import Topology
from seqpack.validation import check_bool, check_positive_int

__all__ = ["DATA_AXES", "SeqpackDataLoader", "install", "to_torchtitan", "topology"]

logger = logging.getLogger(__name__)

DATA_AXES: tuple[str, ...] = ("pp", "batch", "cp", "tp")
"""torchtitan 0.3's data-loading mesh axes, in its order."""


def topology(parallel_dims: Any, *, shard_cp: bool = False) -> Topology:
    """The seqpack topology of a torchtitan 0.3 ``ParallelDims`` (its mesh built or not).

    Args:
        parallel_dims: torchtitan's ``ParallelDims`` (``trainer.parallel_dims``).
        shard_cp: ``False`` (for :class:`SeqpackDataLoader`): seqpack packs over the
            ``batch`` mesh only and torchtitan shards CP itself. ``True`` (your own loop): the
            enabled axes of ``(pp, batch, cp, tp)`` as seqpack's pp, dp, cp, tp, and seqpack
            shards every sequence over CP.

    Returns:
        A :class:`Topology`; one rank (``Topology.single``) when no such axis is enabled,
        ``partial`` (each batch lane packs alone) when ``shard_cp=False`` leaves ranks out
        of the ``batch`` mesh.

    Raises:
        SeqpackTypeError: Not a ``ParallelDims`` (no ``get_optional_mesh``).
    """
    get_optional_mesh = getattr(parallel_dims, "get_optional_mesh", None)
    if get_optional_mesh is None:
        raise SeqpackTypeError(
            "parallel_dims must be torchtitan's ParallelDims (trainer.parallel_dims), "
            f"got {type(parallel_dims).__name__}"
        )
    shard_cp = check_bool("shard_cp", shard_cp)
    wanted = DATA_AXES if shard_cp else ("batch",)
    axes = [axis for axis in wanted if get_optional_mesh(axis) is not None]
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if not axes:
        return Topology.single(allow_distributed=world > 1)
    names = axes if len(axes) > 1 else axes[0]
    mesh = parallel_dims.get_mesh(names)
    if not isinstance(mesh, DeviceMesh):
        raise SeqpackTypeError(
            f"parallel_dims.get_mesh({names!r}) returned a {type(mesh).__name__}, not a DeviceMesh: parallel_dims "
            "must be torchtitan's ParallelDims with its meshes built (trainer.parallel_dims)"
        )
    return Topology.from_device_mesh(mesh, partial=int(mesh.size()) < world)


def to_torchtitan(batch: PackedBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A packed microbatch as torchtitan's trainer takes one: ``({"input": [1, T],
    "positions": [1, T]}, labels [1, T])``. ``positions`` restart at 0 per sequence (and keep
    counting through its pad), which is where torchtitan's document masks cut."""
    if not isinstance(batch, PackedBatch):
        raise SeqpackTypeError(
            f"to_torchtitan takes a seqpack PackedBatch (a Step's microbatch), got {type(batch).__name__}"
        )
    if batch.input_ids is None or batch.labels is None:
        raise ConfigError("to_torchtitan needs a microbatch with input_ids and labels (this rank holds no tokens)")
    return {"input": batch.input_ids[None], "positions": batch.position_ids[None]}, batch.labels[None]


class SeqpackDataLoader:
    """torchtitan 0.3's dataloader contract (``__iter__`` of ``(input_dict, labels)``,
    ``state_dict`` / ``load_state_dict``) over a seqpack :class:`PackingIterator`.

    Each optimizer step of the trainer takes the microbatches of one seqpack step, in order;
    a step of another count raises :class:`ConfigError` naming both. The state is
    ``{"dp_rank_<r>": bytes, "world_size": dp}`` (torchtitan's own layout), the bytes a
    pickle of seqpack's resume state as of the step in progress and how many of its
    microbatches were handed out: a state saved mid-step resumes at the next microbatch.
    """

    STATE_SEQPACK = "seqpack"
    STATE_HANDED = "microbatches_handed"
    STATE_WORLD_SIZE = "world_size"

    def __init__(self, steps: PackingIterator, microbatches_per_step: int) -> None:
        """
        Args:
            steps: A fresh ``wrap_data_iterator(...)`` (shifted labels: torchtitan's).
            microbatches_per_step: ``trainer.gradient_accumulation_steps *
                trainer.num_pipeline_parallel_microbatches``.
        """
        if not isinstance(steps, PackingIterator):
            raise SeqpackTypeError(f"steps must be a PackingIterator (wrap_data_iterator), got {type(steps).__name__}")
        self.steps = steps
        self.microbatches_per_step = check_positive_int("microbatches_per_step", microbatches_per_step)
        self._before: dict[str, Any] | None = None  # seqpack state before the step in progress
        self._handed = 0  # microbatches of that step handed out
        self._skip = 0  # microbatches to skip after a mid-step resume

    @property
    def _rank_key(self) -> str:
        return f"dp_rank_{self.steps.topology.dp_rank}"

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            before = self.steps.state_dict()
            try:
                step = next(self.steps)
            except StopIteration:
                return
            count = step.num_microbatches
            if count != self.microbatches_per_step:
                raise ConfigError(
                    f"seqpack step {step.step} has {count} microbatches but torchtitan's optimizer step takes "
                    f"{self.microbatches_per_step} (gradient_accumulation_steps x pipeline microbatches): pin the "
                    f"count with scheduler_options={{'num_microbatches': {self.microbatches_per_step}}}"
                )
            self._before, self._handed = before, self._skip
            self._skip = 0
            for batch in step.microbatches[self._handed :]:
                self._handed += 1
                yield to_torchtitan(batch)

    def state_dict(self) -> dict[str, Any]:
        if self._before is None or self._handed == self.microbatches_per_step:
            state = {self.STATE_SEQPACK: self.steps.state_dict(), self.STATE_HANDED: 0}
        else:
            state = {self.STATE_SEQPACK: self._before, self.STATE_HANDED: self._handed}
        return {self._rank_key: pickle.dumps(state), self.STATE_WORLD_SIZE: self.steps.topology.dp_size}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (an empty one is valid: nothing to resume, as in
        torchtitan). The loader must not have started iterating.

        Raises:
            ResumeError: A state saved with another DP size, or not this loader's: not a
                mapping, bytes that do not unpickle to its keys, or a ``microbatches_handed``
                that is not an integer in ``[0, microbatches_per_step]``.
        """
        if not isinstance(state_dict, Mapping):
            raise ResumeError(f"the dataloader state must be a mapping, got {type(state_dict).__name__}")
        if not state_dict:
            return
        key = self._rank_key
        if key not in state_dict:
            raise ResumeError(
                f"the dataloader state holds no {key!r} (keys {sorted(map(str, state_dict))}): it was saved with "
                f"another DP size ({state_dict.get(self.STATE_WORLD_SIZE)!r}, here {self.steps.topology.dp_size})"
            )
        state = self._rank_state(key, state_dict[key])
        self.steps.load_state_dict(state[self.STATE_SEQPACK])
        self._skip = state[self.STATE_HANDED]

    def _rank_state(self, key: str, blob: Any) -> dict[str, Any]:
        """The state this rank saved under ``key``, checked before anything is restored."""
        what = f"the dataloader state's {key!r}"
        try:
            state = pickle.loads(blob)  # noqa: S301  (the trainer's own checkpoint)
        except Exception as error:  # bytes of anything else fail in many ways, all a corrupt state
            raise ResumeError(
                f"{what} is not a pickled SeqpackDataLoader state: {type(error).__name__}: {error}"
            ) from error
        fields = (self.STATE_SEQPACK, self.STATE_HANDED)
        if not isinstance(state, dict) or not all(field in state for field in fields):
            found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise ResumeError(f"{what} must hold {list(fields)}, got {found}")
        handed, most = state[self.STATE_HANDED], self.microbatches_per_step
        if not isinstance(handed, int) or isinstance(handed, bool) or not 0 <= handed <= most:
            raise ResumeError(
                f"{what}: {self.STATE_HANDED}={handed!r} must be an integer in [0, {most}] (the microbatches of "
                "the step in progress already handed out)"
            )
        return state


def install(trainer: Any, steps: PackingIterator) -> SeqpackDataLoader:
    """Make ``trainer`` (torchtitan 0.3's ``Trainer``, after its ``__init__``) train on
    ``steps``: its dataloader, also the one its checkpointer saves.

    Returns:
        The :class:`SeqpackDataLoader` installed.

    Raises:
        SeqpackTypeError: ``trainer`` without ``gradient_accumulation_steps`` and
            ``num_pipeline_parallel_microbatches``, or either not an integer.
        ConfigError: Either below 1.
    """
    counts = ("gradient_accumulation_steps", "num_pipeline_parallel_microbatches")
    if not all(hasattr(trainer, name) for name in counts):
        raise SeqpackTypeError(
            f"trainer must be torchtitan's Trainer (with {' and '.join(counts)}), got {type(trainer).__name__}"
        )
    per_step = math.prod(check_positive_int(f"trainer.{name}", getattr(trainer, name)) for name in counts)
    loader = SeqpackDataLoader(steps, per_step)
    trainer.dataloader = loader
    states = getattr(getattr(trainer, "checkpointer", None), "states", None)
    if isinstance(states, dict) and "dataloader" in states:
        states["dataloader"] = loader
    logger.info("torchtitan trainer fed by seqpack: %d microbatches per optimizer step", per_step)
    return loader
