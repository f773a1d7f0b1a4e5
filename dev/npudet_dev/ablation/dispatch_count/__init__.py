"""Ops and host syncs of a training iteration on the simulated NPU, by source
(``dev/tools/count_dispatch.py``): the counter (:mod:`.counter`), its hook (:mod:`.hook`),
the child process (:mod:`.child`), the run (:mod:`.run`) and the table (:mod:`.report`)."""
