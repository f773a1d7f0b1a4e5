"""The kernels the backends run: Triton kernels and their launch planners, and the
build-on-first-use of the native (C++/CUDA) libraries whose sources are the repository's
top-level ``ops/``. Imports nothing of npudet."""
