#!/usr/bin/env bash
# The GPU session in one script: environment report, seqpack's GPU tests, and benchmarks/gpu_step.py
# for a transformer and a hybrid model, each part tee'd into OUTDIR (text, JSON, junit XML).
#
# On the GPU machine, from the repository root, after Transformer Engine / mamba_ssm are installed
# (docs/gpu.md, ../shared/gpu/README.md):
#   source .whl/device.sh env; bash benchmarks/gpu_run.sh "$OUT/gpu" [doctor] [tests] [transformer] [hybrid]
# No part named: all four, in that order. Rough budget on an H100 once installed: doctor ~10 s;
# tests ~2-5 min (mamba_ssm autotunes its Triton kernels on first use); transformer ~1 min;
# hybrid ~2-4 min (another autotune). Run the parts in separate calls when one call's limit is
# near. Extra arguments for gpu_step.py: GPU_STEP_ARGS="--repeats 3"; for pytest: PYTEST_ARGS.
# Needs python3 with torch, numpy, numba, pyarrow, pytest, hypothesis; no install of seqpack:
# the repository root goes on PYTHONPATH.
set -uo pipefail
out=${1:?usage: gpu_run.sh OUTDIR [doctor] [tests] [transformer] [hybrid]}
shift
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(doctor tests transformer hybrid)
mkdir -p "$out"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
# Transformer Engine built against the system cuDNN must be imported before torch initialises
# its bundled cuDNN, else TE fails to import ("undefined symbol ... libcudnn_graph"); pointing
# LD_LIBRARY_PATH at torch's cuDNN instead makes TE import but leaves no attention backend for
# padded THD (measured on the lent H100, docs/gpu.md "cuDNN"). So every python3 here imports TE first.
if python3 -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
  te_first=$(mktemp -d)
  echo "import transformer_engine.pytorch  # noqa: F401 (see gpu_run.sh)" > "$te_first/sitecustomize.py"
  export PYTHONPATH="$te_first:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1
status=0
for part in "${parts[@]}"; do
  start=$(date +%s)
  case "$part" in
    doctor)
      { command -v nvidia-smi >/dev/null && nvidia-smi; python3 - "$out/doctor.json" <<'PY'
import json, sys
from seqpack.compute.backends import environment_report, format_environment_report
report = environment_report()
print(format_environment_report(report))
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
PY
      } 2>&1 | tee "$out/doctor.txt" ;;
    tests)
      # --continue-on-collection-errors: a test module needing a package this machine lacks
      # (rich, tqdm, matplotlib) must not stop the GPU tests from running.
      python3 -m pytest -m gpu tests -q -rs -p no:cacheprovider --continue-on-collection-errors \
        --junitxml="$out/gpu_tests.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$out/gpu_tests.txt" ;;
    transformer|hybrid)
      python3 benchmarks/gpu_step.py --model "$part" --out "$out/gpu_step_$part.txt" \
        --json "$out/gpu_step_$part.json" ${GPU_STEP_ARGS:-} 2>&1 | tee "$out/gpu_step_$part.log" ;;
    *)
      echo "[gpu_run] unknown part '$part' (doctor, tests, transformer, hybrid)" | tee -a "$out/summary.txt"
      status=2
      continue ;;
  esac
  rc=${PIPESTATUS[0]}
  echo "[gpu_run] $part: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
  [[ $rc -ne 0 ]] && status=1
done
exit $status
