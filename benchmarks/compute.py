"""Forward+backward throughput of seqpack's compute stages on one THD pack of ~8K tokens.

Rows: the torch reference attention (``ThdAttention(backend="torch")``, full causal and a
causal 128-token window) and the torch Mamba2 mixer, on one rank and under CP=2 (two gloo
processes on this machine, tokens/s of the whole pack, i.e. pack tokens / slowest rank's
time); the Transformer Engine and mamba_ssm kernel paths when CUDA and the packages are present.

Then the K/V bytes CP attention moves (``kv_traffic.kv_exchange_traffic``, beside this script:
pure arithmetic, no timing) for a long-context pack under CP=8, per mask and CP layout, against an
all-gather of K/V: the torch reference exchanges only the keys each rank's queries reach.

    python benchmarks/compute.py [--tokens 8192] [--repeats 3] [--threads 1]
    python benchmarks/compute.py --traffic-only [--traffic-tokens 131072] [--cp 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from kv_traffic import kv_exchange_traffic  # beside this script: python puts its folder first on sys.path

from seqpack.compute.attention import ThdAttention
from seqpack.compute.backends import import_mamba_kernels, import_te_attention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.mock_data import lognormal_lengths
from seqpack.thd import pack_sequences, pad_multiple_for
from seqpack.thd.cp import shard_for_cp

ATTN = dict(num_heads=8, num_kv_heads=2, head_dim=64)
MAMBA = dict(d_model=256, d_state=64, d_conv=4, expand=2, headdim=64, ngroups=1)
WINDOW = (127, 0)  # gpt-oss-like: a query and the 127 keys before it
# K/V traffic: a Llama-3-70B-like attention (8 KV heads of 128 channels) in bf16, and masks of
# the models the issue names: full causal, Mistral's 4096 window, gpt-oss's 128, bidirectional.
TRAFFIC_KV = dict(num_kv_heads=8, head_dim=128, element_size=2)
TRAFFIC_MASKS = [
    ("causal", True, None),
    ("window 4096", True, (4095, 0)),
    ("window 128", True, (127, 0)),
    ("bidirectional", False, None),
]


def make_batch(tokens: int, seed: int = 0):
    """Lognormal lengths (median ~300, mean ~500) filling exactly ``tokens``, each padded to a
    multiple of 4 (what CP=2 needs), so the CP=1 and CP=2 rows run the same pack."""
    if tokens % 4:
        raise SystemExit(f"--tokens must be a multiple of 4, got {tokens}")
    rng = np.random.default_rng(seed)
    lengths, room = [], tokens
    while room:
        n = int(np.clip(rng.lognormal(np.log(512) - 0.5, 1.0), 1, room))
        lengths.append(n)
        room -= -(-n // 4) * 4
    samples = [{"input_ids": torch.ones(n, dtype=torch.int64)} for n in lengths]
    return pack_sequences(samples, pad_multiple=pad_multiple_for(2), pad_to=tokens)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_attention(batch, backend, dtype, device, repeats, group=None, window=None):
    att = ThdAttention(
        ATTN["num_heads"], ATTN["head_dim"], ATTN["num_kv_heads"], backend=backend, cp_group=group, window=window
    )
    g = torch.Generator().manual_seed(0)
    T = batch.num_tokens
    q = torch.randn(T, ATTN["num_heads"], ATTN["head_dim"], generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(T, ATTN["num_kv_heads"], ATTN["head_dim"], generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(T, ATTN["num_kv_heads"], ATTN["head_dim"], generator=g).to(device, dtype).requires_grad_()
    return _time(lambda: att(q, k, v, batch).float().square().sum().backward(), device, repeats, group)


def time_mamba(batch, backend, dtype, device, repeats, group=None):
    torch.manual_seed(0)
    m = Mamba2Mixer(**MAMBA, cp_group=group, backend=backend, device=device, dtype=dtype)
    hidden = torch.randn(batch.num_tokens, MAMBA["d_model"], generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(device, dtype).requires_grad_()
    return _time(lambda: m(hidden, batch).float().square().sum().backward(), device, repeats, group)


def _time(step, device, repeats, group):
    step()  # warm-up
    times = []
    for _ in range(repeats):
        if group is not None:
            dist.barrier(group)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        if group is not None:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank sets the pace
        times.append(float(elapsed))
    return statistics.median(times), min(times)


def _cp_worker(rank, world, store_path, tokens, repeats, threads, results):
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        batch = shard_for_cp(make_batch(tokens), world, rank)
        cpu = torch.device("cpu")
        t_attn = time_attention(batch, "torch", torch.float32, cpu, repeats, dist.group.WORLD)
        t_window = time_attention(batch, "torch", torch.float32, cpu, repeats, dist.group.WORLD, window=WINDOW)
        t_mamba = time_mamba(batch, "torch", torch.float32, cpu, repeats, dist.group.WORLD)
        if rank == 0:
            results.put((t_attn, t_window, t_mamba))
    finally:
        dist.destroy_process_group()


def run_cp(tokens, repeats, threads, world=2):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(
                target=_cp_worker, args=(r, world, os.path.join(tmp, "store"), tokens, repeats, threads, results)
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
        out = results.get(timeout=1800)
        for p in procs:
            p.join()
    return out


def long_context_offsets(tokens, cp, seed=0):
    """``(cu_seqlens, cu_seqlens_padded)`` of one pack of exactly ``tokens`` tokens: lognormal
    lengths (mean 16K, 1K..64K) as a long-context SFT mix, each padded to a multiple of ``2*cp``."""
    multiple = 2 * cp
    if tokens % multiple:
        raise SystemExit(f"--traffic-tokens must be a multiple of 2*cp={multiple}, got {tokens}")
    lengths, room = [], tokens
    for n in lognormal_lengths(4 * tokens // 1024 + 8, min_seq_len=1024, max_seq_len=65536, mean_seq_len=16384,
                               seed=seed).tolist():  # fmt: skip
        n = min(n, room)
        lengths.append(n)
        room -= -(-n // multiple) * multiple
        if room <= 0:
            break
    padded = [-(-n // multiple) * multiple for n in lengths]
    padded[-1] += tokens - sum(padded)  # the pack's tail joins the last sequence's padding
    cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    cu_padded = np.concatenate([[0], np.cumsum(padded)]).tolist()
    return cu, cu_padded


def print_traffic(tokens, cp):
    cu, cu_padded = long_context_offsets(tokens, cp)
    lengths = np.diff(cu)
    kv = TRAFFIC_KV
    print(f"K/V exchange under CP={cp}: one pack of {tokens:,} tokens, {len(lengths)} sequences "
          f"(lognormal mean 16K, longest {lengths.max():,}), {kv['num_kv_heads']} KV heads x {kv['head_dim']} "
          f"channels, {8 * kv['element_size']}-bit: {2 * kv['num_kv_heads'] * kv['head_dim'] * kv['element_size']:,} "
          "bytes of K+V per token")  # fmt: skip
    print(f"{'mask':<15}{'layout':<12}{'moved MB':>10}{'all-gather MB':>15}{'saved':>8}{'busiest rank MB':>17}")
    for name, causal, window in TRAFFIC_MASKS:
        for layout in ("dualchunk", "contiguous"):
            t = kv_exchange_traffic(cu, cu_padded, cp, causal=causal, window=window, layout=layout, **kv)
            print(f"{name:<15}{layout:<12}{t.bytes / 1e6:>10,.1f}{t.bytes_all_gather / 1e6:>15,.1f}"
                  f"{t.saving:>8.1%}{t.max_rank_bytes / 1e6:>17,.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (CPU rows)")
    parser.add_argument("--traffic-only", action="store_true", help="only the K/V exchange bytes (no timing)")
    parser.add_argument("--traffic-tokens", type=int, default=131072, help="tokens of the K/V traffic pack")
    parser.add_argument("--cp", type=int, default=8, help="CP size of the K/V traffic table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.traffic_only:
        print_traffic(args.traffic_tokens, args.cp)
        return

    batch = make_batch(args.tokens)
    lengths = batch.seq_lens().tolist()
    T = batch.num_tokens
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {args.threads} thread(s) per process")  # fmt: skip
    print(f"pack: {T} tokens ({batch.num_real_tokens} real), {len(lengths)} sequences, "
          f"longest {max(lengths)}, sum s^2 = {sum(n * n for n in lengths):,}")  # fmt: skip
    print(f"attention: heads={ATTN['num_heads']} kv_heads={ATTN['num_kv_heads']} head_dim={ATTN['head_dim']}")
    nheads = MAMBA["expand"] * MAMBA["d_model"] // MAMBA["headdim"]
    print("mamba2: " + " ".join(f"{k}={v}" for k, v in MAMBA.items()) + f" (nheads={nheads}, scan chunk 64)")
    print(f"median and best of {args.repeats} forward+backward steps after one warm-up; "
          f"load average {os.getloadavg()[0]:.1f} at start (the CPU rows share cores with it)\n")  # fmt: skip
    rows = []
    cpu = torch.device("cpu")
    rows.append(
        ("attention torch ref", "cpu fp32", "1", time_attention(batch, "torch", torch.float32, cpu, args.repeats))
    )
    t_window = time_attention(batch, "torch", torch.float32, cpu, args.repeats, window=WINDOW)
    rows.append((f"attn window {WINDOW[0] + 1}", "cpu fp32", "1", t_window))
    rows.append(("mamba2 torch ref", "cpu fp32", "1", time_mamba(batch, "torch", torch.float32, cpu, args.repeats)))
    t_attn, t_window, t_mamba = run_cp(args.tokens, args.repeats, args.threads)
    rows.append(("attention torch ref", "cpu fp32 gloo", "2", t_attn))
    rows.append((f"attn window {WINDOW[0] + 1}", "cpu fp32 gloo", "2", t_window))
    rows.append(("mamba2 torch ref", "cpu fp32 gloo", "2", t_mamba))

    gpu_rows = [("attention TE", import_te_attention, time_attention, "te"),
                ("mamba2 mamba_ssm", import_mamba_kernels, time_mamba, "mamba_ssm")]  # fmt: skip
    skipped = []
    for name, probe, timer, backend in gpu_rows:
        if not torch.cuda.is_available():
            skipped.append((name, "skipped (no CUDA)"))
        elif not (probe_result := probe()).ok:
            skipped.append((name, f"skipped ({probe_result.error})"))
        else:
            cuda = torch.device("cuda")
            rows.append((name, "cuda bf16", "1", timer(batch.to(cuda), backend, torch.bfloat16, cuda, args.repeats)))

    print(f"{'stage':<22}{'device':<16}{'cp':>3}{'s/step':>9}{'tokens/s':>11}{'best tok/s':>12}")
    for name, device, cp, (median, best) in rows:
        print(f"{name:<22}{device:<16}{cp:>3}{median:>9.3f}{T / median:>11,.0f}{T / best:>12,.0f}")
    for name, why in skipped:
        print(f"{name:<22}{'cuda':<16}{'1':>3}  {why}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print_traffic(args.traffic_tokens, args.cp)


if __name__ == "__main__":
    main()
