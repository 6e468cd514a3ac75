"""What the test fork server (harness.context) loads once, so that no process it starts
loads it again: FSDP2 and DTensor (about 1 s of CPU a process: the examples' ranks, the
torchtitan tests), and, when numba's cache holds every kernel module (`./dev test` compiles
them first: `seqpack doctor --warm`), the scheduler kernels (about 1 s a process that plans:
most gloo ranks). With a cold cache the kernels are left alone: the fork server would
compile them while every pool waited for it."""

import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401
from numba.core import config

from seqpack.schedulers._kernels import compile_note


def _load_kernels() -> None:
    if config.DISABLE_JIT or compile_note.cold_modules():
        return
    from seqpack.cli.warm import FAMILIES

    for family in FAMILIES:
        family.plan()


_load_kernels()
