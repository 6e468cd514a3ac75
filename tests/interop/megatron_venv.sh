#!/usr/bin/env bash
# The Python 3.12 venv that runs seqpack.interop.megatron against Megatron-LM's own code
# (tests/interop/test_megatron*.py): Megatron-LM main needs Python >= 3.12, and the released
# megatron-core 0.19 lacks megatron/core/datasets/data_schedule.py. The repository holds no
# Megatron code: bring a checkout of Megatron-LM main (tested at d98e8a64dd) and run
#   tests/interop/megatron_venv.sh MEGATRON_SRC [VENV]      (VENV default: ../megatron-venv)
#   VENV/bin/python -m pytest tests/interop/test_megatron.py tests/interop/test_megatron_plan.py -p no:cacheprovider
# torch comes from PyPI (a CUDA build; the tests run on CPU with gloo). Megatron's import of
# data_schedule needs nothing else on CPU; Megatron and this checkout are put on the venv's
# path by a .pth file, not installed.
set -euo pipefail
src="$(cd "${1:?usage: $0 MEGATRON_SRC [VENV]}" && pwd)"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${2:-$repo/../megatron-venv}"
if [[ ! -f "$src/megatron/core/datasets/data_schedule.py" ]]; then
  echo "$src is not a Megatron-LM checkout with megatron/core/datasets/data_schedule.py (its main branch)" >&2
  exit 2
fi
# A Python 3.12: $PYTHON312, else python3.12 (a pyenv shim may name one it does not select).
for py in ${PYTHON312:-} python3.12 ~/.pyenv/versions/3.12*/bin/python3.12; do
  "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && break
done
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch==2.13.0" numpy numba pyarrow packaging \
  "pytest>=7.4" "hypothesis>=6.90" "pytest-timeout>=2.2"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n%s\n' "$src" "$repo" >"$site/seqpack_megatron.pth"
"$venv/bin/python" -W ignore -c 'import megatron.core.datasets.data_schedule, seqpack.interop.megatron' 2>/dev/null
echo "$venv: Megatron-LM from $src, seqpack from $repo" >&2
