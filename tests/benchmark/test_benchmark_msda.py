"""``tools/analysis_tools/benchmark_msda.py`` end to end on the smallest real case (ddetr-dec, about
1 ms a call): the JSON it stores names the commit it measured, the machine, and per implementation
the times and the errors against ``grid_sample``, the conditions and CPU-time ratios; ``--runs``
keeps each run and a summary. In process: the implementations interleave round by round, a
case timed under an injected load is marked loaded (table, JSON, plot), and the host-cost
ratio alternates its two calls and reports their spread."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

import pytest
from matplotlib.colors import to_hex

from npudet.benchmark import conditions, harness, host_cost
from npudet.benchmark.provenance import git_commit
from npudet.ops.msda import msda_impls

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "analysis_tools" / "benchmark_msda.py"
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
    assert cpu["fwd_bwd_cpu_ms"] > 0 and cpu["fwd_bwd_cpu_x"] > 0, cpu
    cond = cpu["conditions"]
    assert len(cond["load_1m"]) == 2 and cond["threads"] == 1 and cond["wall_s"] > 0
    assert (
        isinstance(cpu["loaded"], bool)
        and cpu["conditions"] == by_impl["grid_sample"]["conditions"]
    )  # one case's rounds are timed together: one set of conditions


# Two processes (40 s on a loaded 2-core machine); the default run keeps one run of the tool
# in this process (test_a_case_interleaves_impls_and_is_marked_loaded_under_load).
@pytest.mark.slow
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
    assert "loaded" in payload["loaded_rule"]
    assert all(isinstance(row["loaded"], bool) for row in payload["summary"])


def _tool(name: str, folder: Path = TOOL.parent):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_a_case_interleaves_impls_and_is_marked_loaded_under_load(
    tmp_path, monkeypatch, capsys
) -> None:
    """The tool in this process, 3 rounds: grid_sample, cpu, grid_sample, cpu, ...; a load of
    3.0 on 1 thread marks the case loaded in the JSON and the table, CPU-time ratios beside."""
    order = []
    time_round = harness.Runner.time_round

    def recorded(self, device):
        order.append(self.impl)
        return time_round(self, device)

    monkeypatch.setattr(harness.Runner, "time_round", recorded)
    monkeypatch.setattr(conditions, "load_1m", lambda: 3.0)
    out = tmp_path / "one.json"
    argv = [*ARGS[:-1], "3", "--json", str(out)]
    assert _tool("benchmark_msda").main(argv) == 0
    assert order == ["grid_sample", "cpu"] * 3
    payload = json.loads(out.read_text())
    assert payload["threads"] == 1 and payload["machine"]["aten_capability"]
    assert "loaded" in payload["loaded_rule"] and payload["commit"]
    _check_rows(payload["results"])
    for row in payload["results"]:
        assert row["loaded"] and row["loaded_why"].startswith("load 3.0 > 1 threads + 0.5")
        assert row["conditions"]["load_1m"] == [3.0, 3.0]
    table = capsys.readouterr().out
    assert "| fwd+bwd CPU x |" in table and "| loaded (load 3.0 > 1 threads + 0.5" in table
    assert "limit" not in table  # no probe asked for: no row-load limit


@pytest.mark.dev  # npudet_dev.kernels.cpu_probe
def test_limit_times_the_gather_probe_beside_the_impls(tmp_path, capsys) -> None:
    """``--limit``: the project's gather-only probe, timed in the same rounds; its time and
    each implementation's over it in the JSON and the table."""
    out = tmp_path / "limit.json"
    assert _tool("benchmark_msda").main([*ARGS, "--limit", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert all(row["limit_ms"] > 0 and row["fwd_x_limit"] > 0 for row in rows), rows
    table = capsys.readouterr().out
    assert "| limit ms |" in table and "limit = gather-only probe" in table


@pytest.mark.dev  # dev/tools/plot_benchmark.py
def test_plot_greys_a_loaded_row_with_its_cpu_time_ratio() -> None:
    def row(case, loaded):
        return {
            "case": case,
            "impl": "cpu",
            "fwd_bwd_x": 5.4,
            "fwd_bwd_cpu_x": 1.96,
            "loaded": loaded,
        }

    plot = _tool("plot_benchmark", ROOT / "dev" / "tools")
    fig = plot.figure([row("a", True), row("b", False)], "t", ["fwd_bwd_x"])
    ax = fig.axes[0]
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches]
    assert colours[0] == conditions.LOADED_STYLE["facecolor"] != colours[1]
    assert [t.get_text() for t in ax.texts] == ["loaded\nCPU 2.0x"]
    assert to_hex(ax.texts[0].get_color()) == conditions.LOADED_TEXT
    assert "grey: loaded" in fig._suptitle.get_text()
    stored = plot.figure(
        [{k: v for k, v in row("a", False).items() if k != "loaded"}], "t", ["fwd_bwd_x"]
    )
    assert "load not recorded" in stored._suptitle.get_text()


def test_host_ratio_alternates_its_two_calls_and_reports_the_spread(monkeypatch) -> None:
    """auto, aten, aten, auto, auto, aten, ...; per-round ratios and their quartiles."""
    order = []
    monkeypatch.setattr(host_cost, "_op_calls", lambda impl, inputs: {"fwd_bwd_us": lambda: "auto"})
    monkeypatch.setattr(
        host_cost, "_grid_sample_calls", lambda device: {"fwd_bwd_us": lambda: "aten"}
    )
    times = {"auto": iter([100.0, 110.0, 120.0, 130.0]), "aten": iter([50.0, 50.0, 40.0, 50.0])}

    def per_call(fn, calls, sync):
        order.append(fn())
        return next(times[order[-1]])

    monkeypatch.setattr(host_cost, "_per_call_us", per_call)
    monkeypatch.setattr(conditions, "load_1m", lambda: 0.2)
    result = host_cost.measure_ratio(rounds=4, calls=10)
    assert order == ["auto", "aten", "aten", "auto", "auto", "aten", "aten", "auto"]
    # per round: 100/50, 110/50, 120/40, 130/50
    assert result["ratio"]["median"] == pytest.approx(2.4) and result["ratio"]["max"] == 3.0
    assert result["ratio"]["min"] == 2.0 and result["fwd_bwd_us"]["median"] == 115.0
    assert set(result["aten_fwd_bwd_us"]) == {"median", "p25", "p75", "min", "max"}
    assert result["conditions"]["load_1m"] == [0.2, 0.2] and result["rounds"] == 4
    assert "| `auto` / aten grid_sample, per round | 2.40 |" in host_cost.ratio_markdown(result)
