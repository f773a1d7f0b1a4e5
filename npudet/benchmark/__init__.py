"""Benchmarks a user runs: model shapes (``cases``), the side-by-side harness (``harness``, the
engine of ``tools/analysis_tools/benchmark_msda.py``), the host cost per call (``host_cost``), the
run conditions and their load rule (``conditions``), the commit and machine of a result
(``provenance``), and the device check (``device_check``, ``tools/misc/check_device.py``). It
imports the op library; the op library never imports it."""
