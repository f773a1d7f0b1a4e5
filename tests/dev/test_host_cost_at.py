"""``dev/tools/host_cost_at.py``'s table names the checkouts whose children ran on a loaded machine
(their recorded conditions), and says nothing for a report stored before they were recorded."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "host_cost_at", ROOT / "dev/tools/host_cost_at.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_a_loaded_child_is_named_under_the_table():
    tool = _tool()
    stored = json.loads((ROOT / "results" / "host_cost_before_after.json").read_text())
    assert "Loaded children" not in tool.table(stored)
    report = copy.deepcopy(stored)
    quiet = {"load_1m": [0.3, 0.4], "cpu_s": 9.0, "wall_s": 10.0, "threads": 1}
    for checkout in report["checkouts"].values():
        checkout["runs_conditions"] = [quiet] * report["runs"]
    assert "Loaded children" not in tool.table(report)
    report["checkouts"]["after"]["runs_conditions"][1] = {**quiet, "load_1m": [0.3, 2.4]}
    note = tool.table(report).rsplit("\n", 1)[1]
    assert note.startswith("Loaded children (loaded: the 1-minute load average")
    assert note.endswith("after: load 2.4 > 1 threads + 0.5")
