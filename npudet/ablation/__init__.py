"""Ablations: train one config several ways and compare the runs.

:mod:`.ablate` (``tools/analysis_tools/ablate.py``) trains one config with several MSDA
implementations side by side: :mod:`.variants` parses what to compare, :mod:`.worker` trains one
variant in its own process, :mod:`.report` turns the records into tables and plots. The
project's own benchmarks built on them (the real-size iteration benchmark, the op profile,
the BEV temporal ablation) are in ``dev/`` (``npudet_dev.ablation``).
"""
