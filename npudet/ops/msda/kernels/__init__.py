"""The kernels the backends run: Triton kernels and their launch planners, the native
(C++/CUDA) sources under ``csrc/`` and their build-on-first-use. Imports nothing of npudet."""
