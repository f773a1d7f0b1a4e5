"""Op-variant ablation: train one config with several MSDA implementations side by side.

``tools/ablate.py`` is the command; :mod:`.variants` parses what to compare,
:mod:`.worker` trains one variant in its own process, :mod:`.report` turns the
records into tables and plots.
"""
