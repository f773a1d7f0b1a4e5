"""mmcv's MSDA CUDA kernel without mmcv: a torch operator library built from mmcv's sdist.

mmcv 2.1.0's kernel (``ms_deform_attn_cuda.cu`` and the headers it includes) is taken from
mmcv's source distribution, as pip downloads it from PyPI, into an ignored folder (the
"bundle", never committed), and compiled with nvcc together with npudet's ``ops/mmcv_cuda/
mmcv_msda_lib.cpp``, which registers it as ``torch.ops.npudet_mmcv.ms_deform_attn_forward``
/ ``..._backward`` with ``TORCH_LIBRARY``. The library links libtorch and the CUDA runtime
only, so any Python can load it (``torch.ops.load_library``); it must be built against the
torch that loads it, so it is built where it runs (the GPU machine has nvcc).

    python dev/tools/gpu_kit.py bundle    # here: pip downloads the sdist, sources -> .gpu_kit
    python dev/tools/gpu_kit.py build --build-dir B [--arch 90 --compile-only]   # where it runs

``NPUDET_MMCV_CUDA_LIB=<path of the .so>`` makes the ``mmcv`` implementation use it where
mmcv's own compiled ops are absent (``mmcv_impl``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

from ..kernels.native_build import source_root

MMCV_VERSION = "2.1.0"
SDIST_NAME = f"mmcv-{MMCV_VERSION}.tar.gz"
# As pip downloaded it from PyPI here (2026-12-05); a different file is refused.
SDIST_SHA256 = "d387bcab66b467479b6660310e23746cfc79c6e57acf04094680adb499a5cd3f"
_CSRC = f"mmcv-{MMCV_VERSION}/mmcv/ops/csrc/"
# What the kernel needs from the sdist, relative to mmcv/ops/csrc (kept so in the bundle,
# so mmcv's own relative includes resolve), and mmcv's licence, kept beside them.
SOURCES = (
    "common/cuda/common_cuda_helper.hpp",
    "common/cuda/ms_deform_attn_cuda_kernel.cuh",
    "common/pytorch_cuda_helper.hpp",
    "pytorch/cuda/ms_deform_attn_cuda.cu",
)
LICENSE = f"mmcv-{MMCV_VERSION}/LICENSE"
KERNEL = "pytorch/cuda/ms_deform_attn_cuda.cu"
BUNDLE_DIR = "mmcv_msda"  # under the bundle's root (.gpu_kit)
# npudet's own sources, under the native source root ``ops/`` (native_build.source_root).
WRAPPER = "mmcv_cuda/mmcv_msda_lib.cpp"
COMPAT_HEADER = "mmcv_cuda/compat/THC/THCAtomics.cuh"
LIB_NAME = "libnpudet_mmcv_msda.so"
LIB_ENV = "NPUDET_MMCV_CUDA_LIB"
NAMESPACE = "npudet_mmcv"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_sdist(dest: Path) -> Path:
    """mmcv's sdist via ``pip download`` (from pip's cache when it has it) into ``dest``.

    pip prepares the sdist's metadata, which runs mmcv's setup.py: without build
    isolation, in this interpreter (it has torch), that takes seconds and builds nothing.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"mmcv=={MMCV_VERSION}", "--no-deps"]
    cmd += ["--no-binary", ":all:", "--no-build-isolation", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sdist = dest / SDIST_NAME
    if not sdist.is_file():  # pip downloads before preparing metadata: the file may be there
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"pip download of {SDIST_NAME} failed ({proc.returncode}): {tail}")
    return sdist


def extract_sources(sdist: Path, dest: Path, expected_sha256: Optional[str] = SDIST_SHA256) -> Path:
    """Copy ``SOURCES`` and the licence out of ``sdist`` into ``dest`` (replaced); ``dest``.

    Reads only the named members (no path from the archive is trusted) and records the
    sdist's name and hash in ``dest/SOURCE.json``. ``expected_sha256=None`` skips the check.
    """
    digest = sha256(sdist)
    if expected_sha256 is not None and digest != expected_sha256:
        raise ValueError(f"{sdist.name}: sha256 {digest}, expected {expected_sha256}")
    if dest.exists():
        shutil.rmtree(dest)
    wanted = {_CSRC + rel: rel for rel in SOURCES}
    wanted[LICENSE] = "LICENSE"
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            rel = wanted.pop(member.name, None)
            if rel is None or not member.isfile():
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    if wanted:
        raise ValueError(f"{sdist.name}: missing {sorted(wanted)}")
    record = {"sdist": sdist.name, "sha256": digest, "files": [*SOURCES, "LICENSE"]}
    (dest / "SOURCE.json").write_text(json.dumps(record, indent=2))
    return dest


def make_bundle(root: Path, sdist: Optional[Path] = None) -> Path:
    """The bundle's sources under ``root/mmcv_msda``, from ``sdist``, or from the one kept
    in ``root/sdist`` (downloaded there by pip when absent). Returns the sources folder."""
    if sdist is None:
        sdist = root / "sdist" / SDIST_NAME
        if not sdist.is_file():
            sdist = download_sdist(sdist.parent)
    return extract_sources(sdist, root / BUNDLE_DIR)


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (0 if absent)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def cuda_home() -> Optional[Path]:
    """The CUDA toolkit: the first of ``$CUDA_HOME``, ``$CUDA_PATH``, the folder above the
    ``nvcc`` on PATH, ``/usr/local/cuda`` that has both ``bin/nvcc`` and the runtime's
    headers (an ``nvcc`` on PATH may be a wrapper script elsewhere)."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    above_nvcc = str(Path(os.path.realpath(nvcc)).parent.parent) if nvcc else None
    candidates += [above_nvcc, "/usr/local/cuda"]
    for path in filter(None, candidates):
        home = Path(path)
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return None


INCLUDE_ENV = "NPUDET_CUDA_INCLUDE"


def library_include_dirs(torch_root: Optional[Path] = None) -> List[Path]:
    """Where the CUDA libraries' headers that torch's ``ATen/cuda/CUDAContext.h`` includes
    (cuSPARSE, cuBLAS, cuSOLVER) may be, after the toolkit's own: ``$NPUDET_CUDA_INCLUDE``
    (a path list) for a toolkit that lacks them, and the ``nvidia/*/include`` folders of the
    pip packages torch's CUDA wheels depend on, beside torch."""
    site = (torch_root or _torch_paths()["root"]).parent
    extra = [Path(p) for p in os.environ.get(INCLUDE_ENV, "").split(os.pathsep) if p]
    return [*extra, *sorted(site.glob("nvidia/*/include"))]


def _torch_paths(torch_root: Optional[Path] = None) -> Dict[str, Path]:
    root = torch_root or Path(torch.__file__).resolve().parent
    return {"root": root, "include": root / "include", "lib": root / "lib"}


def build_commands(
    sources: Path,
    build_dir: Path,
    arch: str,
    cuda: Path,
    compile_only: bool = False,
    torch_root: Optional[Path] = None,
) -> List[List[str]]:
    """The compiler command lines: mmcv's kernel (nvcc) and the wrapper (host c++), then
    the link into ``build_dir/LIB_NAME`` unless ``compile_only``.

    Flags follow torch's extensions (C++20, its half/bfloat16 defines, the ABI torch was
    built with) for ``arch`` only (e.g. "90": sm_90 machine code, no PTX). Headers and
    libraries are those of the running torch, or of the torch folder ``torch_root`` (an
    unpacked wheel of another version, to check a build against it). The link refuses
    undefined symbols: a missing one shows at build time, not when the library loads.
    """
    paths = _torch_paths(torch_root)
    ops_root = source_root([WRAPPER, COMPAT_HEADER])
    if ops_root is None:
        raise FileNotFoundError(f"npudet's sources {WRAPPER}, {COMPAT_HEADER} not found")
    includes = [
        f"-I{sources / 'common'}",
        f"-I{sources / 'common' / 'cuda'}",
        f"-I{paths['include']}",
        f"-I{paths['include'] / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{cuda / 'include'}",
        *(f"-I{d}" for d in library_include_dirs(paths["root"])),
    ]
    if not (paths["include"] / "THC" / "THCAtomics.cuh").is_file():
        includes.append(f"-I{ops_root / 'mmcv_cuda' / 'compat'}")
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    kernel_obj, wrapper_obj = build_dir / "ms_deform_attn_cuda.o", build_dir / "wrapper.o"
    nvcc = [str(cuda / "bin" / "nvcc"), "-std=c++20", "-O3", "-Xcompiler", "-fPIC", abi]
    nvcc += [*COMMON_NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}", *includes]
    nvcc += ["-c", str(sources / KERNEL), "-o", str(kernel_obj)]
    host = os.environ.get("CXX") or shutil.which("c++") or "g++"
    cxx = [host, "-std=c++20", "-O2", "-fPIC", abi, *includes]
    cxx += ["-c", str(ops_root / WRAPPER), "-o", str(wrapper_obj)]
    if compile_only:
        return [nvcc, cxx]
    link = [host, "-shared", "-Wl,--no-undefined", str(kernel_obj), str(wrapper_obj)]
    link += [f"-L{paths['lib']}", f"-Wl,-rpath,{paths['lib']}"]
    link += ["-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda"]
    # The runtime is found by its soname at load time: torch has loaded it already.
    link += [f"-L{cuda / 'lib64'}", f"-L{cuda / 'targets' / 'x86_64-linux' / 'lib'}", "-lcudart"]
    link += ["-o", str(build_dir / LIB_NAME)]
    return [nvcc, cxx, link]


def device_arch() -> str:
    """The compute capability of CUDA device 0 as nvcc writes it ("90")."""
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}{minor}"


def build(
    sources: Path,
    build_dir: Path,
    arch: Optional[str] = None,
    compile_only: bool = False,
    torch_root: Optional[Path] = None,
) -> Dict[str, object]:
    """Compile (both sources at once), then link; a record of what ran and how long.

    Raises RuntimeError with the compiler's last lines when a step fails.
    """
    cuda = cuda_home()
    if cuda is None or not (cuda / "bin" / "nvcc").exists():
        raise RuntimeError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    arch = arch or device_arch()
    build_dir.mkdir(parents=True, exist_ok=True)
    commands = build_commands(sources, build_dir, arch, cuda, compile_only, torch_root)
    start = time.perf_counter()
    compiles = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in commands[:2]]
    steps = [(c, p.communicate()[1], p.returncode) for c, p in zip(commands[:2], compiles)]
    if all(rc == 0 for _, _, rc in steps) and not compile_only:
        proc = subprocess.run(commands[2], stderr=subprocess.PIPE, text=True)
        steps.append((commands[2], proc.stderr, proc.returncode))
    for cmd, err, rc in steps:
        if rc != 0:
            tail = " | ".join(err.strip().splitlines()[-6:])
            raise RuntimeError(f"{Path(cmd[0]).name} failed ({rc}): {tail}"[:2000])
    outputs = [build_dir / LIB_NAME] if not compile_only else [Path(c[-1]) for c in commands]
    return {
        "arch": f"sm_{arch}",
        "nvcc": str(cuda / "bin" / "nvcc"),
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": {str(p): p.stat().st_size for p in outputs},
        "library": None if compile_only else str(build_dir / LIB_NAME),
    }


def load(path: Union[str, Path]) -> object:
    """Load the library into this process; ``torch.ops.npudet_mmcv``."""
    torch.ops.load_library(str(path))
    return getattr(torch.ops, NAMESPACE)
