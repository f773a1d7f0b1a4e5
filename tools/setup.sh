#!/usr/bin/env bash
# Create .venv/ in the repository root and install the whole npudet stack into it.
# A second run with nothing changed finishes in seconds (a stamp file records what was done).
#   PYTHON=python3.11 bash tools/setup.sh     # choose the interpreter
#   NPUDET_TORCH=torch==2.13.0                # the torch requirement used when none is installed
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
torch_req="${NPUDET_TORCH:-torch==2.13.0}"

stamp_key() {
  cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16
}

if [ ! -x "$py" ]; then
  base="${PYTHON:-python3}"
  # Reuse a torch that the base interpreter already has (an Ascend or CUDA build, say).
  if "$base" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] reusing the torch of $base"
    "$base" -m venv --system-site-packages "$venv"
  else
    "$base" -m venv "$venv"
  fi
fi

stamp="$venv/.npudet-setup-$(stamp_key)"
if [ -f "$stamp" ] && "$py" -c "import npudet, mmcv.ops, mmdet, torch" >/dev/null 2>&1; then
  echo "[setup] .venv is up to date"
  exit 0
fi

pip() { "$py" -m pip "$@"; }
pip install -q --upgrade pip >/dev/null

if ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing $torch_req"
  pip install -q "$torch_req"
fi
torch_version="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
# Every later install keeps this torch: pip must never swap it for another build.
constraints="$venv/npudet-constraints.txt"
echo "torch==$torch_version" > "$constraints"

if ! "$py" -c "import mmcv.ops" >/dev/null 2>&1; then
  echo "[setup] building mmcv 2.1.0 with its ops from source (about 9 minutes the first time; pip caches the wheel)"
  pip install -q "setuptools<70" wheel ninja
  MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" pip install -q --no-build-isolation \
    -c "$constraints" mmcv==2.1.0
fi

echo "[setup] installing npudet and its dependencies"
extras="dev,triton"
# mmengine 0.10.7 imports pkg_resources, which setuptools >= 81 no longer ships;
# torch 2.13 asks for setuptools >= 77.0.3.
echo "setuptools>=77.0.3,<81" >> "$constraints"
pip install -q -c "$constraints" -e ".[$extras]" "setuptools>=77.0.3,<81"

rm -f "$venv"/.npudet-setup-*
touch "$stamp"
echo "[setup] done: $("$py" -c 'import torch, mmcv, mmdet, mmengine; print("torch", torch.__version__, "mmcv", mmcv.__version__, "mmdet", mmdet.__version__, "mmengine", mmengine.__version__)')"
