"""What the test fork server (harness.context) loads once, so that no process it starts
loads it again: FSDP2 and DTensor (about 1 s of CPU a process: the examples' ranks, the
torchtitan tests), and the kernels of the default planner, by planning one small step (most
gloo ranks plan; loading the kernels from numba's cache takes about 1 s a process, and with
a cold cache the fork server compiles them once instead of every rank at once)."""

import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401

from seqpack.cli.warm import plan_family

plan_family("balanced (locality, dp=4)")
