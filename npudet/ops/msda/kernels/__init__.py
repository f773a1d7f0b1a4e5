"""The kernels the backends run: Triton kernels and their launch planners, and the
build-on-first-use of the native (C++/CUDA) libraries whose sources are the repository's
top-level ``ops/``. Imports nothing of npudet."""

from typing import Dict

# The CUDA architectures the Triton kernels are compiled for and checked on without a GPU
# (dev/tools/compile_kernels.py); tools/misc/check_device.py asks for its GPU's own among them.
CUDA_TARGETS: Dict[str, int] = {"cuda:80": 80, "cuda:90": 90}
