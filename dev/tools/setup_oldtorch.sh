#!/usr/bin/env bash
# Create .venv-torch21/ in the repository root: the oldest torch npudet supports (2.1.2, what
# torch_npu 2.1 users have) with what the op library's tests need, and npudet itself installed
# --no-deps. tests/project/test_oldest_torch.py (slow) runs the op library's parity, gradcheck and
# property tests in it.
#   bash dev/tools/setup_oldtorch.sh
#   bash dev/tools/setup_oldtorch.sh --plugin   # also mmcv 2.1.0 (built here), mmengine, mmdet
#   PYTHON=python3.11 bash dev/tools/setup_oldtorch.sh    # choose the interpreter (3.8-3.11 for 2.1)
#   NPUDET_OLD_TORCH=torch==2.2.2 bash dev/tools/setup_oldtorch.sh   # another old torch, same venv
# PyPI has torch 2.1 only as a CUDA build, which pulls the nvidia-* wheels (several GB the first
# time; pip caches them). It imports and runs on CPU without a GPU. --plugin builds mmcv's ops
# against this torch (65 min the first time on the shared 2-core machine at load ~10); the
# wheel is kept under ~/.cache/npudet/wheels/<torch version>/ for the next venv. A second run
# with nothing changed finishes in seconds (a stamp file records what was done).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
plugin=0
for arg in "$@"; do
  case "$arg" in
    --plugin) plugin=1 ;;
    *) echo "[setup_oldtorch] unknown argument '$arg' (expected: --plugin)" >&2; exit 2 ;;
  esac
done
venv="$root/.venv-torch21"
py="$venv/bin/python"
torch_req="${NPUDET_OLD_TORCH:-torch==2.1.2}"
# torch 2.1 was built against numpy 1.x: its tensor <-> numpy bridge fails under numpy 2.
reqs=("$torch_req" "numpy<2" "pytest>=7" pytest-timeout "hypothesis>=6.100" ninja
  "setuptools<70" wheel)
# The OpenMMLab stack at the versions pyproject.toml pins, and what the plugin's tests import.
plugin_reqs=(mmengine==0.10.7 mmdet==3.3.0 pycocotools matplotlib tensorboard)
check="import npudet.ops, npudet.nn, torch"
if [ "$plugin" = 1 ]; then check="$check, mmcv.ops, mmdet, npudet.plugin"; fi

stamp="$venv/.npudet-oldtorch-$(echo "${reqs[*]}" "$plugin" "${plugin_reqs[*]}" |
  cat - pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && "$py" -c "$check" >/dev/null 2>&1; then
  echo "[setup_oldtorch] .venv-torch21 is up to date"
  exit 0
fi

began=$SECONDS
if [ ! -x "$py" ]; then "${PYTHON:-python3}" -m venv "$venv"; fi
pip() { "$py" -m pip "$@"; }
pip install -q --upgrade pip >/dev/null
# Every install keeps this torch and numpy 1.x: pip must never swap them for newer builds.
constraints="$venv/npudet-constraints.txt"
printf '%s\n' "$torch_req" "numpy<2" > "$constraints"
echo "[setup_oldtorch] installing ${reqs[*]}"
pip install -q -c "$constraints" "${reqs[@]}"
torch_version="$("$py" -c 'import torch; print(torch.__version__)')"
echo "torch==$torch_version" > "$constraints"
echo "numpy<2" >> "$constraints"

if [ "$plugin" = 1 ]; then
  # mmcv's compiled ops are tied to the torch they were built against. pip's own wheel cache
  # keys a built sdist by its download link only, so it would hand this venv the wheel built
  # for another torch (tools/setup.sh's): build with --no-cache-dir into a folder per torch.
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/npudet/wheels/torch-$torch_version"
  if ! ls "$wheels"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    echo "[setup_oldtorch] building mmcv 2.1.0 with its ops against torch $torch_version" \
      "(over 10 minutes on 2 cores) into $wheels"
    mkdir -p "$wheels"
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" pip wheel -q --no-deps \
      --no-build-isolation --no-cache-dir -w "$wheels" mmcv==2.1.0
  fi
  # mmcv first, from that folder only: mmdet's requirement on mmcv is then met and pip never
  # builds mmcv's sdist itself (in an isolated env with the newest torch).
  pip install -q --no-deps --no-index --find-links "$wheels" mmcv==2.1.0
  pip install -q -c "$constraints" mmcv==2.1.0 "${plugin_reqs[@]}"
fi

# --no-deps: pyproject's dependencies would pull the newest torch.
pip install -q --no-deps --no-build-isolation -e .
"$py" -c "$check"
rm -f "$venv"/.npudet-oldtorch-*
touch "$stamp"
echo "[setup_oldtorch] done in $((SECONDS - began)) s: $("$py" -c 'import torch, numpy
print("torch", torch.__version__, "numpy", numpy.__version__)')"
if [ "$plugin" = 1 ]; then
  "$py" -c 'import mmcv, mmdet, mmengine
print("[setup_oldtorch] mmcv", mmcv.__version__, "mmdet", mmdet.__version__, "mmengine", mmengine.__version__)'
fi
