"""``tools/benchmark_msda.py`` end to end on the smallest real case (ddetr-dec, about 1 ms a
call): the JSON it stores names the commit it measured, the machine, and per implementation
the times and the errors against ``grid_sample``; ``--runs`` keeps each run and a summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

import pytest

from npudet.ops.msda import msda_impls
from npudet.ops.msda.bench.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "benchmark_msda.py"
ARGS = ["--cases", "ddetr-dec", "--impls", "grid_sample,cpu", "--threads", "1", "--repeat", "1"]

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")


def _benchmark(out: Path, extra: Sequence[str] = ()) -> dict:
    done = subprocess.run(
        [sys.executable, str(TOOL), *ARGS, *extra, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| ddetr-dec | cpu |" in done.stdout, done.stdout[-2000:]
    return json.loads(out.read_text())


def _check_rows(rows: List[dict]) -> None:
    by_impl = {row["impl"]: row for row in rows}
    assert set(by_impl) == {"grid_sample", "cpu"}, rows
    cpu = by_impl["cpu"]
    assert cpu["case"] == "ddetr-dec" and cpu["fwd_ms"] > 0 and cpu["bwd_ms"] > 0, cpu
    # The errors against grid_sample are float32 round-off, as the parity tests bound them.
    assert cpu["max_abs_err"] < 1e-4 and cpu["max_rel_grad_err"] < 1e-4, cpu


def test_runs_store_commit_machine_times_and_errors(tmp_path: Path) -> None:
    """``--runs 2``: each run is the tool's one-run JSON, from its own process."""
    payload = _benchmark(tmp_path / "runs.json", ["--runs", "2"])
    assert payload["commit"] == git_commit(), payload["commit"]
    assert len(payload["runs"]) == 2, payload.keys()
    for run in payload["runs"]:
        assert run["commit"] == payload["commit"], run["commit"]
        assert run["threads"] == 1 and run["repeat"] == 1, run
        assert run["machine"]["cpu_kernel_variant"], run["machine"]
        _check_rows(run["results"])
    assert {row["impl"] for row in payload["summary"]} == {"grid_sample", "cpu"}
