"""Benchmarks: model shapes (``cases``), the side-by-side harness (``harness``, the engine
of ``tools/benchmark_msda.py``) and the host cost per call (``host_cost``)."""
