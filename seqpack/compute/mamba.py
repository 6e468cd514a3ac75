"""Mamba2 mixer on THD packs, with hidden-parallel context parallelism.

One layer: ``in_proj`` to ``z, x, B, C, dt``; a depthwise causal conv1d over ``x, B, C``;
the SSD recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t h_t + D x_t``;
a gated RMSNorm ``norm(y * silu(z))``; ``out_proj``. The state and the convolution restart
at every sequence of the pack (``seq_idx``), so packed sequences never see each other.
Parameter names and shapes follow ``mamba_ssm.modules.mamba2.Mamba2``.

Under CP (hidden-parallel, as NeMo's ``mamba_cp``) each rank holds ``T/cp`` tokens in the
batch's CP layout; an all-to-all trades tokens for heads (``[T/cp, X] -> [T, X/cp]``), the conv
and the scan run over the whole pack in sequence order for this rank's heads (the parameters
sliced in the forward, so gradients reach them whole), and the inverse path brings the full
``d_inner`` of this rank's tokens back for the norm and ``out_proj``.

On CUDA with ``mamba_ssm`` and ``causal_conv1d`` installed the conv and the scan use their
kernels; otherwise the exact torch functions :func:`causal_conv1d` and :func:`ssd_scan`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from seqpack._logging import warn_once
from seqpack.compute import backends
from seqpack.compute._collectives import all_to_all_tokens, batch_cp, check_cp_shard, cp_token_orders
from seqpack.errors import ConfigError, SeqpackError, SeqpackTypeError
from seqpack.options import MambaBackend
from seqpack.thd import PackedBatch
from seqpack.thd.layout import seq_idx_from_cu_seqlens
from seqpack.validation import check_choice, check_fits_memory, check_optional_int, check_positive_int

__all__ = ["Mamba2Mixer", "GatedRMSNorm", "causal_conv1d", "ssd_scan", "seq_idx_from_cu_seqlens"]

logger = logging.getLogger(__name__)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    seq_idx: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Depthwise causal conv1d that restarts at every sequence (``causal_conv1d_fn`` semantics).

    ``out[t, c] = bias[c] + sum_k weight[c, k] * x[t - (W-1) + k, c]``, where inputs of an
    earlier sequence (``seq_idx`` differs) count as 0.

    Args:
        x: ``[T, C]``. weight: ``[C, W]``. bias: ``[C]`` or None. seq_idx: int ``[T]``.
        activation: ``"silu"`` or None.
    """
    width = weight.shape[1]
    out = x * weight[:, width - 1]  # (T, C), the tap on the token itself
    for shift in range(1, width):
        earlier = F.pad(x, (0, 0, shift, 0))[: x.shape[0]]  # (T, C): x[t - shift], 0 before 0
        same = F.pad(seq_idx, (shift, 0), value=-1)[: x.shape[0]] == seq_idx  # (T,)
        out = out + earlier * weight[:, width - 1 - shift] * same[:, None]
    if bias is not None:
        out = out + bias
    return F.silu(out) if activation in ("silu", "swish") else out


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = a[..., j+1] + ... + a[..., i]`` for ``i >= j``, ``-inf`` above (from
    masked cumulative sums, as Mamba2's reference: exact for long sequences)."""
    n = a.shape[-1]
    x = a[..., None].expand(*a.shape, n)  # (..., n, n): x[..., i, j] = a[..., i]
    below = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1)
    out = x.masked_fill(~below, 0).cumsum(dim=-2)
    on_or_below = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(0)
    return out.masked_fill(~on_or_below, -math.inf)


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    seq_idx: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The SSD recurrence over a pack, exact, state reset wherever ``seq_idx`` changes.

    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T`` (``h = 0`` at a sequence's first token),
    ``y_t = h_t C_t``. Computed chunk-wise (quadratic inside a chunk, one masked decay matrix
    across chunks); every exponent is <= 0, so nothing overflows.

    Args:
        x: ``[T, H, P]``. dt: ``[T, H]`` (after bias and softplus). A: ``[H]`` (negative).
        B, C: ``[T, G, N]``; head ``h`` uses group ``h // (H // G)``.
        seq_idx: int ``[T]``, non-decreasing.

    Returns:
        ``[T, H, P]`` (without the ``D`` skip).
    """
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    Q = chunk_size
    pad = (-T) % Q
    if pad:  # a tail of zeros in a sequence of its own (-1): inert
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (x, dt, B, C))
        seq_idx = F.pad(seq_idx, (0, pad), value=-1)
    nc = (T + pad) // Q
    B = B.repeat_interleave(H // G, dim=1).view(nc, Q, H, N)
    C = C.repeat_interleave(H // G, dim=1).view(nc, Q, H, N)
    x = x.view(nc, Q, H, P)
    dt = dt.view(nc, Q, H).transpose(1, 2)  # (nc, H, Q)
    seq = seq_idx.view(nc, Q)
    a = dt * A[:, None]  # (nc, H, Q) log-decay per token, <= 0
    a_cum = a.cumsum(dim=-1)  # (nc, H, Q) inclusive, within the chunk

    # 1. Inside each chunk: y_l = sum_{s<=l, same seq} C_l.B_s exp(a_{s+1..l}) dt_s x_s
    same = seq[:, :, None] == seq[:, None, :]  # (nc, Q, Q)
    decay = torch.exp(_segsum(a).masked_fill(~same[:, None], -math.inf))  # (nc, H, Q, Q)
    scores = torch.einsum("clhn,cshn->chls", C, B) * decay * dt[:, :, None, :]
    y = torch.einsum("chls,cshp->clhp", scores, x)  # (nc, Q, H, P)

    # 2. Each chunk's own contribution to the state at its last token (same sequence only).
    end_seq = seq[:, -1]  # (nc,)
    to_end = torch.exp(a_cum[..., -1:] - a_cum) * dt * (seq == end_seq[:, None])[:, None, :]  # (nc, H, Q)
    states = torch.einsum("cshn,chs,cshp->chpn", B, to_end, x)  # (nc, H, P, N)

    # 3. State at every chunk end: earlier chunk-end states carried while the sequence lasts.
    carry = _segsum(a_cum[..., -1].transpose(0, 1))  # (H, nc, nc): decay from chunk d's end to c's
    carry = torch.exp(carry.masked_fill(~(end_seq[:, None] == end_seq[None, :]), -math.inf))
    ends = torch.einsum("hcd,dhpn->chpn", carry, states)  # (nc, H, P, N)
    starts = torch.cat([torch.zeros_like(ends[:1]), ends[:-1]])  # state entering each chunk

    # 4. The entering state's share of each output (tokens still in that state's sequence).
    prev_end = torch.cat([end_seq[:1], end_seq[:-1]])  # (nc,); chunk 0 enters with state 0
    from_start = torch.exp(a_cum) * (seq == prev_end[:, None])[:, None, :]  # (nc, H, Q)
    y = y + torch.einsum("clhn,chpn,chl->clhp", C, starts, from_start)
    return y.reshape(nc * Q, H, P)[:T]


class GatedRMSNorm(nn.Module):
    """``rmsnorm(y * silu(z)) * weight``, normalised over groups of ``group_size`` channels
    (``mamba_ssm``'s ``RMSNormGated`` with ``norm_before_gate=False``), statistics in >= fp32.
    """

    def __init__(
        self,
        dim: int,
        group_size: int,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group_size, self.eps = group_size, eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(y.dtype, torch.float32)  # statistics in >= fp32
        g = (y.to(compute) * F.silu(z.to(compute))).unflatten(-1, (-1, self.group_size))  # (T, groups, gs)
        g = F.rms_norm(g, (self.group_size,), eps=self.eps)
        return (g.flatten(-2) * self.weight).to(y.dtype)


def _inner_sizes(d_model: int, expand: int, headdim: int, ngroups: int) -> tuple[int, int]:
    """``(d_inner, nheads)``, or a ConfigError naming the sizes that do not divide."""
    d_inner = expand * d_model
    if d_inner % headdim != 0:
        raise ConfigError(f"d_inner = expand * d_model = {d_inner} is not divisible by headdim={headdim}")
    nheads = d_inner // headdim
    if nheads % ngroups != 0:
        raise ConfigError(
            f"nheads={nheads} (d_inner={d_inner} / headdim={headdim}) is not divisible by ngroups={ngroups}"
        )
    return d_inner, nheads


def _check_head_parallel(nheads: int, ngroups: int, cp_size: int) -> None:
    """Hidden-parallel CP splits heads over ranks, and B/C groups over ranks or repeats them."""
    if nheads % cp_size != 0:
        raise ConfigError(f"nheads={nheads} is not divisible by the CP size {cp_size}: hidden-parallel CP splits heads")
    if ngroups % cp_size != 0 and cp_size % ngroups != 0:
        raise ConfigError(
            f"ngroups={ngroups} and CP size {cp_size}: one must divide the other (ngroups % cp == 0 "
            "splits groups over ranks; cp % ngroups == 0 repeats each group on cp/ngroups ranks)"
        )


class Mamba2Mixer(nn.Module):
    """Mamba2 mixer over a THD pack (one :class:`~seqpack.thd.PackedBatch`).

    Args:
        d_model: Hidden size. ``d_inner = expand * d_model``, ``nheads = d_inner // headdim``.
        d_state: SSM state size ``N``.
        d_conv: Convolution width.
        expand: ``d_inner / d_model``.
        headdim: Channels per SSM head ``P``.
        ngroups: B/C groups ``G`` (heads per group: ``nheads // ngroups``).
        cp_group: Context-parallel group (hidden-parallel); the batch must be this rank's
            shard, in either CP layout. Needs ``nheads % cp == 0`` and ``ngroups % cp == 0``
            or ``cp % ngroups == 0``. A batch that carries its own ``cp_group`` runs on that
            group instead. Parameters must be identical on all CP ranks; their gradients are
            partial per rank and sum over the CP group (as with data parallelism).
        chunk_size: Scan chunk; default 256 for the mamba_ssm kernel, 64 for the torch scan.
        backend: ``"auto"`` (kernels for CUDA fp32/fp16/bf16 inputs when they import),
            ``"mamba_ssm"`` or ``"torch"`` (a :class:`~seqpack.options.MambaBackend` or its string).
        A_init_range, dt_min, dt_max, dt_init_floor, norm_eps: ``Mamba2``'s initialisation.
        device, dtype: Parameter factory arguments.

    Raises:
        ConfigError: Sizes that do not divide, or a bad backend (names the values; a ``ValueError``).
        BackendUnavailableError: ``backend="mamba_ssm"`` and ``mamba_ssm`` / ``causal_conv1d`` do
            not import (an ``ImportError``; the import error is its ``__cause__``).
    """

    head_parallel_channels: torch.Tensor  # a buffer, see _head_parallel_channels

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        d_conv: int = 4,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        cp_group: dist.ProcessGroup | None = None,
        *,
        chunk_size: int | None = None,
        backend: MambaBackend | str = MambaBackend.AUTO,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        norm_eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        d_model, d_state = check_positive_int("d_model", d_model), check_positive_int("d_state", d_state)
        d_conv, expand = check_positive_int("d_conv", d_conv), check_positive_int("expand", expand)
        headdim, ngroups = check_positive_int("headdim", headdim), check_positive_int("ngroups", ngroups)
        self.chunk_size = check_optional_int("chunk_size", chunk_size, minimum=1)
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.headdim, self.ngroups = headdim, ngroups
        self.d_inner, self.nheads = _inner_sizes(d_model, expand, headdim, ngroups)
        self.conv_dim = self.d_inner + 2 * ngroups * d_state
        self.backend = check_choice("backend", backend, MambaBackend)
        # The kernels, resolved at construction for "mamba_ssm", at the first CUDA call for "auto".
        self._kernel_probe: backends.Probe | None = None
        if self.backend == MambaBackend.MAMBA_SSM:
            probe = backends.import_mamba_kernels()
            if not probe.ok:
                raise backends.BackendUnavailableError(backends.mamba_unavailable_message(probe)) from probe.exception
            self._kernel_probe = dataclasses.replace(probe, exception=None)
        self.cp_group = cp_group
        self.cp_size = 1 if cp_group is None else dist.get_world_size(cp_group)
        self.cp_rank = 0 if cp_group is None else dist.get_rank(cp_group)
        _check_head_parallel(self.nheads, ngroups, self.cp_size)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self._init_parameters(A_init_range, dt_min, dt_max, dt_init_floor, norm_eps, factory)
        self.register_buffer(
            "head_parallel_channels", self._head_parallel_channels(device, self.cp_size), persistent=False
        )
        # Batches with their own cp_group, of other sizes (dynamic CP); (size, device) -> channels.
        self._channels: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _init_parameters(
        self,
        A_init_range: tuple[float, float],
        dt_min: float,
        dt_max: float,
        dt_init_floor: float,
        norm_eps: float,
        factory: dict[str, Any],
    ) -> None:
        """``Mamba2``'s parameters and initialisation (``in_proj`` output order ``z, x, B, C, dt``)."""
        d_model, d_inner, nheads, N, G = self.d_model, self.d_inner, self.nheads, self.d_state, self.ngroups
        # Refuse before allocating: in_proj, conv1d and out_proj hold most of the parameters.
        in_proj = 2 * d_inner + 2 * G * N + nheads
        parameters = d_model * in_proj + self.conv_dim * (self.d_conv + 1) + d_inner * d_model
        size = f"d_model={d_model}, d_state={N}, d_conv={self.d_conv}, expand={self.expand}, ngroups={G}"
        check_fits_memory(f"Mamba2Mixer({size})", 4 * parameters)
        device, dtype = factory["device"], factory["dtype"]
        self.in_proj = nn.Linear(d_model, in_proj, bias=False, **factory)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.d_conv, groups=self.conv_dim, padding=self.d_conv - 1, bias=True,
            **factory,
        )  # fmt: skip
        dt = torch.exp(
            torch.rand(nheads, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        ).clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(dtype or torch.get_default_dtype()))
        A = torch.empty(nheads, device=device).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A).to(dtype or torch.get_default_dtype()))
        self.D = nn.Parameter(torch.ones(nheads, **factory))
        for p in (self.dt_bias, self.A_log, self.D):
            setattr(p, "_no_weight_decay", True)  # noqa: B010 (mamba_ssm's optimizer marker)
        self.norm = GatedRMSNorm(d_inner, group_size=d_inner // G, eps=norm_eps, **factory)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False, **factory)

    def _head_parallel_channels(self, device: torch.device | str | None, cp: int) -> torch.Tensor:
        """int64 ``[cp, X_r]``: for each rank, its columns of ``[x, B, C, dt]`` (the in_proj
        output without ``z``): its heads' ``x`` channels, its B and C group(s) (the group its
        heads belong to when ``ngroups < cp``: the repeat), its heads' ``dt``. The first
        ``X_r - nheads/cp`` entries are also its ``conv1d`` channels."""
        N, G = self.d_state, self.ngroups
        heads = self.nheads // cp
        rows = []
        for r in range(cp):
            groups = torch.arange(r * G // cp, (r + 1) * G // cp) if G >= cp else torch.tensor([r // (cp // G)])
            b = self.d_inner + (groups[:, None] * N + torch.arange(N)).flatten()
            rows.append(torch.cat([
                torch.arange(r * heads * self.headdim, (r + 1) * heads * self.headdim),  # x
                b,  # B
                b + G * N,  # C
                self.conv_dim + torch.arange(r * heads, (r + 1) * heads),  # dt
            ]))  # fmt: skip
        return torch.stack(rows).to(device)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, expand={self.expand}, "
            f"headdim={self.headdim}, ngroups={self.ngroups}, nheads={self.nheads}, cp_size={self.cp_size}"
        )

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """Mix this rank's tokens.

        Args:
            hidden: ``[T_local, d_model]``, in the batch's token order.
            batch: The pack (this rank's CP shard under CP; ``cu_seqlens_padded`` global).

        Returns:
            ``[T_local, d_model]``.

        Raises:
            SeqpackError: ``hidden`` not ``[batch.num_tokens, d_model]``, or a batch sharded for
                another CP layout (a ``ValueError``).
            SeqpackTypeError: ``hidden``'s dtype differs from the parameters' (a ``TypeError``).
        """
        self._check_inputs(hidden, batch)
        group, cp, cp_rank = self.cp_of(batch)
        T_local = hidden.shape[0]
        T = T_local * cp
        zxbcdt = self.in_proj(hidden)  # (T_local, 2*d_inner + 2*G*N + nheads)
        z, xbcdt = zxbcdt.split([self.d_inner, self.conv_dim + self.nheads], dim=-1)
        cu_padded = batch.cu_seqlens_padded.to(hidden.device)
        seq_idx = seq_idx_from_cu_seqlens(cu_padded, T)  # (T,), global
        weight, bias = self.conv1d.weight[:, 0, :], self.conv1d.bias  # (conv_dim, d_conv), (conv_dim,)
        assert bias is not None  # built with bias=True
        if cp == 1:
            y = self._mix(xbcdt, seq_idx, weight, bias, self.dt_bias, self.A_log, self.D, self.ngroups)
            return self.out_proj(self.norm(y, z))

        assert group is not None
        channels = self._channels_for(cp, hidden.device)  # (cp, X_r)
        width = channels.shape[1]
        send = xbcdt.index_select(1, channels.flatten()).view(T_local, cp, width).transpose(0, 1)  # (cp, T_local, X_r)
        recv = all_to_all_tokens(send.reshape(T, width), group)  # (T, X_r): rank-major tokens
        order, to_global = cp_token_orders(cu_padded, T, cp, hidden.device, batch.cp_layout)  # the batch's layout
        mine = channels[cp_rank]
        heads = mine[-(self.nheads // cp) :] - self.conv_dim
        conv_channels = mine[: width - heads.numel()]
        y = self._mix(
            recv.index_select(0, to_global),  # (T, X_r), sequence order
            seq_idx,
            weight.index_select(0, conv_channels),
            bias.index_select(0, conv_channels),
            self.dt_bias.index_select(0, heads),
            self.A_log.index_select(0, heads),
            self.D.index_select(0, heads),
            max(self.ngroups // cp, 1),
        )  # (T, d_inner / cp)
        back = all_to_all_tokens(y.index_select(0, order), group)  # (T, d_inner/cp): block i = rank i's heads
        y = back.view(cp, T_local, -1).transpose(0, 1).reshape(T_local, self.d_inner)  # (T_local, d_inner)
        return self.out_proj(self.norm(y, z))

    def cp_of(self, batch: PackedBatch) -> tuple[dist.ProcessGroup | None, int, int]:
        """``(group, size, rank)`` this batch runs on: its own ``cp_group`` when it carries one
        (the wrapper's batches under CP), else the module's."""
        return batch_cp(batch, self.cp_group, self.cp_size, self.cp_rank)

    def _channels_for(self, cp: int, device: torch.device) -> torch.Tensor:
        """:meth:`_head_parallel_channels` for ``cp`` ranks on ``device`` (the buffer for the
        module's own size; cached for the sizes of dynamic-CP batches)."""
        if cp == self.cp_size:
            return self.head_parallel_channels
        key = (cp, device)
        if key not in self._channels:
            _check_head_parallel(self.nheads, self.ngroups, cp)
            self._channels[key] = self._head_parallel_channels(device, cp)
        return self._channels[key]

    def _mix(
        self,
        xbcdt: torch.Tensor,
        seq_idx: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor,
        dt_bias: torch.Tensor,
        A_log: torch.Tensor,
        D: torch.Tensor,
        ngroups: int,
    ) -> torch.Tensor:
        """Conv + scan over the whole pack for some heads: ``[T, x|B|C|dt] -> [T, heads * P]``."""
        T, heads, P, N = xbcdt.shape[0], D.shape[0], self.headdim, self.d_state
        xBC, dt = xbcdt.split([heads * P + 2 * ngroups * N, heads], dim=-1)
        compute = torch.promote_types(xbcdt.dtype, torch.float32)
        A = -torch.exp(A_log.to(compute))  # (heads,)
        kernels = self._kernels_for(xbcdt.device, xbcdt.dtype)
        if kernels is not None:
            conv_fn, scan_fn = kernels
            # causal_conv1d takes seq_idx only in channel-last layout: [1, C, T] with stride 1 on C.
            xBC = conv_fn(
                xBC.contiguous().unsqueeze(0).transpose(1, 2), conv_weight, conv_bias,
                seq_idx=seq_idx.unsqueeze(0), activation="silu",
            ).transpose(1, 2)[0]  # fmt: skip
            x, B, C = xBC.split([heads * P, ngroups * N, ngroups * N], dim=-1)
            y = scan_fn(
                x.reshape(1, T, heads, P), dt.unsqueeze(0), A, B.reshape(1, T, ngroups, N), C.reshape(1, T, ngroups, N),
                self.chunk_size or 256, D=D, dt_bias=dt_bias, dt_softplus=True, seq_idx=seq_idx.unsqueeze(0),
            )[0]  # fmt: skip
            return y.reshape(T, heads * P)
        xBC = causal_conv1d(xBC, conv_weight, conv_bias, seq_idx)  # (T, heads*P + 2*G*N)
        x, B, C = xBC.split([heads * P, ngroups * N, ngroups * N], dim=-1)
        x = x.reshape(T, heads, P)
        dt = F.softplus((dt + dt_bias).to(compute))  # (T, heads)
        y = ssd_scan(
            x.to(compute), dt, A, B.reshape(T, ngroups, N).to(compute), C.reshape(T, ngroups, N).to(compute),
            seq_idx, self.chunk_size or 64,
        )  # fmt: skip
        y = y + x.to(compute) * D.to(compute)[:, None]  # D skip
        return y.to(xbcdt.dtype).reshape(T, heads * P)

    def _kernels_for(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any] | None:
        """``(causal_conv1d_fn, mamba_chunk_scan_combined)`` for such inputs, or None: the reference."""
        if self.backend == MambaBackend.TORCH:
            return None
        if self.backend == MambaBackend.AUTO:
            if self._kernel_probe is None and backends.mamba_kernel_applies(device, dtype):
                # Keep the error text, not the exception (its traceback pins frames; modules get deep-copied).
                self._kernel_probe = dataclasses.replace(backends.import_mamba_kernels(), exception=None)
            probe = self._kernel_probe
            if not backends.mamba_kernel_applies(device, dtype) or probe is None or not probe.ok:
                unavailable = None if probe is None else f"`import {probe.what}` failed: {probe.error}"
                warning = backends.reference_warning(
                    "Mamba2Mixer", "mamba_ssm / causal_conv1d", device, dtype, backends.MAMBA_KERNEL_DTYPES, unavailable
                )
                if warning is not None:
                    warn_once(logger, warning[0], "%s", warning[1])
                return None
        assert self._kernel_probe is not None and self._kernel_probe.ok  # "mamba_ssm": resolved at construction
        return self._kernel_probe.value

    def _check_inputs(self, hidden: torch.Tensor, batch: PackedBatch) -> None:
        if not isinstance(hidden, torch.Tensor):
            raise SeqpackTypeError(f"hidden must be a tensor, got {type(hidden).__name__}")
        expected = (batch.num_tokens, self.d_model)
        if tuple(hidden.shape) != expected:
            raise SeqpackError(
                f"hidden has shape {tuple(hidden.shape)}, expected {expected} "
                f"(batch.num_tokens={batch.num_tokens}, d_model={self.d_model})"
            )
        if hidden.dtype != self.in_proj.weight.dtype:
            raise SeqpackTypeError(
                f"hidden has dtype {hidden.dtype} but the parameters are {self.in_proj.weight.dtype}"
            )
        check_cp_shard(batch, self.cp_size, self.cp_rank)
