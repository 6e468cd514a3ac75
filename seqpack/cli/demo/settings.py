"""``DemoSettings``: everything a demo or benchmark run depends on, and the flags of ``seqpack demo``.

Every field is a flag (:mod:`seqpack.cli.flags`); ``__post_init__`` holds every rule, so
``seqpack demo`` and ``benchmarks/end_to_end.py`` (which builds the settings in Python)
refuse the same mistakes, and refuse them before any process starts.
"""

from __future__ import annotations

import dataclasses
import os
from enum import StrEnum
from typing import TYPE_CHECKING

from seqpack.cli.flags import flag_name, option
from seqpack.cli.tables import usable_cores
from seqpack.errors import ConfigError
from seqpack.validation import check_choice, check_int, check_number, check_positive_int

if TYPE_CHECKING:
    from seqpack.compute.tiny_lm import TinyConfig

__all__ = ["GPU_CAPACITY", "MAX_DEFAULT_DP", "MODES", "CostSource", "DemoMode", "DemoSettings", "FsdpUnits"]


class DemoMode(StrEnum):
    """How a mode builds its microbatches."""

    BALANCED = "balanced"  # seqpack's scheduler
    DP_BALANCED = "dp_balanced"  # Megatron's next-fit
    PADDED = "padded"  # no packing: fixed microbatches, each sequence padded to its microbatch's longest


class CostSource(StrEnum):
    """Where the scheduler's cost model comes from."""

    ONLINE = "online"  # measured once as below, then calibrated online from every microbatch's time
    MEASURED = "measured"  # fitted to forward+backward timings of the tiny model on this CPU
    FLOPS = "flops"  # the tiny model's training FLOPs
    TOKENS = "tokens"  # plain token counts


class FsdpUnits(StrEnum):
    MODEL = "model"  # one fully_shard unit for the whole model
    BLOCK = "block"  # one per block as well


MODES: tuple[str, ...] = tuple(str(m) for m in DemoMode)

# The tiny model's shape beyond d_model (seqpack.cli.demo.train.tiny_config builds it).
HEAD_SIZE = 16  # attention heads: max(1, d_model // 16); Mamba2 head size
KV_HEADS_DIVISOR = 2
MAX_DEFAULT_DP = 8  # --dp 0 starts one rank per usable core, up to this many
GPU_CAPACITY = 16_384  # tokens per microbatch of the GPU clocks (seqpack.cli.demo.predict)


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """Everything a demo or benchmark run depends on (identical on every rank)."""

    dp: int = option(
        0,
        help=f"data-parallel replicas; 0: one rank per usable core (--cp ranks per replica), at most {MAX_DEFAULT_DP}",
    )
    cp: int = option(1, help="context-parallel ranks per replica")
    steps: int = option(6, help="measured steps per mode")
    warmup_steps: int = option(1, help="unmeasured steps before them")
    modes: tuple[DemoMode, ...] = option(tuple(DemoMode), help="modes to train and compare")
    data: str = option(
        "mock",
        help="'mock' (lognormal SFT lengths), 'stdlib' (the standard library's source, byte-tokenized) "
        "or a Parquet file with an input_ids or text column",
        metavar="mock|stdlib|FILE",
    )
    samples_per_rank: int = option(32, help="samples each DP rank reads per step")
    max_tokens_per_rank: int = option(4096, help="tokens per rank per microbatch")
    min_seq_len: int = option(16, help="mock data: shortest sequence")
    mean_seq_len: int = option(256, help="mock data: mean of the lognormal")
    max_seq_len: int = option(2048, help="longest sequence (mock data: clip; files: the limit)")
    sigma: float = option(1.8, help="mock data: sigma of the lognormal")
    d_model: int = option(64, help="hidden size of the tiny model")
    pattern: str = option("AMAM", help="blocks: A = attention+MLP, M = Mamba2")
    lr: float = option(3e-3, help="AdamW learning rate")
    seed: int = option(0, help="seed of the data, its order and the weights")
    threads: int = option(1, help="torch threads per process")
    cost: CostSource = option(
        CostSource.ONLINE,
        help="scheduler cost model: measured on this CPU then calibrated online from the training loop's "
        "microbatch times, measured once, the tiny model's FLOPs, or tokens",
    )
    fsdp_units: FsdpUnits = option(FsdpUnits.MODEL, help="fully_shard the whole model as one unit or every block too")
    predict_dp: int = option(
        64, help="GPUs to predict the modes' step time on from H100/H200-measured clocks; 0: no prediction"
    )
    port: int = option(0, help="rendezvous port (0 = pick a free one)")
    timeout_s: float = option(300.0, help="seconds a collective may wait before the run fails")
    json_out: str | None = option(None, help="write settings and results as JSON to this file", metavar="FILE")
    quiet: bool = option(False, help="print nothing but errors")

    def __post_init__(self) -> None:
        for name in ("cp", "steps", "samples_per_rank", "max_tokens_per_rank", "d_model", "threads"):
            check_positive_int(flag_name(name), getattr(self, name))
        if check_int("--dp", self.dp, minimum=0) == 0:
            self._set("dp", max(1, min(MAX_DEFAULT_DP, usable_cores() // self.cp)))
        for name in ("warmup_steps", "seed", "predict_dp"):
            check_int(flag_name(name), getattr(self, name), minimum=0)
        for name in ("min_seq_len", "mean_seq_len", "max_seq_len"):
            check_int(flag_name(name), getattr(self, name))
        check_number("--sigma", self.sigma, minimum=0.0)
        check_number("--lr", self.lr, minimum=0.0, allow_zero=False)
        check_number("--timeout-s", self.timeout_s, minimum=0.0, allow_zero=False)
        check_int("--port", self.port, minimum=0, maximum=65535)
        self._set("cost", check_choice("--cost", self.cost, CostSource))
        self._set("fsdp_units", check_choice("--fsdp-units", self.fsdp_units, FsdpUnits))
        self._check_modes()
        if not 1 <= self.min_seq_len <= self.mean_seq_len <= self.max_seq_len:
            raise ConfigError(
                f"need 1 <= --min-seq-len ({self.min_seq_len}) <= --mean-seq-len ({self.mean_seq_len}) "
                f"<= --max-seq-len ({self.max_seq_len})"
            )
        if self.max_seq_len > self.max_tokens_per_rank * self.cp:
            raise ConfigError(
                f"--max-seq-len {self.max_seq_len} exceeds a microbatch (--max-tokens-per-rank "
                f"{self.max_tokens_per_rank} x --cp {self.cp} = {self.max_tokens_per_rank * self.cp}); "
                "raise --max-tokens-per-rank"
            )
        if self.predict_dp and self.max_seq_len > GPU_CAPACITY:
            raise ConfigError(
                f"--max-seq-len {self.max_seq_len} exceeds the GPU clocks' microbatch of {GPU_CAPACITY} tokens; "
                "lower it or pass --predict-dp 0"
            )
        self._check_data()
        self._check_model()

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # frozen: coerce a string to its enum member once

    def _check_modes(self) -> None:
        modes = (self.modes,) if isinstance(self.modes, str) else tuple(self.modes)
        if not modes or any(m not in MODES for m in modes):
            raise ConfigError(f"--modes must be a non-empty subset of {MODES}, got {list(modes)}")
        if len(set(modes)) != len(modes):
            raise ConfigError(f"--modes names a mode twice: {list(modes)}")
        self._set("modes", tuple(DemoMode(m) for m in modes))

    def _check_data(self) -> None:
        if self.data in ("mock", "stdlib"):
            return
        if os.path.isdir(self.data):
            raise ConfigError(f"--data {self.data!r} is a directory; give a Parquet file, 'mock' or 'stdlib'")
        if not os.path.isfile(self.data):
            raise ConfigError(f"--data {self.data!r}: no such file (use 'mock', 'stdlib' or a Parquet path)")

    def _check_model(self) -> None:
        """The tiny model's shape rules, checked here so that no rank starts to fail later."""
        if not self.pattern or set(self.pattern) - {"A", "M"}:
            raise ConfigError(
                f"--pattern must be a non-empty string of A (attention) and M (Mamba2), got {self.pattern!r}"
            )
        heads = max(1, self.d_model // HEAD_SIZE)
        if "A" in self.pattern and (self.d_model % heads or (self.d_model // heads) % 2):
            raise ConfigError(
                f"--d-model {self.d_model}: attention needs it split into {heads} head(s) of even size (RoPE "
                f"rotates pairs of channels); use a multiple of {2 * heads}"
            )
        if "M" in self.pattern:
            inner = 2 * self.d_model  # Mamba2Mixer's expand=2
            if inner % HEAD_SIZE:
                raise ConfigError(
                    f"--d-model {self.d_model}: Mamba2 needs 2 * d_model divisible by its head size {HEAD_SIZE}; "
                    f"use a multiple of {HEAD_SIZE // 2}"
                )
            mamba_heads = inner // HEAD_SIZE
            if mamba_heads % self.cp:
                raise ConfigError(
                    f"--cp {self.cp}: context parallelism splits Mamba2's {mamba_heads} heads (2 * --d-model "
                    f"{self.d_model} / {HEAD_SIZE}) over the CP ranks; use a --cp that divides {mamba_heads}, "
                    "or a --pattern without M"
                )
        try:  # the model's own rules (TinyConfig, ModelSpec), for whatever the checks above miss
            self.tiny_config(vocab_size=256).model_spec()
        except ValueError as err:
            raise ConfigError(f"--d-model {self.d_model} with --pattern {self.pattern!r}: {err}") from None

    def tiny_config(self, vocab_size: int) -> TinyConfig:
        """The tiny hybrid model these settings train."""
        from seqpack.compute.tiny_lm import TinyConfig

        heads = max(1, self.d_model // HEAD_SIZE)
        return TinyConfig(
            vocab_size=vocab_size,
            d_model=self.d_model,
            pattern=self.pattern,
            num_heads=heads,
            num_kv_heads=max(1, heads // KV_HEADS_DIVISOR),
            d_state=16,
            mamba_headdim=HEAD_SIZE,
        )

    @property
    def world_size(self) -> int:
        return self.dp * self.cp

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps
