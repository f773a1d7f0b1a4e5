"""Ablations: train one config several ways and compare the runs.

:mod:`.ablate` (``tools/ablate.py``) trains one config with several MSDA implementations
side by side: :mod:`.variants` parses what to compare, :mod:`.worker` trains one variant in
its own process, :mod:`.report` turns the records into tables and plots. :mod:`.bev_temporal`
(``tools/bev_temporal_ablation.py``) trains a BEV config with and without temporal
self-attention.
"""
