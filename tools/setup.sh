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
  cat pyproject.toml setup.py dev/pyproject.toml tools/setup.sh | sha256sum | cut -c1-16
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

# .venv-ascend: triton-ascend for the Ascend compile checks, which lower the Triton kernels to
# Linalg with it (no torch, NPU or CANN needed), and ascendnpu-ir, whose bishengir-compile takes
# that Linalg through HIVM (everything but the binary code generator hivmc, which it does not
# ship). The triton-ascend wheel replaces the `triton` package, so it never shares .venv. A
# failure here never stops the main setup: it prints a warning, and tests/ops/msda/backends/test_triton_ascend.py
# then fails naming the missing environment (it does not skip).
ascend_venv="$root/.venv-ascend"
ascend_req="triton-ascend==3.2.0"
ascend_ir_req="ascendnpu-ir==1.2.0"  # a 161 MB wheel (cp311, manylinux_2_28 x86_64)
setup_ascend() {
  local apy="$ascend_venv/bin/python" astamp
  astamp="$ascend_venv/.npudet-ascend-$(echo "$ascend_req $ascend_ir_req numpy pybind11" |
    sha256sum | cut -c1-16)"
  if [ -f "$astamp" ] && "$apy" -c "import triton.backends.ascend.compiler, ascendnpuir" \
    >/dev/null 2>&1; then
    echo "[setup] .venv-ascend is up to date"
    return 0
  fi
  echo "[setup] making .venv-ascend ($ascend_req --no-deps, $ascend_ir_req, numpy, pybind11)"
  local began=$SECONDS
  if [ ! -x "$apy" ]; then "${PYTHON:-python3}" -m venv "$ascend_venv" || return 1; fi
  "$apy" -m pip install -q --no-deps "$ascend_req" || return 1
  "$apy" -m pip install -q numpy pybind11 "$ascend_ir_req" || return 1
  "$apy" -c "from triton.backends.ascend.compiler import ttir_to_linalg" || return 1
  "$apy" -c "import ascendnpuir, os, subprocess
bin = os.path.join(os.path.dirname(ascendnpuir.__file__), 'bin', 'bishengir-compile')
subprocess.run([bin, '--version'], check=True, capture_output=True)" || return 1
  rm -f "$ascend_venv"/.npudet-ascend-*
  touch "$astamp"
  echo "[setup] .venv-ascend made in $((SECONDS - began)) s; it takes $(du -sh "$ascend_venv" | cut -f1)"
}
setup_ascend || echo "[setup] WARNING: .venv-ascend was not made (see above); the Ascend" \
  "lowering tests fail until it is: rerun bash tools/setup.sh"

# The simulated NPU (ops/npu_sim/README.md): with NPUDET_SIMULATED_NPU=1, every process of
# this venv (dataloader workers and torchrun ranks too) finds its torch_npu stand-in first on
# sys.path; without the variable the line does nothing. Written on every run: it names this
# checkout's path.
site_dir="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n' "import os, sys; os.environ.get('NPUDET_SIMULATED_NPU') == '1' and sys.path.insert(0, '$root/ops/npu_sim/python')" \
  >"$site_dir/npudet_simulated_npu.pth"

stamp="$venv/.npudet-setup-$(stamp_key)"
if [ -f "$stamp" ] && "$py" -c "import npudet, npudet_dev, mmcv.ops, mmdet, mmseg.models, torch
from importlib.util import find_spec
assert all(find_spec(m) for m in ('nuscenes', 'pyquaternion', 'sklearn', 'cachetools'))" \
  >/dev/null 2>&1; then
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
extras="dev,triton,coco,deploy,seg"
# mmengine 0.10.7 imports pkg_resources, which setuptools >= 81 no longer ships;
# torch 2.13 asks for setuptools >= 77.0.3.
echo "setuptools>=77.0.3,<81" >> "$constraints"
pip install -q -c "$constraints" -e ".[$extras]" "setuptools>=77.0.3,<81"
# The project's own machinery (dev/README.md), beside npudet: never in npudet's wheel.
pip install -q --no-deps --no-build-isolation -e dev

# nuscenes-devkit 1.2.0 declares numpy<2 (and Shapely~=2.0.3) but the parts npudet uses (NuScenes,
# the detection eval) work with numpy 2: install it with --no-deps plus what those parts import,
# with numpy and torch pinned so pip never touches them. See the [nuscenes] extra in pyproject.toml.
nusc_check="from nuscenes import NuScenes; from nuscenes.eval.detection.evaluate import DetectionEval"
if ! "$py" -c "$nusc_check" >/dev/null 2>&1; then
  echo "[setup] installing nuscenes-devkit 1.2.0 (--no-deps) and the dependencies it imports"
  numpy_version="$("$py" -c 'import numpy; print(numpy.__version__)')"
  echo "numpy==$numpy_version" >> "$constraints"
  pip install -q -c "$constraints" pyquaternion cachetools scikit-learn tqdm matplotlib pillow
  pip install -q --no-deps nuscenes-devkit==1.2.0
  "$py" -c "$nusc_check"
fi

rm -f "$venv"/.npudet-setup-*
touch "$stamp"
echo "[setup] done: $("$py" -c 'import torch, mmcv, mmdet, mmengine; print("torch", torch.__version__, "mmcv", mmcv.__version__, "mmdet", mmdet.__version__, "mmengine", mmengine.__version__)')"
