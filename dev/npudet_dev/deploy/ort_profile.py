"""Where an ONNX Runtime run spends its time: ORT's own profiler, summed per op type.

The speed benchmark (:mod:`.bench`) reports it next to an ORT route's latency, so a route's
total can be split into MSDA (``GridSample`` and its reshapes, or the fused node) and the
rest of the model (``Conv``, ``MatMul``, ...).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any, Dict, List


def op_times(events: List[Dict[str, Any]]) -> Dict[str, float]:
    """Milliseconds per op type of the last ``model_run`` in ORT profile ``events`` (its
    JSON: ``Node`` events carry ``args.op_name`` and ``dur`` in microseconds), largest
    first."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    if not runs:
        raise ValueError("the profile holds no model_run event")
    last = runs[-1]
    begin, end = last["ts"], last["ts"] + last["dur"]
    totals: Dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and begin <= e["ts"] <= end and "op_name" in e.get("args", {}):
            if e["name"].endswith("_kernel_time"):
                totals[e["args"]["op_name"]] += e["dur"] / 1e3
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def profile_session(session_factory, feed: Dict[str, Any], runs: int = 2) -> Dict[str, float]:
    """``op_times`` of the last of ``runs`` runs of the session ``session_factory(options)``
    makes with profiling on (the first runs warm it up); the profile file is removed."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    session = session_factory(options)
    for _ in range(runs):
        session.run(None, feed)
    path = session.end_profiling()
    try:
        with open(path) as f:
            return op_times(json.load(f))
    finally:
        os.remove(path)
