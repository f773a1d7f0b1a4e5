"""The exported detector's per-image latency, route by route (:mod:`.bench`,
``dev/tools/bench_deploy.py``), its markdown report (:mod:`.bench_report`) and ONNX Runtime's
time per op type (:mod:`.ort_profile`), built on ``npudet.deploy``."""
