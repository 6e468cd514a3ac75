"""``seqpack demo``: train a tiny hybrid LM on packed, balanced THD batches across CPU ranks.

The demo starts ``dp * cp`` processes (gloo; by default one per usable core), wraps a dataset
with :func:`~seqpack.loader.wrap_data_iterator`, shards a tiny attention + Mamba2 language
model with FSDP2 (``fully_shard``) over the flattened ``dp x cp`` mesh, and trains it for a
few steps. It then trains the same model on the same data with Megatron's ``dp_balanced``
scheduler and with a padded baseline (fixed microbatches, every sequence padded to the
longest of its microbatch), and prints a summary table with real and busy (CPU-time) tokens/s,
padding, balance and MFU; then the step time the same plans are predicted to take on H100 and
H200 GPUs (``--predict-dp``).

Equivalent torchrun launch (one process per rank; the demo's own launcher does this, and
sets the glibc malloc variables below so that ranks keep their heap between steps)::

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456 \\
        torchrun --standalone --nproc-per-node 2 -m seqpack.cli demo --dp 2
"""

# Modules: settings (DemoSettings: the flags and their rules), data (what each rank reads,
# the padded baseline), train (one rank's training), predict (the GPU step times), launch
# (checks, then spawn or torchrun).
