#!/usr/bin/env bash
# Create .venv-torch21/ in the repository root: the oldest torch npudet supports (2.1.2, what
# torch_npu 2.1 users have) with what the op library's tests need, and npudet itself installed
# --no-deps (the op library imports no OpenMMLab package). tests/test_oldest_torch.py (slow) runs
# the op library's parity, gradcheck and property tests in it.
#   bash tools/setup_oldtorch.sh
#   PYTHON=python3.11 bash tools/setup_oldtorch.sh    # choose the interpreter (3.8-3.11 for 2.1)
#   NPUDET_OLD_TORCH=torch==2.2.2 bash tools/setup_oldtorch.sh   # another old torch, same venv
# PyPI has torch 2.1 only as a CUDA build, which pulls the nvidia-* wheels (several GB the first
# time; pip caches them). It imports and runs on CPU without a GPU. A second run with nothing
# changed finishes in seconds (a stamp file records what was done).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-torch21"
py="$venv/bin/python"
torch_req="${NPUDET_OLD_TORCH:-torch==2.1.2}"
# torch 2.1 was built against numpy 1.x: its tensor <-> numpy bridge fails under numpy 2.
reqs=("$torch_req" "numpy<2" "pytest>=7" pytest-timeout "hypothesis>=6.100" ninja
  "setuptools<70" wheel)

stamp="$venv/.npudet-oldtorch-$(echo "${reqs[*]}" | cat - pyproject.toml setup.py |
  sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && "$py" -c "import npudet.ops, npudet.nn, torch" >/dev/null 2>&1; then
  echo "[setup_oldtorch] .venv-torch21 is up to date"
  exit 0
fi

began=$SECONDS
if [ ! -x "$py" ]; then "${PYTHON:-python3}" -m venv "$venv"; fi
pip() { "$py" -m pip "$@"; }
pip install -q --upgrade pip >/dev/null
echo "[setup_oldtorch] installing ${reqs[*]}"
# The exact pin keeps pip from resolving a bare torch (the newest build) for anything else.
pip install -q "${reqs[@]}"
# --no-deps: mmcv/mmdet/mmengine are not needed by the op library and would pull another torch.
pip install -q --no-deps --no-build-isolation -e .
"$py" -c "import npudet.ops, npudet.nn"
rm -f "$venv"/.npudet-oldtorch-*
touch "$stamp"
echo "[setup_oldtorch] done in $((SECONDS - began)) s: $("$py" -c 'import torch, numpy
print("torch", torch.__version__, "numpy", numpy.__version__)')"
