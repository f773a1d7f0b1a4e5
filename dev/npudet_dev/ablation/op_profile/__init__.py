"""A training iteration profiled by op and split into the MSDA layers' own work and the rest
(``dev/tools/profile_iteration.py``): :mod:`.scopes` marks the model's parts as profiler scopes,
:mod:`.hook` profiles iterations in them, :mod:`.split` attributes every event's time to a
part, :mod:`.run` runs the profiled iteration benchmark run (:mod:`.child`, its process) and
:mod:`.report` writes its table."""
